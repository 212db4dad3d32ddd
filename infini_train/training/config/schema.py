"""The whole run's config (RunConfig: its sections and top-level keys), the dotted key names, and building a validated
RunConfig from a raw dict: types coerced, unknown keys suggested, every problem reported at once (ConfigError)."""
from __future__ import annotations

import copy
import dataclasses
import difflib
import os
import typing
from dataclasses import dataclass, field

import yaml

from .checks import check_ranges
from .model import ModelConfig, _key, model_config_class
from .sections import (ConfigError, DataConfig, LoraConfig, NumericsConfig, ParallelConfig, ProfileConfig,
                       TrainConfig)
from .yaml_io import parse_value


@dataclass
class RunConfig:
    """A whole run: the three sections plus where it writes, how it resumes and where it runs."""

    model: ModelConfig = field(default_factory=lambda: model_config_class()())
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    numerics: NumericsConfig = field(default_factory=NumericsConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    out_dir: str = _key("runs/default", "config.yaml, metrics.jsonl, loss.png, checkpoints/")
    resume: str = _key("", '"" (fresh), "auto" (newest checkpoint in out_dir, else fresh) or a checkpoint path')
    resume_allow_changes: bool = _key(False, "resume under a config that changes the run (learning rate, batch, seed, "
                                             "data, ...: listed at the start); false: such a resume is refused")
    seed: int = _key(1337, "seeds parameter init, dropout and sampling")
    device: str = _key("auto", "auto (cuda:<local rank> when available, else cpu), cpu, cpu:N, cuda, cuda:N")
    dtype: str = _key("float32", "parameter and activation dtype: float32 | float64")
    backend: str = _key("auto", "process-group backend under mpirun: auto (nccl on GPUs, else mpi), mpi, nccl")
    plot: bool = _key(True, "write out_dir/loss.png at the end")
    tensorboard: bool = _key(False, "write loss, val loss, lr, grad norm, tokens/s and MFU to out_dir/tb/ for "
                                    "TensorBoard (needs tensorboardX: the tensorboard extra)")
    precision: str = _key("fp32", "fp32 | bf16-mixed (forward under bfloat16 autocast, float32 master weights) | "
                                  "fp16-mixed (float16 autocast and a GradScaler)")

    warnings = ()  # (not a setting) what load_config found questionable but valid; the run prints each once

    def grad_accum_steps(self, world_size=1):
        """Same as ``self.train.grad_accum_steps(world_size)``."""
        return self.train.grad_accum_steps(world_size)

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw, source="config"):
        """Build and validate from a nested dict (e.g. a checkpoint's saved config)."""
        raw = copy.deepcopy(raw) if raw is not None else {}
        return _validated(raw, source, [], _rename_sections(raw))

    def to_yaml(self):
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def differences(self):
        """(dotted key, value, default) of every setting whose value is not its default, in config_keys() order
        (top-level keys first): what a run prints at its start."""
        mine, defaults = _flatten(self.to_dict()), _flatten(type(self)().to_dict())
        return [(key, mine[key], defaults.get(key)) for key in config_keys()
                if key in mine and mine[key] != defaults.get(key)]

    def pretty(self):
        """One ``dotted.key  value`` line per setting, aligned, with the resolved model shape."""
        flat = _flatten(self.to_dict())
        width = max(map(len, flat))
        lines = [f"{k.ljust(width)}  {v!r}" if isinstance(v, str) else f"{k.ljust(width)}  {v}"
                 for k, v in flat.items()]
        try:
            gpt = self.model.to_model_config()
            lines.append(f"{'(resolved model)'.ljust(width)}  {gpt}")
        except ValueError:
            pass
        return "\n".join(lines)

    __str__ = pretty

    def save_resolved(self, out_dir=None, resumed_at=None):
        """Write ``out_dir/config.yaml`` (default self.out_dir) atomically; returns its path. load_config(path) gives
        back an equal RunConfig. A run resumed at step ``resumed_at`` writes ``config.resume-<step>.yaml`` instead,
        keeping the run's first config.yaml (written too when missing: a run resumed from elsewhere)."""
        from ...atomic_file import write_text_atomically

        out_dir = out_dir or self.out_dir
        os.makedirs(out_dir, exist_ok=True)
        def text(what):
            return f"# resolved run configuration{what} (defaults, config file and overrides merged)\n" + self.to_yaml()

        first = os.path.join(out_dir, "config.yaml")
        if resumed_at is None or not os.path.exists(first):
            write_text_atomically(first, text(""))
        if resumed_at is None:
            return first
        return write_text_atomically(os.path.join(out_dir, f"config.resume-{resumed_at:06d}.yaml"),
                                     text(f" of the resume at step {resumed_at}"))



RENAMED_SECTIONS = {"precision_check": "numerics"}  # earlier name -> name now: older configs and checkpoints load
SECTIONS = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig, "parallel": ParallelConfig,
            "lora": LoraConfig, "profile": ProfileConfig, "numerics": NumericsConfig}


def _sections():
    """SECTIONS with the model section of the archs registered now (model_config_class)."""
    return {**SECTIONS, "model": model_config_class()}


def _key_docs():
    """{dotted key: one-line description} for every setting, top-level ones first, then model.*, data.*, train.*."""
    docs = {f.name: f.metadata["doc"] for f in dataclasses.fields(RunConfig) if f.name not in SECTIONS}
    for section, cls in _sections().items():
        docs.update({f"{section}.{f.name}": f.metadata["doc"] for f in dataclasses.fields(cls)})
    return docs


