"""The digits / MNIST example's configuration: typed dataclasses read from YAML plus dotted command-line
overrides, with the GPT-2 runs' conventions (infini_train.training.config.yaml_io reads the text; unknown keys get a
"did you mean", wrong types and out-of-range values are all reported at once in one ConfigError).

    cfg = parse_args(["--config", "configs/mnist_digits.yaml", "train.epochs=5", "parallel=dataparallel"])
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import typing
from dataclasses import dataclass, field
from typing import Optional

import yaml

from infini_train.atomic_file import write_text_atomically
from infini_train.training.config import ConfigError
from infini_train.training.config.model import _key
from infini_train.training.config.schema import _coerce
from infini_train.training.config.yaml_io import apply_overrides, load_yaml

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_CONFIG = os.path.join(REPO_ROOT, "configs", "mnist_digits.yaml")
PARALLEL = ("auto", "none", "dataparallel", "ddp")
OPTIMIZERS = ("adam", "adamw", "sgd")


@dataclass
class DataConfig:
    mnist_dir: Optional[str] = _key(None, "directory holding the MNIST idx files (train-images-idx3-ubyte[.gz], ...); "
                                          "null or a directory without them: scikit-learn's 8x8 digits")
    test_size: int = _key(360, "digits held out for testing (a fixed seeded split; MNIST has its own test set)")
    limit_train: int = _key(0, "use only the first N training images (0: all)")


@dataclass
class ModelConfig:
    channels1: int = _key(16, "channels of the first 3x3 convolution")
    channels2: int = _key(32, "channels of the second 3x3 convolution")
    hidden: int = _key(64, "width of the hidden linear layer")
    batch_norm: bool = _key(True, "BatchNorm2d after each convolution (per replica / rank under data parallelism)")


@dataclass
class TrainConfig:
    epochs: int = _key(12, "passes over the training set")
    batch_size: int = _key(64, "images per optimizer step, over all replicas / ranks (the last partial batch of "
                               "an epoch is dropped)")
    learning_rate: float = _key(3e-3, "peak learning rate (cosine decay to 0 over the run)")
    optimizer: str = _key("adam", "adam | adamw | sgd (momentum 0.9)")
    weight_decay: float = _key(0.0, "weight decay")


@dataclass
class MnistConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    out_dir: str = _key("runs/mnist_digits", "config.yaml and metrics.jsonl (one line per epoch)")
    seed: int = _key(0, "seeds the split, the initialisation and the shuffling")
    parallel: str = _key("auto", "auto (ddp under mpirun with more than one rank, else none) | none | "
                                 "dataparallel (one process over `devices`) | ddp")
    devices: str = _key("cpu:0,cpu:1", "comma-separated devices of parallel=dataparallel")

    def to_dict(self):
        return dataclasses.asdict(self)

    def to_yaml(self):
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def pretty(self):
        flat = _flatten(self.to_dict())
        width = max(map(len, flat))
        return "\n".join(f"{k.ljust(width)}  {v!r}" if isinstance(v, str) else f"{k.ljust(width)}  {v}"
                         for k, v in flat.items())

    def device_list(self):
        return [d.strip() for d in self.devices.split(",") if d.strip()]

    def save_resolved(self):
        """out_dir/config.yaml, written atomically."""
        os.makedirs(self.out_dir, exist_ok=True)
        path = os.path.join(self.out_dir, "config.yaml")
        return write_text_atomically(path, "# resolved configuration of the digits / MNIST example\n" + self.to_yaml())


SECTIONS = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig}


def _flatten(d, prefix=""):
    out = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def config_keys():
    keys = [f.name for f in dataclasses.fields(MnistConfig) if f.name not in SECTIONS]
    return keys + [f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)]


def _suggest(path):
    leaf = path.rpartition(".")[2]
    same_leaf = [k for k in config_keys() if k.rpartition(".")[2] == leaf]
    best = same_leaf or difflib.get_close_matches(path, config_keys(), n=1, cutoff=0.6)
    return f" (did you mean '{best[0]}'?)" if best else ""


def _build(cls, raw, prefix, errors):
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        errors.append(f"{prefix}: expected a section of keys, got {raw!r}")
        return cls()
    hints, kwargs = typing.get_type_hints(cls), {}
    for key, value in raw.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if key not in hints:
            errors.append(f"{path}: unknown key{_suggest(path)}")
        elif cls is MnistConfig and key in SECTIONS:
            kwargs[key] = _build(SECTIONS[key], value, key, errors)
        else:
            bad = len(errors)
            coerced = _coerce(value, hints[key], path, errors)
            if len(errors) == bad:
                kwargs[key] = coerced
    return cls(**kwargs)


def _check_ranges(cfg, errors):
    positive = {"train.epochs": cfg.train.epochs, "train.batch_size": cfg.train.batch_size,
                "model.channels1": cfg.model.channels1, "model.channels2": cfg.model.channels2,
                "model.hidden": cfg.model.hidden, "data.test_size": cfg.data.test_size}
    for key, value in positive.items():
        if value < 1:
            errors.append(f"{key}: expected a positive int, got {value}")
    if cfg.train.learning_rate <= 0:
        errors.append(f"train.learning_rate: expected > 0, got {cfg.train.learning_rate}")
    if cfg.train.weight_decay < 0:
        errors.append(f"train.weight_decay: expected >= 0, got {cfg.train.weight_decay}")
    if cfg.data.limit_train < 0:
        errors.append(f"data.limit_train: expected >= 0 (0: all), got {cfg.data.limit_train}")
    for key, value, choices in (("parallel", cfg.parallel, PARALLEL), ("train.optimizer", cfg.train.optimizer,
                                                                        OPTIMIZERS)):
        if value not in choices:
            close = difflib.get_close_matches(value, choices, n=1)
            hint = f"; HINT: did you mean {close[0]!r}?" if close else ""
            errors.append(f"{key}: expected one of {' | '.join(choices)}, got {value!r}{hint}")
    if cfg.parallel == "dataparallel" and not cfg.device_list():
        errors.append("devices: expected at least one device for parallel=dataparallel, got ''; HINT: cpu:0,cpu:1")


def load_config(path=None, overrides=()):
    """The YAML file at ``path`` (None: defaults) with ``overrides`` applied, validated -> MnistConfig."""
    raw = {}
    if path:
        try:
            with open(path, "rb") as f:
                raw = load_yaml(f, MnistConfig) or {}
        except OSError as exc:
            raise ConfigError(f"config file {path!r}: expected a readable YAML file, got {exc.strerror or exc}\n"
                              f"HINT: the shipped one is {DEFAULT_CONFIG}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path!r} is not valid YAML: {' '.join(str(exc).split())}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"config file {path!r}: expected a YAML mapping at the top level, got {raw!r}")
    errors = []
    apply_overrides(raw, list(overrides), errors, MnistConfig)
    cfg = _build(MnistConfig, raw, "", errors)
    _check_ranges(cfg, errors)
    if errors:
        raise ConfigError(f"invalid configuration ({path or 'defaults'}), {len(errors)} problem"
                          f"{'s' if len(errors) > 1 else ''}:\n  " + "\n  ".join(errors), errors)
    return cfg


def parse_args(argv=None):
    """``train.py [--config FILE] [--print-config] [dotted.key=value ...]`` -> MnistConfig."""
    keys = "\n".join(f"  {k}" for k in config_keys())
    parser = argparse.ArgumentParser(description="Train a small CNN on the 8x8 digits or MNIST.",
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="overrides are dotted.key=value (YAML values), e.g. train.epochs=5 "
                                            "parallel=dataparallel\n\nvalid keys:\n" + keys)
    parser.add_argument("--config", default=None, help=f"YAML config (default {os.path.relpath(DEFAULT_CONFIG)})")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value overrides")
    args = parser.parse_intermixed_args(argv)
    cfg = load_config(args.config or DEFAULT_CONFIG, args.overrides)
    if args.print_config:
        print(cfg.to_yaml(), end="")
        raise SystemExit(0)
    return cfg
