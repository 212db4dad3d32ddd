"""GPT-2: the model (model.py, nanoGPT's layout with Hugging Face's parameter names), its config and presets
(config.py), weight IO for HF safetensors and llm.c files (io.py), its tensor/sequence-parallel plan (parallel.py,
imported when a run splits the model) and how it reads a run config's model section (section.py). The names below
are imported when first used, so that reading a run config (which imports section.py) does not import the model."""
from importlib import import_module

_FROM = {"GPT2Config": ".config", "GPT2_PRESETS": ".config", **dict.fromkeys(
    ("GPT2", "MLP", "SPEC", "Block", "CausalSelfAttention", "KVCache"), ".model")}


def __getattr__(name):
    if name not in _FROM:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_FROM[name], __name__), name)


__all__ = ["GPT2", "GPT2Config", "GPT2_PRESETS", "KVCache", "SPEC", "Block", "CausalSelfAttention", "MLP"]
