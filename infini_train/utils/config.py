"""Run configuration: typed dataclasses loaded from YAML plus dotted command-line overrides, validated
before any work starts. Key names follow llm.c's train_gpt2 flags.

    cfg = load_config("configs/gpt2_tiny.yaml", ["train.learning_rate=3e-4", "out_dir=runs/x"])

Every problem (unknown key, wrong type, out-of-range value) is reported at once in one ConfigError, each
line naming the dotted key, what was expected, what was found, and the nearest valid key.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import io
import os
import typing
from dataclasses import dataclass, field

import yaml

DEFAULT_CONFIG = "configs/gpt2_tiny.yaml"
DTYPES = ("float32", "float64")
TOKENIZERS = ("byte", "gpt2", "auto")
BACKENDS = ("auto", "mpi", "nccl")


class ConfigError(ValueError):
    pass


@dataclass
class ModelConfig:
    preset: typing.Optional[str] = None
    block_size: typing.Optional[int] = None
    vocab_size: typing.Optional[int] = None
    n_layer: typing.Optional[int] = None
    n_head: typing.Optional[int] = None
    n_embd: typing.Optional[int] = None
    dropout: typing.Optional[float] = None
    bias: typing.Optional[bool] = None

    def to_gpt2_config(self):
        from ..models.gpt2_config import GPT2Config

        overrides = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                     if f.name != "preset" and getattr(self, f.name) is not None}
        if self.preset:
            return GPT2Config.from_preset(self.preset, **overrides)
        return GPT2Config(**overrides)


@dataclass
class DataConfig:
    train: str = "data/stdlib_byte/train_*.bin"
    val: typing.Optional[str] = "data/stdlib_byte/val_*.bin"
    tokenizer: str = "byte"
    source: typing.Optional[str] = "stdlib"  # build the default corpus when the shards are missing
    max_corpus_bytes: int = 4_000_000


@dataclass
class TrainConfig:
    batch_size: int = 8
    sequence_length: int = 64
    total_batch_size: int = 0  # tokens per optimizer step; 0 means batch_size * sequence_length * world_size
    num_iterations: int = 100
    learning_rate: float = 1e-3
    warmup_iters: int = 0
    learning_rate_decay_frac: float = 0.0
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0
    val_loss_every: int = 0
    val_max_steps: int = 20
    sample_every: int = 0
    sample_length: int = 64
    save_every: int = 0
    keep_last: int = 3
    log_every: int = 1
    overfit_single_batch: bool = False


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    out_dir: str = "runs/default"
    resume: str = ""  # "" (fresh), "auto" (newest checkpoint in out_dir) or a checkpoint path
    seed: int = 1337
    device: str = "auto"
    dtype: str = "float32"
    backend: str = "auto"
    plot: bool = True

    def grad_accum_steps(self, world_size=1):
        """total_batch_size = B * T * grad_accum * world_size; raise a clear error when it does not divide."""
        t = self.train
        per_step = t.batch_size * t.sequence_length * world_size
        total = t.total_batch_size or per_step
        if total % per_step:
            raise ConfigError(
                f"train.total_batch_size: expected a multiple of batch_size * sequence_length * world_size = "
                f"{t.batch_size} * {t.sequence_length} * {world_size} = {per_step}, got {total}\n"
                f"HINT: set train.total_batch_size={per_step * max(total // per_step, 1)} or adjust batch_size")
        return total // per_step

    def to_dict(self):
        return dataclasses.asdict(self)

    def to_yaml(self):
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def save_resolved(self, out_dir=None):
        """Write out_dir/config.yaml atomically; returns its path."""
        out_dir = out_dir or self.out_dir
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, "config.yaml")
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(self.to_yaml())
        os.replace(tmp, path)
        return path


SECTIONS = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig}


def _all_keys():
    keys = [f.name for f in dataclasses.fields(RunConfig) if f.name not in SECTIONS]
    for sec, cls in SECTIONS.items():
        keys += [f"{sec}.{f.name}" for f in dataclasses.fields(cls)]
    return keys


def _suggest(path, candidates):
    close = difflib.get_close_matches(path, candidates, n=1, cutoff=0.5)
    if not close:
        leaf = path.rsplit(".", 1)[-1]
        close = [k for k in candidates if k.rsplit(".", 1)[-1] == leaf][:1] or \
            difflib.get_close_matches(leaf, [k.rsplit(".", 1)[-1] for k in candidates], n=1, cutoff=0.6)
        close = [k for k in candidates if k.endswith("." + close[0]) or k == close[0]][:1] if close else []
    return f" (did you mean '{close[0]}'?)" if close else ""


def _coerce(value, annotation, path, errors):
    """Check/convert one value to the field's type; report a type error into ``errors``."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Union and type(None) in args:
        if value is None:
            return None
        annotation = next(a for a in args if a is not type(None))
    if annotation is float and isinstance(value, str):
        try:
            return float(value)  # YAML 1.1 reads 3e-4 as a string
        except ValueError:
            pass
    if annotation is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if annotation is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    ok = isinstance(value, annotation) and not (annotation is int and isinstance(value, bool))
    if not ok:
        errors.append(f"{path}: expected {annotation.__name__}, got {value!r} ({type(value).__name__})")
    return value


