"""The models a run can build, by ``model.arch`` name: each arch has a ModelSection, declared in a small module of its
family's folder (the run-config keys it takes, its presets, how it builds its model config and what it checks:
models/model_section.py), and a ModelSpec, registered by its model module (as torchtitan's ModelSpec: everything a run
needs of the model). Checkpoints record the arch, so a script loads whichever model a run trained. A new model is files
under models/ -- a module that defines its blocks on the CausalLM shell and registers its spec, and its section in its
family's section module (SECTIONS) -- and one line in ARCH_SECTIONS; nothing in the run names it.

A section's module is imported the first time its arch is asked for, and a spec's module the first time its model is:
reading a config imports the families' small section modules, building (or checking the shape of) a model its own."""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from .lm_config import pipeline_problems

# arch -> the module under infini_train.models that declares its ModelSection (in the module's SECTIONS)
ARCH_SECTIONS = {"gpt2": "gpt2.section", "llama3": "llama.section", "qwen3": "llama.section",
                 "qwen3_moe": "llama.section", "mixtral": "llama.section",
                 "deepseek_v3": "deepseek_v3.section", "gpt_oss": "gpt_oss.section"}
ARCHS = tuple(ARCH_SECTIONS)  # (archs() adds the ones registered by register_section)
DEFAULT_ARCH = "gpt2"  # the arch of a config that names none, and of checkpoints that recorded none
_SECTIONS = {}
_SPECS = {}


@dataclass(frozen=True)
class ModelSpec:
    """One model: its class and config class, its tensor/sequence-parallel plan (``tensor_parallel(model, group,
    sequence_parallel)``, in place), the attention head counts a tensor group must divide (``head_counts(config)``:
    {config key: count}), what else its shape refuses of a layout (``layout_problems``), and the readers that map a
    checkpoint's weights onto its names (``read_hf``, ``read_llmc``: models/pretrained.py chooses by them);
    ``parallelize(model, dims, cfg)`` applies a run's whole layout (models/parallelize.py); ``section`` is how a run
    config's model section becomes its config; pipeline chunks, saving and generation come with the class
    (CausalLM)."""

    arch: str
    model_class: type
    config_class: type
    tensor_parallel: Callable
    head_counts: Callable
    layout_problems: Callable | None = None  # (config, tensor, pipeline, virtual, sequence) -> [problem]
    read_hf: Callable | None = None  # HF directory -> (model config, {our name: tensor read box by box})
    read_llmc: Callable | None = None  # llm.c model file -> the same, for the arch whose section says llmc

    @property
    def section(self):
        """The arch's ModelSection (how a run config's model section becomes its model config, and its checks)."""
        return section(self.arch)

    def parallelize(self, model, dims, cfg):
        """The run's layout applied to ``model`` in one declared order: the ParallelPlan (models/parallelize.py)."""
        from .parallelize import parallelize

        return parallelize(self, model, dims, cfg)

    def validate(self, config, tensor=1, pipeline=1, virtual=1, sequence=None):
        """The ways the model ``config`` cannot take the layout, one line each (the key to change first): blocks that
        do not cut into pipeline x virtual equal chunks, heads that ``tensor`` ranks cannot share, and what the
        model's own ``layout_problems`` refuses (``sequence``: parallel.sequence, None where not known)."""
        problems = pipeline_problems(config, pipeline, virtual)
        for name, count in self.head_counts(config).items() if tensor > 1 else ():
            if count % tensor:
                divisors = [d for d in range(1, count + 1) if count % d == 0]
                problems.append(f"parallel.tensor: expected a divisor of model {name} ({count}; each rank takes "
                                f"{name} / tensor heads), got {tensor}; HINT: use one of {divisors}")
                break
        if self.layout_problems is not None:
            problems += self.layout_problems(config, tensor, pipeline, virtual, sequence)
        return problems


def register(spec):
    """Register the ModelSpec ``spec`` (its model module does, when imported)."""
    _SPECS[spec.arch] = spec
    return spec


def register_section(model_section):
    """Register the ModelSection of an arch that has no ARCH_SECTIONS line (a model defined outside the package);
    the run config takes its arch and keys from then on."""
    _SECTIONS[model_section.arch] = model_section
    return model_section


def unregister(arch):
    """Forget an arch registered with register_section (and its spec)."""
    if arch in ARCH_SECTIONS:
        raise ValueError(f"unregister: {arch!r} is one of the package's archs {ARCHS}")
    _SECTIONS.pop(arch, None)
    _SPECS.pop(arch, None)


def archs():
    """Every arch a run can build: the ARCH_SECTIONS lines, then those registered with register_section."""
    return ARCHS + tuple(arch for arch in _SECTIONS if arch not in ARCH_SECTIONS)


def section(arch):
    """The ModelSection of ``arch`` (importing the small module that declares it)."""
    if arch not in _SECTIONS:
        if arch not in ARCH_SECTIONS:
            raise ValueError(f"model.arch: expected one of {archs()}, got {arch!r}")
        module = importlib.import_module(f"{__package__}.{ARCH_SECTIONS[arch]}")
        _SECTIONS[arch] = module.SECTIONS[arch]
    return _SECTIONS[arch]


def sections():
    """The ModelSections of archs(), in that order."""
    return tuple(section(arch) for arch in archs())


def model_spec(arch):
    """The ModelSpec of ``arch`` (importing the module that registers it)."""
    model_section = section(arch)
    if arch not in _SPECS:
        importlib.import_module(model_section.model_module, __package__)
    return _SPECS[arch]


def spec_of(model):
    """The ModelSpec of a model instance (or of a pipeline chunk of one)."""
    for spec in _SPECS.values():  # the class itself first: Qwen3 and Mixtral are Llamas
        if type(model) is spec.model_class:
            return spec
    for spec in _SPECS.values():
        if isinstance(model, spec.model_class):
            return spec
    raise ValueError(f"no registered model spec for {type(model).__name__}\nHINT: a model module registers its "
                     "ModelSpec with infini_train.models.registry.register")


def model_class(arch):
    """(model class, config class) of ``arch``."""
    spec = model_spec(arch)
    return spec.model_class, spec.config_class


def tensor_parallel(model, group, sequence_parallel=False):
    """Split ``model`` over the tensor-parallel ``group`` in place, by its spec's plan."""
    return spec_of(model).tensor_parallel(model, group, sequence_parallel)


def build(arch, config_dict):
    """A model of ``arch`` from its config's ``to_dict()`` (as checkpoints store it)."""
    spec = model_spec(arch)
    return spec.model_class(spec.config_class(**config_dict))


def arch_of(model):
    return spec_of(model).arch


__all__ = ["ARCHS", "ARCH_SECTIONS", "DEFAULT_ARCH", "ModelSpec", "register", "register_section", "unregister",
           "archs", "section", "sections", "model_spec", "spec_of", "model_class", "tensor_parallel", "build",
           "arch_of"]
