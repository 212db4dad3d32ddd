"""The ``model`` section of a run config (ModelConfig): its keys are the ones the registered archs' ModelSections
declare (models/model_section.py: the keys every arch shares, then each arch's own), and the arch's section turns it
into the model config, resolves it for ``--print-config`` and checks it; nothing here names an arch. Also ``_key``,
the field helper every section uses."""
from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Optional

from ...models import registry
from ...models.model_section import model_keys


def _key(default, doc):
    """A setting whose one-line ``doc`` ``train.py --help`` lists beside its dotted key."""
    return field(default=default, metadata={"doc": doc})


class ModelSettings:
    """The model: ``arch`` (one of the registry's), a preset of that arch and/or explicit keys. A key belongs to the
    archs ARCH_KEYS names (to every arch when it names none). Explicit (non-null) keys override the preset, and
    without a preset the arch's defaults. The preset defines the architecture (the arch section's preset_keys: the
    shape and context, and its own settings): an explicit one that differs from the preset's is reported
    (``preset_overrides``; the run prints a warning for each), and a preset given on the command line replaces the
    config file's (PRESET_KEYS). The shared keys have GPT-2's names (n_embd, n_layer, n_head, block_size, bias);
    each arch's section maps them onto its model config's. With ``pretrained`` the pretrained model's own config
    decides everything but dropout."""

    ARCH_KEYS = {}  # key -> the archs that take it, for the keys not every arch takes (grouped by those archs)
    ARCH_ONLY = ()  # those keys
    PRESET_KEYS = ()  # every key some arch's presets define

    @property
    def section(self):
        """The ModelSection of ``arch`` (a ValueError for an arch the registry does not know)."""
        return registry.section(self.arch)

    def foreign_keys(self):
        """(key, value, the archs it belongs to) for each explicit key that the arch has not."""
        return [(k, getattr(self, k), archs) for k, archs in self.ARCH_KEYS.items()
                if getattr(self, k) is not None and self.arch not in archs]

    def preset_overrides(self):
        """(key, the preset's value, the given value) for each explicit preset key that differs from the preset."""
        return self.section.preset_overrides(self)

    def presets(self):
        """The presets of the arch: {name: its config class's fields}."""
        return self.section.presets()

    def shape_keys_given(self):
        """The explicit keys that a ``pretrained`` model's own config decides (every one but arch and dropout)."""
        return [f.name for f in dataclasses.fields(self)
                if f.name not in ("arch", "pretrained", "dropout") and getattr(self, f.name) is not None]

    def resolved(self):
        """A copy whose null keys, among those the arch has, hold the values the model is built with (the preset's,
        else the arch's defaults): what ``train.py --print-config`` shows; it loads back to the same model. With
        ``pretrained`` a plain copy (the pretrained model's config decides, and the keys stay unset)."""
        copy = dataclasses.replace(self)
        if self.pretrained:
            return copy
        built = self.section.resolved_values(self.to_model_config())
        for f in dataclasses.fields(self):
            key = f.name
            if (key not in ("arch", "pretrained", "preset") and getattr(self, key) is None
                    and self.arch in self.ARCH_KEYS.get(key, (self.arch,)) and built.get(key) is not None):
                setattr(copy, key, built[key])
        return copy

    def to_model_config(self):
        """The arch's model config (its section's model_config), or a ``pretrained`` model's own (dropout as
        given)."""
        if self.pretrained:
            from ...models.pretrained import pretrained_config

            config = pretrained_config(self.pretrained)[1]
            if self.dropout is not None:
                config = dataclasses.replace(config, dropout=self.dropout)
            return config
        return self.section.model_config(self)


def _annotation(key):
    return key.type if key.default is not None else Optional[key.type]


_CLASSES = {}


def model_config_class():
    """The ModelConfig dataclass of the registry's archs now: made once for each set of sections (an arch registered
    with registry.register_section adds its keys)."""
    sections = registry.sections()
    if sections not in _CLASSES:
        keys, arch_keys = model_keys(sections)
        fields = [(k.name, _annotation(k), field(default=k.default, metadata={"doc": k.doc, "check": k.check}))
                  for k in keys]  # (the range check of each key, applied by model_checks.py)
        cls = dataclasses.make_dataclass("ModelConfig", fields, bases=(ModelSettings,),
                                         namespace={"__doc__": ModelSettings.__doc__, "__module__": __name__})
        cls.ARCH_KEYS, cls.ARCH_ONLY = arch_keys, tuple(arch_keys)
        cls.PRESET_KEYS = tuple(dict.fromkeys(key for s in sections for key in s.preset_keys))
        _CLASSES[sections] = cls
    return _CLASSES[sections]


ModelConfig = model_config_class()  # (the package's archs; model_config_class() also has those registered later)

__all__ = ["ModelConfig", "ModelSettings", "model_config_class", "_key"]
