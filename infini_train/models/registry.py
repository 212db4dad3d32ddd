"""The models a run can build, by ``model.arch`` name: each model module registers one ModelSpec (as torchtitan's
ModelSpec) saying everything a run needs of it. Checkpoints record the arch, so a script loads whichever model a run
trained; a new model is a module that defines its blocks on the CausalLM shell and registers its spec.

A spec's module is imported the first time its arch is asked for, so reading a config does not build models."""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

# arch -> the module under infini_train.models that registers it
ARCH_MODULES = {"gpt2": "gpt2.model", "llama3": "llama.model", "qwen3": "llama.qwen3", "qwen3_moe": "llama.qwen3_moe",
                "mixtral": "llama.mixtral"}
ARCHS = tuple(ARCH_MODULES)
_SPECS = {}


@dataclass(frozen=True)
class ModelSpec:
    """One model: its class and config class, its tensor/sequence-parallel plan (``tensor_parallel(model, group,
    sequence_parallel)``, in place), the attention head counts a tensor group must divide (``head_counts(config)``:
    {config key: count}); ``parallelize(model, dims, cfg)`` applies a run's whole layout (models/parallelize.py);
    pipeline chunks, weight IO and generation come with the class (CausalLM)."""

    arch: str
    model_class: type
    config_class: type
    tensor_parallel: Callable
    head_counts: Callable
    layout_problems: Callable | None = None  # (config, tensor, pipeline, virtual) -> [problem]: what the model refuses

    def parallelize(self, model, dims, cfg):
        """The run's layout applied to ``model`` in one declared order: the ParallelPlan (models/parallelize.py)."""
        from .parallelize import parallelize

        return parallelize(self, model, dims, cfg)

    def validate(self, config, tensor=1, pipeline=1, virtual=1):
        """The ways the model ``config`` cannot take the layout, one line each (the key to change first): blocks that
        do not cut into pipeline x virtual equal chunks, heads that ``tensor`` ranks cannot share."""
        problems = []
        stages = pipeline * virtual
        if stages > 1 and config.num_layers % stages:
            problems.append(f"model.n_layer: expected a multiple of parallel.pipeline x parallel.virtual_pipeline = "
                            f"{pipeline} x {virtual} = {stages} (equal model chunks), got {config.num_layers}")
        for name, count in self.head_counts(config).items() if tensor > 1 else ():
            if count % tensor:
                divisors = [d for d in range(1, count + 1) if count % d == 0]
                problems.append(f"parallel.tensor: expected a divisor of model {name} ({count}; each rank takes "
                                f"{name} / tensor heads), got {tensor}; HINT: use one of {divisors}")
                break
        if self.layout_problems is not None:
            problems += self.layout_problems(config, tensor, pipeline, virtual)
        return problems


def register(spec):
    _SPECS[spec.arch] = spec
    return spec


def model_spec(arch):
    """The ModelSpec of ``arch`` (importing the module that registers it)."""
    if arch not in ARCH_MODULES:
        raise ValueError(f"model.arch: expected one of {ARCHS}, got {arch!r}")
    if arch not in _SPECS:
        importlib.import_module(f"{__package__}.{ARCH_MODULES[arch]}")
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


__all__ = ["ARCHS", "ModelSpec", "register", "model_spec", "spec_of", "model_class", "tensor_parallel", "build",
           "arch_of"]
