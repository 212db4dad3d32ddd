"""The checks of the run config's ``model`` section and of what the run asks of the model, by the arch's ModelSection
(models/model_section.py) and ModelSpec: the arch is a registered one, each key the arch has not is refused, every
key's range, the section's own problems, the model config its section builds (the config class's errors reported on
their key), and then the run's settings and layout against that model: the section's run problems, the spec's
validate (shape against the layout), the sequence length and the tokenizer's vocabulary. Nothing here names an
arch."""
from __future__ import annotations

import dataclasses
import difflib
import re

from ...data.tokenizer import HF_PREFIX, TOKENIZER_VOCAB
from ...models import registry
from .checker import closest


def check_model(cfg, c, errors):
    m = cfg.model
    archs = registry.archs()
    c.need("model.arch", lambda v: v in archs, f"one of {archs}{closest(m.arch, archs)}")
    if not c.ok("model.arch"):
        return
    if m.pretrained is not None:
        model = _pretrained_model(m, c, errors)
        if model is None:
            return
        _check_model_run(cfg, c, errors, model)
        return
    section = m.section
    for name, value, takers in m.foreign_keys():
        errors.append(f"model.{name}: only for model.arch={' | '.join(takers)}, got {value!r} with model.arch="
                      f"{m.arch}; HINT: set model.arch={takers[0]}, or drop the key")
    for problem in section.section_problems(m, c.ok):
        errors.append(problem)
        c.bad.add(problem.partition(":")[0])
    for f in dataclasses.fields(m):
        check = f.metadata.get("check")
        if check is not None:
            c.need(f"model.{f.name}", *check)
    presets = section.presets()
    if c.ok("model.preset") and m.preset is not None and m.preset not in presets:
        close = difflib.get_close_matches(m.preset, presets, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        errors.append(f"model.preset: expected one of {sorted(presets)} (model.arch={m.arch}) or null, got "
                      f"{m.preset!r}{hint}")
        return
    if not c.ok(*(f"model.{f.name}" for f in dataclasses.fields(m) if f.name not in ("arch", "pretrained"))):
        return
    problems = section.shape_problems(m)
    if problems:
        errors.extend(problems)
        return
    try:
        model = m.to_model_config()
    except (ValueError, TypeError) as exc:
        errors.append(_model_error(section, exc))
        return
    errors.extend(section.model_problems(m, model))
    _check_model_run(cfg, c, errors, model)


def _pretrained_model(m, c, errors):
    """The config of ``model.pretrained`` (None after an error): it exists and is readable, its arch is model.arch,
    and no other model key but dropout is given (its own config decides them)."""
    from ...models.pretrained import pretrained_config

    try:
        arch, _ = pretrained_config(m.pretrained)
        model = m.to_model_config()
    except (OSError, ValueError, KeyError, TypeError) as exc:
        reason = " ".join(str(exc).split("\nHINT: ", 1)[0].split())
        errors.append(f"model.pretrained: expected an HF model directory or an llm.c .bin file, got "
                      f"{m.pretrained!r} ({reason})")
        c.bad.add("model.pretrained")
        return None
    if m.arch != arch:
        errors.append(f"model.arch: expected {arch!r} (the arch of model.pretrained {m.pretrained!r}), got "
                      f"{m.arch!r}; HINT: drop model.arch, it comes from the pretrained model")
        return None
    given = m.shape_keys_given()
    if given:
        errors.append(f"model.{given[0]}: expected no value with model.pretrained (the pretrained model's config "
                      f"decides {', '.join(given)}), got {getattr(m, given[0])!r}; HINT: drop the key, or drop "
                      "model.pretrained to build a model of your own shape")
        return None
    return model


def _check_model_run(cfg, c, errors, model):
    """What the run's layout and settings ask of the resolved model config ``model``."""
    m, t, p = cfg.model, cfg.train, cfg.parallel
    errors.extend(m.section.run_problems(cfg, c.ok, model))
    pipeline_ok, tensor_ok = c.ok("parallel.pipeline", "parallel.virtual_pipeline"), c.ok("parallel.tensor")
    errors.extend(registry.model_spec(m.arch).validate(
        model, p.tensor if tensor_ok else 1, p.pipeline if pipeline_ok else 1, p.virtual_pipeline if pipeline_ok else 1,
        p.sequence if c.ok("parallel.sequence") else None))
    errors.extend(_context_problems(cfg, c, model))
    if c.ok("train.sequence_length") and t.sequence_length > model.context_length:
        errors.append(f"train.sequence_length: expected <= model block_size ({model.context_length}), "
                      f"got {t.sequence_length}")
    need = _tokenizer_vocab(cfg.data.tokenizer, c, errors) if c.ok("data.tokenizer") else None
    if need and model.vocab_size < need:
        hint = "" if cfg.data.tokenizer in TOKENIZER_VOCAB else (
            f"; HINT: set model.vocab_size={-(-need // 64) * 64} (>= {need}; a multiple of 64 runs faster), or use "
            "the tokenizer the model was made for")
        errors.append(f"model.vocab_size: expected >= {need} for data.tokenizer {cfg.data.tokenizer!r}, "
                      f"got {model.vocab_size}{hint}")


def _context_problems(cfg, c, model):
    """The heads an all-to-all context method splits over its group: each rank's query and key/value heads (after
    the tensor split) divisible by the group size (parallel.context for ulysses, parallel.context_a2a for hybrid)."""
    p = cfg.parallel
    if not c.ok("parallel.context", "parallel.context_method", "parallel.context_a2a", "parallel.tensor") \
            or p.context == 1 or p.context_method == "ring":
        return []
    key, size = ("parallel.context", p.context) if p.context_method == "ulysses" else \
        ("parallel.context_a2a", p.context_a2a)
    for name, count in registry.model_spec(cfg.model.arch).head_counts(model).items():
        if count % p.tensor:
            return []  # (the tensor split's own problem)
        local = count // p.tensor
        if local % size:
            per_rank = f"{count} / parallel.tensor {p.tensor} = {local}" if p.tensor > 1 else str(count)
            hint = ("parallel.context_method=ring" if p.context_method == "ulysses" else
                    f"a parallel.context_a2a dividing {local}, or parallel.context_method=ring")
            return [f"{key}: expected a divisor of model {name} ({per_rank}) with parallel.context_method="
                    f"{p.context_method} (the all-to-all gives each of its {size} ranks {name} / {size} heads), got "
                    f"{size}; HINT: use {hint}"]
    return []


def _tokenizer_vocab(name, c, errors):
    """The number of token ids ``name`` produces (a named tokenizer, or an hf:PATH tokenizer read here, so that a
    tokenizer larger than the model's vocabulary stops the run before it starts, not at the first sample holding a
    large id); None when it is not known before the run (auto)."""
    if not name.startswith(HF_PREFIX):
        return TOKENIZER_VOCAB.get(name)
    from ...data.hf_tokenizer import HFTokenizerError
    from ...data.tokenizer import get_tokenizer

    try:
        return get_tokenizer(name).vocab_size
    except HFTokenizerError as exc:
        errors.append(f"data.tokenizer: {str(exc).partition(chr(10))[0]}; HINT: {exc.hint or 'check its files'}")
        c.bad.add("data.tokenizer")
        return None


def _model_error(section, exc):
    """A model config class's ValueError as a config error on the run key it is about ('LlamaConfig.n_layers: ...' ->
    'model.n_layer: ...'), or as the section words it."""
    text = " ".join(str(exc).split())
    match = re.match(r"\w+Config\.(\w+): (.*)", text)
    if match:
        return f"model.{section.run_key(match[1])}: {match[2]}"
    return section.config_error(text) or f"model: {text}"


__all__ = ["check_model"]
