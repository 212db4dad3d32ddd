"""DeepSeek-V3: the model with multi-head latent attention (model.py), its compressed KV cache (mla_cache.py), its
config and presets (config.py), weight IO for HF directories (io.py), its tensor-parallel plan (parallel.py) and how
it reads a run config's model section (section.py). The names below are imported when first used, so that reading a
run config (which imports section.py) does not import the model."""
from importlib import import_module

_FROM = {"DeepseekV3Config": ".config", "DEEPSEEK_V3_PRESETS": ".config", "MLACache": ".mla_cache",
         "cache_bytes_per_token": ".mla_cache",
         **dict.fromkeys(("SPEC", "DeepseekV3", "DeepseekV3Attention", "DeepseekV3DecoderLayer"), ".model")}


def __getattr__(name):
    if name not in _FROM:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_FROM[name], __name__), name)


__all__ = sorted(_FROM)
