"""LLaMA-3 and the models on its blocks: the model (model.py), its config and presets (config.py), weight IO for HF
directories (io.py) and its tensor/sequence-parallel plan (parallel.py, imported when a run splits the model); Qwen3
(qwen3.py), Qwen3-MoE (qwen3_moe.py) and Mixtral (mixtral.py) each register their own spec. ``SPEC`` here is
LLaMA-3's."""
from .config import LLAMA_PRESETS, LlamaConfig
from .model import SPEC, Llama, LlamaAttention, LlamaDecoderLayer, LlamaMLP
from .qwen3 import QWEN3_PRESETS, Qwen3, Qwen3Config
from .qwen3_moe import QWEN3_MOE_PRESETS, Qwen3Moe, Qwen3MoeConfig
from .mixtral import MIXTRAL_PRESETS, Mixtral, MixtralConfig

__all__ = ["Llama", "LlamaConfig", "LLAMA_PRESETS", "LlamaAttention", "LlamaMLP", "LlamaDecoderLayer", "SPEC",
           "Qwen3", "Qwen3Config", "QWEN3_PRESETS", "Qwen3Moe", "Qwen3MoeConfig", "QWEN3_MOE_PRESETS", "Mixtral",
           "MixtralConfig", "MIXTRAL_PRESETS"]
