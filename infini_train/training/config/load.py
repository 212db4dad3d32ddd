"""Where a run's config comes from: the YAML file (load_config) and the command line (parse_args); reading YAML
strictly and applying the dotted overrides to the raw dict is in .yaml_io, the validation in .schema."""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import glob
import os

import yaml

from .model import model_config_class
from .schema import RENAMED_SECTIONS, RunConfig, _describe, _key_docs, _rename_sections, _validated
from .sections import ConfigError
from .yaml_io import apply_overrides, load_yaml

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DEFAULT_CONFIG = "configs/gpt2_tiny.yaml"


def _shown_dir(path):
    """``path`` relative to the working directory when it lies under it, else absolute."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def _similar_file(path):
    """ (did you mean 'configs/gpt2_tiny.yaml'?) for a missing config file, looking beside it and in configs/."""
    folder, name = os.path.split(path)
    candidates = {}
    for where in (folder or ".", os.path.join(REPO_ROOT, "configs")):
        if os.path.isdir(where):
            for entry in sorted(os.listdir(where)):
                if entry.endswith((".yaml", ".yml")):
                    shown = os.path.join(folder if where == (folder or ".") else _shown_dir(where), entry)
                    candidates.setdefault(entry, shown)
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean '{candidates[close[0]]}'?)" if close else ""


def _read_config_file(path):
    """The top-level mapping of the YAML file at ``path``; otherwise one ConfigError naming the path, what was
    expected, what was found and a hint."""
    where = f"config file {path!r}"
    shipped = os.path.join(REPO_ROOT, "configs")
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "*.yaml")) + glob.glob(os.path.join(path, "*.yml")))
        raise ConfigError(f"{where}: expected a YAML file, got a directory\nHINT: name a file in it, e.g. --config "
                          f"{files[0] if files else os.path.join(path, 'run.yaml')}")
    try:
        with open(path, "rb") as f:  # bytes: YAML detects the encoding and reports bad bytes as a YAML error
            raw = load_yaml(f, RunConfig)
    except FileNotFoundError:
        raise ConfigError(f"{where}: expected a YAML file, got a path that does not exist{_similar_file(path)}\n"
                          f"HINT: the shipped runs are in {shipped}: "
                          f"{', '.join(sorted(n for n in os.listdir(shipped) if n.endswith('.yaml')))}") from None
    except OSError as exc:
        raise ConfigError(f"{where}: expected a readable YAML file, got {exc.strerror or exc}\nHINT: check that it "
                          f"is a file you may read (ls -l {path})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where} is not valid YAML: {' '.join(str(exc).split())}") from None
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a YAML mapping of keys at the top level, got {_describe(raw)[:200]}\n"
                          f"HINT: write one 'key: value' per line and sections as 'train:' followed by indented "
                          f"keys, as in {os.path.join(shipped, 'gpt2_tiny.yaml')}")
    return raw or {}


def load_config(path=None, overrides=()):
    """Read the YAML file at ``path`` (None or an empty file: all defaults), apply ``overrides``
    (["train.learning_rate=3e-4", "out_dir=runs/x", "model={n_layer: 2, n_head: 2}", ...]; a mapping merges into
    its section key by key) and validate everything -> RunConfig.

    Raises one ConfigError listing every problem."""
    raw = _read_config_file(path) if path else {}
    errors = []
    renamed = _rename_sections(raw)
    overrides = [_renamed_override(text, renamed) for text in overrides]
    apply_overrides(raw, overrides, errors, RunConfig)
    _preset_replaces_file_shape(raw, overrides)
    _arch_of_pretrained(raw)
    cfg = _validated(raw, path or "defaults", errors, renamed)
    if cfg.lora.rank and cfg.lora.init_from is None and cfg.model.pretrained:
        cfg.lora.init_from = cfg.model.pretrained  # the adapters' base is the pretrained model
    return cfg



def _arch_of_pretrained(raw):
    """With ``model.pretrained`` and no ``model.arch``, the arch is the pretrained model's (a path that cannot be
    read is left to the checks, which say why)."""
    model = raw.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("pretrained"), str) or "arch" in model:
        return
    from ...models.pretrained import pretrained_config

    try:
        model["arch"] = pretrained_config(model["pretrained"])[0]
    except (OSError, ValueError, KeyError, TypeError):
        pass



def _renamed_override(text, renamed):
    key, sep, value = str(text).partition("=")
    head, dot, rest = key.strip().partition(".")
    if head in RENAMED_SECTIONS:
        if head not in renamed:
            renamed.append(head)
        return f"{RENAMED_SECTIONS[head]}{dot}{rest}{sep}{value}"
    return text


def _preset_replaces_file_shape(raw, overrides):
    """A model.preset set on the command line takes the architecture from the preset: the config file's keys that a
    preset defines (ModelConfig.PRESET_KEYS: the shape and context, and each arch's own preset keys) give way unless
    the command line sets them too."""
    given = {}
    apply_overrides(given, list(overrides), [], RunConfig)  # what the command line alone sets
    model, cli_model = raw.get("model"), given.get("model")
    if not isinstance(model, dict) or not isinstance(cli_model, dict) or cli_model.get("preset") is None:
        return
    for key in model_config_class().PRESET_KEYS:
        if key not in cli_model:
            model[key] = None


def default_config_path():
    """configs/gpt2_tiny.yaml relative to the working directory, else inside the repository."""
    if os.path.exists(DEFAULT_CONFIG):
        return DEFAULT_CONFIG
    return os.path.join(REPO_ROOT, DEFAULT_CONFIG)


def _key_listing():
    """The valid keys by section, each with its description."""
    docs = _key_docs()
    width = max(map(len, docs))
    lines, current = [], None
    for key, doc in docs.items():
        section = key.split(".")[0] if "." in key else ""
        if section != current:
            lines.append(f"  {section + '.*' if section else 'top level'}:")
            current = section
        lines.append(f"    {key.ljust(width)}  {doc}")
    return "\n".join(lines)


def parse_args(argv=None):
    """``train.py [--config FILE] [--print-config] [dotted.key=value ...]`` -> RunConfig (ConfigError when
    invalid). --config defaults to configs/gpt2_tiny.yaml; --print-config prints the resolved config (the model's
    shape keys filled from its preset or defaults) and exits."""
    parser = argparse.ArgumentParser(
        description="Train GPT-2 with infini_train.", formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="overrides are dotted.key=value, values in YAML syntax (text settings take the text as written),\n"
               "and a mapping merges into its section, e.g.\n"
               "  train.learning_rate=3e-4 out_dir=runs/x model.preset=d12 data.val=null 'model={n_layer: 2}'\n\n"
               "valid keys:\n" + _key_listing())
    parser.add_argument("--config", default=None, help=f"YAML run config (default {DEFAULT_CONFIG})")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value overrides")
    args = parser.parse_intermixed_args(argv)
    cfg = load_config(args.config or default_config_path(), args.overrides)
    if args.print_config:  # a preset's (or the arch's default) shape shown, not left null
        print(dataclasses.replace(cfg, model=cfg.model.resolved()).to_yaml(), end="")
        raise SystemExit(0)
    return cfg
