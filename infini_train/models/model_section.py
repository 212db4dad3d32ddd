"""How an arch reads the ``model`` section of a run config: the keys it takes, its presets, the model config it
builds from the section, the section as ``--print-config`` shows it, and what it checks of the section and of the
run's layout. Each family declares one ModelSection per arch in a small module of its folder (models/gpt2/section.py,
models/llama/section.py), which the registry imports without the model (registry.section(arch)); the run's config
(training/config/) iterates the sections and names no arch.

The section's keys are the SHARED_KEYS every arch reads (GPT-2's names: n_embd, n_layer, block_size, ...; the
others map them onto their own) plus each arch's ``keys``. A key an arch does not take is refused for it, naming the
archs that do.

Checks are given the run config ``cfg`` (its sections read as attributes) and ``ok(*paths)``, which says whether
those settings passed their own checks (a problem is reported once, at the first key it is found at); each returns
its problems, one line each: ``"<dotted key>: expected ..., got ...; HINT: ..."``."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from . import registry


@dataclass(frozen=True)
class RunKey:
    """One key of the model section: its ``name``, ``type`` (int, float, bool, str or list: a list of integers),
    one-line ``doc`` (``train.py --help``), the ``default`` (null: the preset's or the arch's) and its range
    ``check``, (predicate, what is expected), applied to a value that is not null."""

    name: str
    type: type
    doc: str
    check: tuple | None = None
    default: object = None


def _finite(v):
    return math.isfinite(v)


AT_LEAST_ONE = (lambda v: v >= 1, "an integer >= 1")  # RunKey.check's of the usual ranges
POSITIVE = (lambda v: _finite(v) and v > 0, "a number > 0")


def at_least_zero(zero):
    """RunKey.check of a number >= 0, saying what 0 means."""
    return (lambda v: _finite(v) and v >= 0, f"a number >= 0 (0: {zero})")

# the keys every arch reads but arch and preset (model_keys() adds those, they list the registered archs)
SHARED_KEYS = (
    RunKey("pretrained", str, "start from a trained model: an HF directory (config.json + safetensors) or an llm.c "
                              ".bin; the arch, shape and weights come from it (the other model keys but dropout stay "
                              "unset); null: the seeded init"),
    RunKey("block_size", int, "longest sequence; null: the preset's, else the arch's default", AT_LEAST_ONE),
    RunKey("vocab_size", int, "token ids (byte tokenizer: >= 257, gpt2: >= 50257); null: default", AT_LEAST_ONE),
    RunKey("n_layer", int, "transformer blocks; null: default", AT_LEAST_ONE),
    RunKey("n_head", int, "attention heads, dividing n_embd; null: default", AT_LEAST_ONE),
    RunKey("n_embd", int, "embedding width; null: default", AT_LEAST_ONE),
    RunKey("dropout", float, "dropout probability in [0, 1) (llama3: on attention probabilities); null: default",
           (lambda v: 0 <= v < 1, "a number in [0, 1)")),
    RunKey("bias", bool, "biases in Linear (and GPT-2's LayerNorm); null: default"),
)


def model_keys(sections):
    """(the keys of the model section, {key: the archs that take it} for each key not every arch takes) of the
    ``sections`` (the registry's, in its order): arch, pretrained, preset, the shared keys, then each arch's own in
    the order the archs and their keys are listed. The archs map lists the keys grouped by the archs that take them
    (the order a config's foreign keys are reported in)."""
    archs = tuple(s.arch for s in sections)
    shared = {k.name: k for k in SHARED_KEYS}
    arch_key = RunKey("arch", str, " | ".join(archs), default=registry.DEFAULT_ARCH)
    examples = "; ".join(s.preset_doc for s in sections if s.preset_doc)
    preset = RunKey("preset", str, f"a preset of the arch ({examples}) or null")
    keys = {"arch": arch_key, "pretrained": shared.pop("pretrained"), "preset": preset, **shared}
    takes = {}
    for section in sections:
        for key in section.keys:
            keys.setdefault(key.name, key)
            takes[key.name] = takes.get(key.name, ()) + (section.arch,)
    groups = list(dict.fromkeys(takes.values()))
    return tuple(keys.values()), dict(sorted(takes.items(), key=lambda item: groups.index(item[1])))


@dataclass(frozen=True, eq=False)  # (one object per arch: hashed and compared by identity)
class ModelSection:
    """How ``arch`` reads the run config's model section (``m`` below: its keys as attributes, null as None).

    ``model_module``: the module that registers the arch's ModelSpec (relative to infini_train.models, or absolute),
    imported when a model or its config class is asked for; ``keys``: the RunKeys it takes beyond SHARED_KEYS;
    ``preset_keys``: the keys a preset defines, in the order the explicit ones overriding it are reported;
    ``preset_doc``: a few of its presets for model.preset's doc; ``hf_model_type``: the config.json model_type of its
    Hugging Face checkpoints; ``llmc``: whether llm.c model files (.bin) hold its weights; ``experts``: a
    mixture-of-experts model; ``expert_parallel``: whether parallel.expert may split its experts; ``biases``:
    whether its linear layers may have biases (model.bias)."""

    arch: str
    model_module: str
    keys: tuple = ()
    preset_keys: tuple = ()
    preset_doc: str = ""
    hf_model_type: str | None = None
    llmc: bool = False
    experts: bool = False
    expert_parallel: bool = True
    biases: bool = True
    names: dict = field(default_factory=dict)  # {run key: the model config's field} where the names differ

    def spec(self):
        """The arch's ModelSpec (its model module imported on first use)."""
        return registry.model_spec(self.arch)

    def presets(self):
        """{preset name: its model config's fields}."""
        return self.spec().config_class.presets()

    def takes(self, key):
        """Whether the arch reads run key ``key`` (a shared key or one of its own)."""
        return key in {k.name for k in SHARED_KEYS} or key in {k.name for k in self.keys}

    def given(self, m):
        """{the model config's field: value} of the explicit (non-null) keys of ``m`` this arch takes but arch,
        pretrained and preset."""
        return {self.names.get(k, k): getattr(m, k) for k in (f.name for f in dataclasses.fields(m))
                if k not in ("arch", "pretrained", "preset") and self.takes(k) and getattr(m, k) is not None}

    def model_config(self, m):
        """The model config ``m`` asks for (no ``pretrained``): the preset's fields, else the config class's
        defaults, with the explicit keys over them."""
        config_class = self.spec().config_class
        fields = {**(config_class.presets()[m.preset] if m.preset else {}), **self.given(m)}
        return config_class(**fields)

    def preset_value(self, preset, key):
        """The value the ``preset`` (its model config's fields) gives run key ``key``, or None."""
        return preset.get(self.names.get(key, key))

    def preset_overrides(self, m):
        """(key, the preset's value, the given value) for each explicit preset key that differs from the preset."""
        if not m.preset or m.preset not in self.presets():
            return []
        preset, conflicts = self.presets()[m.preset], []
        for key in self.preset_keys:
            given, theirs = getattr(m, key), self.preset_value(preset, key)
            if given is not None and theirs is not None and given != theirs:
                conflicts.append((key, theirs, given))
        return conflicts

    def resolved_values(self, config):
        """{run key: value} of the built model ``config``: what ``--print-config`` fills the null keys with."""
        built = config.to_dict()
        return {**built, **{ours: built[theirs] for ours, theirs in self.names.items() if theirs in built}}

    def run_key(self, name):
        """The run key (``model.<key>``) that sets the model config's field ``name``."""
        return {theirs: ours for ours, theirs in self.names.items()}.get(name, name)

    def config_error(self, text):
        """The run-config error of the model config class's error ``text`` that names no field, or None."""
        return None

    def section_problems(self, m, ok):
        """What the arch refuses of its own keys (each problem's key is then not checked further)."""
        if not self.biases and ok("model.bias") and m.bias:
            return [f"model.bias: expected false or null for model.arch={self.arch} (its linear layers have no "
                    "biases, as the released models), got True; HINT: drop the key"]
        return []

    def shape_problems(self, m):
        """What stops the model config from being built, found before building it (the config class's own errors
        are reported on their key otherwise)."""
        return []

    def model_problems(self, m, config):
        """What the built model ``config`` has that the run cannot take."""
        return []

    def run_problems(self, cfg, ok, config):
        """What the run's settings and layout ask of the model ``config`` that it cannot do (its shape against the
        layout is its ModelSpec's validate, checked after these)."""
        p = cfg.parallel
        if ok("parallel.expert") and p.expert > 1:
            moe = [s.arch for s in registry.sections() if s.experts and s.expert_parallel]
            return [f"parallel.expert: expected 1 for model.arch={self.arch} (expert parallelism splits the experts "
                    f"of a mixture-of-experts model; this model has none), got {p.expert}; HINT: set "
                    f"parallel.expert=1, or model.arch={' | '.join(moe)}"]
        return []


__all__ = ["RunKey", "ModelSection", "SHARED_KEYS", "AT_LEAST_ONE", "POSITIVE", "at_least_zero", "model_keys"]
