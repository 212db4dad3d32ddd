"""LLaMA-3 and the models on its blocks: the model (model.py), its config and presets (config.py), weight IO for HF
directories (io.py), its tensor/sequence-parallel plan (parallel.py, imported when a run splits the model) and how
each arch reads a run config's model section (section.py); Qwen3 (qwen3.py), Qwen3-MoE (qwen3_moe.py) and Mixtral
(mixtral.py) each register their own spec. ``SPEC`` here is LLaMA-3's. The names below are imported when first used,
so that reading a run config (which imports section.py) does not import the models."""
from importlib import import_module

_FROM = {"LlamaConfig": ".config", "LLAMA_PRESETS": ".config",
         **dict.fromkeys(("SPEC", "Llama", "LlamaAttention", "LlamaDecoderLayer", "LlamaMLP"), ".model"),
         **dict.fromkeys(("QWEN3_PRESETS", "Qwen3", "Qwen3Config"), ".qwen3"),
         **dict.fromkeys(("QWEN3_MOE_PRESETS", "Qwen3Moe", "Qwen3MoeConfig"), ".qwen3_moe"),
         **dict.fromkeys(("MIXTRAL_PRESETS", "Mixtral", "MixtralConfig"), ".mixtral")}


def __getattr__(name):
    if name not in _FROM:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_FROM[name], __name__), name)


__all__ = ["Llama", "LlamaConfig", "LLAMA_PRESETS", "LlamaAttention", "LlamaMLP", "LlamaDecoderLayer", "SPEC",
           "Qwen3", "Qwen3Config", "QWEN3_PRESETS", "Qwen3Moe", "Qwen3MoeConfig", "QWEN3_MOE_PRESETS", "Mixtral",
           "MixtralConfig", "MIXTRAL_PRESETS"]
