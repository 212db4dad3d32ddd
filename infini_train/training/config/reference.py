"""Every setting of the run config as data: its dotted key, type, default, the values its checks allow and its doc
line, section by section, walked the way the loader builds a RunConfig (schema.py). The documentation's
configuration reference is generated from it at build time (docs/hooks/config_reference.py), so it lists exactly
the keys a run accepts.

    for s in settings(): print(s.key, s.type, s.default, s.allowed, s.doc)
    arch_defaults()        # {arch: {model key: what null means for it}}

``allowed`` comes from the range checks themselves (check_ranges, run on the default config with a Checker that
records what each key expects instead of judging it), the model keys' own checks included."""
from __future__ import annotations

import ast
import dataclasses
import re
import typing
from dataclasses import dataclass

from ...models import registry
from .checker import Checker
from .checks import check_ranges
from .model import model_config_class
from .schema import SECTIONS, RunConfig


@dataclass(frozen=True)
class Setting:
    """One key: ``section`` ("" for the top-level keys), ``name``, ``type`` ("int", "str or null", ...), ``default``
    (as the dataclass holds it), ``allowed`` (what its checks accept, or None), ``doc`` (its one-line description) and
    ``archs`` (for a model key only some archs take: those archs; else ())."""

    section: str
    name: str
    type: str
    default: object
    allowed: str | None
    doc: str
    archs: tuple = ()

    @property
    def key(self):
        return f"{self.section}.{self.name}" if self.section else self.name


def sections():
    """{section name: its dataclass} in the order the reference lists them: the top level (RunConfig's own keys) under
    "", then the sections as RunConfig declares them, the model's with the keys of the archs registered now."""
    classes = {**SECTIONS, "model": model_config_class()}
    return {"": RunConfig, **{f.name: classes[f.name] for f in dataclasses.fields(RunConfig) if f.name in classes}}


def settings():
    """[Setting] of every key, section by section (see sections())."""
    allowed = _allowed()
    out = []
    for section, cls in sections().items():
        hints = typing.get_type_hints(cls)
        arch_keys = getattr(cls, "ARCH_KEYS", {})
        for f in dataclasses.fields(cls):
            if cls is RunConfig and f.name in SECTIONS:
                continue
            key = f"{section}.{f.name}" if section else f.name
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            out.append(Setting(section, f.name, _type_name(hints[f.name]), default, allowed.get(key),
                               f.metadata["doc"], tuple(arch_keys.get(f.name, ()))))
    return out


def arch_defaults():
    """{arch: {model key: the value a null key gets without a preset}} of each registered arch (its model config's
    defaults, as ``train.py --print-config`` resolves them); keys the arch does not take are left out."""
    cls = model_config_class()
    out = {}
    for arch in registry.archs():
        m = cls(arch=arch)
        section = m.section
        built = section.resolved_values(section.model_config(m))
        out[arch] = {f.name: built[f.name] for f in dataclasses.fields(cls)
                     if f.name not in ("arch", "pretrained", "preset") and section.takes(f.name)
                     and built.get(f.name) is not None}
    return out


def arch_presets():
    """{arch: [its preset names]} of each registered arch."""
    return {arch: sorted(registry.section(arch).presets()) for arch in registry.archs()}


class _Recorder(Checker):
    """A Checker that judges nothing: it records, for each key checked, what the check expects."""

    def __init__(self, cfg):
        super().__init__(cfg, [], set())
        self.expected = {}

    def need(self, path, predicate, expected):
        self.expected.setdefault(path, _plain(expected))


def _allowed():
    """{dotted key: what its range check expects} from running the checks on the default config."""
    cfg = RunConfig()
    recorder = _Recorder(cfg)
    check_ranges(cfg, [], set(), checker=recorder)
    return recorder.expected


def _plain(expected):
    """A check's ``expected`` text without the did-you-mean of the value checked, its tuples of choices as names:
    "one of ('fp32', 'bf16-mixed') (did you mean 'fp32'?)" -> "one of fp32, bf16-mixed"."""
    text = re.sub(r" \(did you mean [^)]*\?\)", "", expected)

    def names(match):
        try:
            values = ast.literal_eval(match.group(1))
        except (ValueError, SyntaxError):
            return match.group(0)
        return ", ".join(str(v) for v in (values if isinstance(values, tuple) else (values,)))

    return re.sub(r"(\((?:'[^']*',? ?)+\))", names, text)


def _type_name(annotation):
    """int, float, bool, str, "list of int"; "X or null" for Optional[X]."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Union and type(None) in args:
        inner = next(a for a in args if a is not type(None))
        return f"{_type_name(inner)} or null"
    if annotation is list:
        return "list of int"
    return getattr(annotation, "__name__", str(annotation))


__all__ = ["Setting", "sections", "settings", "arch_defaults", "arch_presets"]