def config_keys():
    """Every valid dotted key: top-level ones first, then model.*, data.*, train.*."""
    return list(_key_docs())


def _flatten(d, prefix=""):
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out



def _rename_sections(raw):
    """Move sections given under an earlier name (RENAMED_SECTIONS) to their name now, in place; returns the old
    names found, for one warning each."""
    found = []
    for old, new in RENAMED_SECTIONS.items():
        if isinstance(raw, dict) and old in raw:
            section = raw.pop(old)
            if isinstance(section, dict) and isinstance(raw.get(new), dict):
                section = {**section, **raw[new]}
            raw[new] = section
            found.append(old)
    return found



def _suggest(path):
    """ " (did you mean 'train.learning_rate'?)" for a misspelt dotted key, or ""."""
    section, _, leaf = path.rpartition(".")
    keys = config_keys() + ([] if section else list(SECTIONS))  # section names only for top-level keys
    local = [k for k in keys if k.rpartition(".")[0] == section]
    same_leaf = [k for k in keys if k.rpartition(".")[2] == leaf and k != path]
    if same_leaf:  # the right key in the wrong section
        best = same_leaf
    else:
        close = difflib.get_close_matches(leaf, [k.rpartition(".")[2] for k in local], n=1, cutoff=0.6)
        best = [k for k in local if k.rpartition(".")[2] == close[0]] if close else []
        if not best:
            best = difflib.get_close_matches(path, keys, n=1, cutoff=0.6)
        if not best:
            close = difflib.get_close_matches(leaf, [k.rpartition(".")[2] for k in keys], n=1, cutoff=0.7)
            best = [k for k in keys if k.rpartition(".")[2] == close[0]] if close else []
    return f" (did you mean '{best[0]}'?)" if best else ""


def _describe(value):
    return f"{value!r} ({type(value).__name__})"


def _coerce(value, annotation, path, errors):
    """The value converted to the field's type, or _BAD after recording a type error."""
    optional = typing.get_origin(annotation) is typing.Union and type(None) in typing.get_args(annotation)
    if optional:
        if value is None:
            return None
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    kind = annotation.__name__ + (" or null" if optional else "")
    if annotation is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and isinstance(parse_value(value), bool):  # a quoted "false", as "16" is an int
            return parse_value(value)
    elif annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):  # YAML 1.1 reads 1e4 as a string
            try:
                number = float(value)
                if number.is_integer():
                    return int(number)
            except ValueError:
                pass
    elif annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads 3e-4 as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif annotation is list:  # (model.mlp_only_layers: a list of integers)
        kind = "a list of integers" + (" or null" if optional else "")
        if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return value
    elif annotation is str:
        if isinstance(value, str):
            return value
        # files and command lines give a str setting its text as written (see yaml_io._keep_text); any other
        # value (a YAML bool, a number in a dict) would mean guessing at the text, so it is refused
        errors.append(f"{path}: expected {kind}, got {_describe(value)}; HINT: {_text_hint(path, value)}")
        return _BAD
    errors.append(f"{path}: expected {kind}, got {_describe(value)}")
    return _BAD


_BAD = object()


def _text_hint(path, value):
    if value is None:
        return "this key cannot be null"
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return f"quote the value to pass it as text, e.g. {path.rpartition('.')[2]}: '{text}'"


def _names_as_text(value):
    """A list of names (a YAML list, or its text ``[c_attn,c_fc]`` as a text setting takes it from the command line)
    as comma-separated text; any other value as it is."""
    text = value.strip() if isinstance(value, str) else ""
    listed = parse_value(text) if text.startswith("[") and text.endswith("]") else value
    if isinstance(listed, list) and all(isinstance(v, str) and v.strip() for v in listed):
        return ",".join(v.strip() for v in listed)
    return value


def _build(cls, raw, prefix, errors, bad):
    """Instantiate ``cls`` from a dict; unknown keys and type errors go to ``errors``, their paths to ``bad``
    (those fields keep their defaults, so range checks can still run on the others)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        errors.append(f"{prefix}: expected a section of keys (like {prefix}.{dataclasses.fields(cls)[0].name}), "
                      f"got {_describe(raw)}")
        bad.add(prefix)
        return cls()
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in raw.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if key not in names:
            errors.append(f"{path}: unknown key{_suggest(path)}")
            continue
        if cls is RunConfig and key in SECTIONS:
            kwargs[key] = _build(_sections()[key], value, key, errors, bad)
            continue
        if key in getattr(cls, "LISTS_AS_TEXT", ()):
            value = _names_as_text(value)
        coerced = _coerce(value, hints[key], path, errors)
        if coerced is _BAD:
            bad.add(path)
        else:
            kwargs[key] = coerced
    return cls(**kwargs)


def _validated(raw, source, errors, renamed=()):
    bad = set()
    cfg = _build(RunConfig, raw, "", errors, bad)
    check_ranges(cfg, errors, bad)
    if errors:
        raise ConfigError(f"invalid run configuration ({source}), {len(errors)} problem"
                          f"{'s' if len(errors) > 1 else ''}:\n  " + "\n  ".join(errors), errors)
    cfg.warnings = [f"model.{key}={given} overrides model.preset={cfg.model.preset}'s {theirs} (the run's model is "
                    "the preset's with the explicit keys; drop the key, or pass it as null, for the preset's)"
                    for key, theirs, given in cfg.model.preset_overrides()]
    cfg.warnings += [f"{old} is now called {RENAMED_SECTIONS[old]} (e.g. {RENAMED_SECTIONS[old]}.level); the old "
                     "name still works" for old in renamed]
    return cfg
