"""The model architectures a run can build, by ``model.arch`` name: their class, config class and tensor-parallel
split. Checkpoints record the arch, so a script loads whichever model a run trained."""
from __future__ import annotations

ARCHS = ("gpt2", "llama3")


def model_class(arch):
    """(model class, config class) of ``arch``."""
    if arch == "gpt2":
        from .gpt2 import GPT2, GPT2Config
        return GPT2, GPT2Config
    if arch == "llama3":
        from .llama import Llama, LlamaConfig
        return Llama, LlamaConfig
    raise ValueError(f"model.arch: expected one of {ARCHS}, got {arch!r}")


def parallelize(model, group, sequence_parallel=False):
    """Split ``model`` over the tensor-parallel ``group`` in place (parallelize_gpt2 / parallelize_llama)."""
    from .gpt2 import GPT2
    if isinstance(model, GPT2):
        from .gpt2_parallel import parallelize_gpt2
        return parallelize_gpt2(model, group, sequence_parallel)
    from .llama_parallel import parallelize_llama
    return parallelize_llama(model, group, sequence_parallel)


def build(arch, config_dict):
    """A model of ``arch`` from its config's ``to_dict()`` (as checkpoints store it)."""
    cls, config_cls = model_class(arch)
    return cls(config_cls(**config_dict))


def arch_of(model):
    from .gpt2 import GPT2
    return "gpt2" if isinstance(model, GPT2) else "llama3"


__all__ = ["ARCHS", "model_class", "parallelize", "build", "arch_of"]