def _build(cls, raw, prefix, errors):
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        errors.append(f"{prefix}: expected a mapping of keys, got {raw!r}")
        return cls()
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in raw.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if key not in names:
            errors.append(f"{path}: unknown key{_suggest(path, _all_keys())}")
            continue
        if cls is RunConfig and key in SECTIONS:
            kwargs[key] = _build(SECTIONS[key], value, key, errors)
        else:
            kwargs[key] = _coerce(value, hints[key], path, errors)
    return cls(**kwargs)


def _check_ranges(cfg: RunConfig, errors):
    t, m = cfg.train, cfg.model

    def need(ok, path, expected, value):
        if not ok:
            errors.append(f"{path}: expected {expected}, got {value!r}")

    for name in ("batch_size", "sequence_length", "num_iterations", "log_every", "sample_length"):
        v = getattr(t, name)
        need(isinstance(v, int) and v >= 1, f"train.{name}", "an integer >= 1", v)
    for name in ("warmup_iters", "val_loss_every", "val_max_steps", "sample_every", "save_every", "keep_last",
                 "total_batch_size"):
        v = getattr(t, name)
        need(isinstance(v, int) and v >= 0, f"train.{name}", "an integer >= 0 (0 disables)", v)
    for name in ("learning_rate", "eps"):
        v = getattr(t, name)
        need(isinstance(v, float) and v > 0, f"train.{name}", "a number > 0", v)
    for name in ("weight_decay", "grad_clip"):
        v = getattr(t, name)
        need(isinstance(v, float) and v >= 0, f"train.{name}", "a number >= 0", v)
    for name in ("beta1", "beta2"):
        v = getattr(t, name)
        need(isinstance(v, float) and 0 <= v < 1, f"train.{name}", "a number in [0, 1)", v)
    need(isinstance(t.learning_rate_decay_frac, float) and 0 <= t.learning_rate_decay_frac <= 1,
         "train.learning_rate_decay_frac", "a number in [0, 1]", t.learning_rate_decay_frac)
    need(cfg.dtype in DTYPES, "dtype", f"one of {DTYPES}", cfg.dtype)
    need(cfg.backend in BACKENDS, "backend", f"one of {BACKENDS}", cfg.backend)
    need(cfg.data.tokenizer in TOKENIZERS, "data.tokenizer", f"one of {TOKENIZERS}", cfg.data.tokenizer)
    need(cfg.data.source in (None, "stdlib"), "data.source", "'stdlib' or null", cfg.data.source)
    need(isinstance(cfg.data.max_corpus_bytes, int) and cfg.data.max_corpus_bytes > 0, "data.max_corpus_bytes",
         "an integer > 0", cfg.data.max_corpus_bytes)
    dev = cfg.device
    kind, _, idx = str(dev).partition(":")
    need(dev == "auto" or (kind in ("cpu", "cuda") and (idx == "" or idx.isdigit())), "device",
         "'auto', 'cpu', 'cpu:N', 'cuda' or 'cuda:N'", dev)
    if m.dropout is not None:
        need(0 <= m.dropout < 1, "model.dropout", "a number in [0, 1)", m.dropout)
    for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
        v = getattr(m, name)
        if v is not None:
            need(v >= 1, f"model.{name}", "an integer >= 1", v)
    from ..models.gpt2_config import GPT2_PRESETS
    if m.preset is not None and m.preset not in GPT2_PRESETS:
        close = difflib.get_close_matches(m.preset, GPT2_PRESETS, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        errors.append(f"model.preset: expected one of {sorted(GPT2_PRESETS)}, got {m.preset!r}{hint}")
        return
    try:
        gpt = m.to_gpt2_config()
    except (ValueError, TypeError) as exc:
        errors.append(f"model: {str(exc).replace(chr(10), ' ')}")
        return
    if isinstance(t.sequence_length, int) and t.sequence_length > gpt.block_size:
        errors.append(f"train.sequence_length: expected <= model block_size ({gpt.block_size}), "
                      f"got {t.sequence_length}")


def parse_override(text):
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected dotted.key=value, e.g. train.learning_rate=3e-4")
    key, _, value = text.partition("=")
    return key.strip(), yaml.safe_load(io.StringIO(value)) if value.strip() else ""


def load_config(path=None, overrides=()):
    raw = {}
    if path:
        if not os.path.exists(path):
            raise ConfigError(f"config file {path} does not exist\nHINT: see configs/ for the shipped runs")
        with open(path) as f:
            raw = yaml.safe_load(f) or {}
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: expected a YAML mapping at the top level, got {type(raw).__name__}")
    errors = []
    for text in overrides:
        key, value = parse_override(text)
        node = raw
        parts = key.split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[parts[-1]] = value
    cfg = _build(RunConfig, raw, "", errors)
    if not errors:
        _check_ranges(cfg, errors)
    if errors:
        where = f" in {path}" if path else ""
        raise ConfigError(f"invalid run configuration{where}:\n  " + "\n  ".join(errors))
    return cfg


def parse_args(argv=None):
    """``train.py [--config FILE] [dotted.key=value ...]`` -> RunConfig."""
    parser = argparse.ArgumentParser(description="Train GPT-2 with infini_train.")
    parser.add_argument("--config", default=DEFAULT_CONFIG, help=f"YAML run config (default {DEFAULT_CONFIG})")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value overrides, e.g. train.learning_rate=3e-4")
    args = parser.parse_args(argv)
    return load_config(args.config, args.overrides)
