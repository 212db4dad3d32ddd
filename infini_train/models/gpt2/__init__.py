"""GPT-2: the model (model.py, nanoGPT's layout with Hugging Face's parameter names), its config and presets
(config.py), weight IO for HF safetensors and llm.c files (io.py) and its tensor/sequence-parallel plan (parallel.py,
imported when a run splits the model)."""
from .config import GPT2_PRESETS, GPT2Config
from .model import GPT2, MLP, SPEC, Block, CausalSelfAttention, KVCache

__all__ = ["GPT2", "GPT2Config", "GPT2_PRESETS", "KVCache", "SPEC", "Block", "CausalSelfAttention", "MLP"]
