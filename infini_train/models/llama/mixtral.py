"""Mixtral: LLaMA's attention (no sliding window: a window shorter than the context is refused at load) and in every
layer an ``it.nn.MoE`` of ``num_experts`` SwiGLU experts of width ``intermediate_size``, top ``num_experts_per_tok``
always renormalised; the loss adds the load-balancing loss (models/moe_lm.py). Our modules use Qwen3-MoE's names; the
checkpoint's ``block_sparse_moe.experts.{i}.w1 / w3 / w2`` (gate / up / down) and ``block_sparse_moe.gate`` are
mapped when reading and writing HF directories."""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..gpt2.io import WeightsError
from ..moe_lm import MoECausalLM, check_moe_config
from ..registry import ModelSpec, register
from .model import Llama, _head_counts, read_hf
from .config import LlamaConfig
from .parallel import parallelize_llama
from .qwen3 import check_sliding_window

_FROM_HF = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
_TO_HF = {v: k for k, v in _FROM_HF.items()}

MIXTRAL_PRESETS = {  # the released shape (config.json of mistralai/Mixtral-8x7B-v0.1)
    "mixtral-8x7b": dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, intermediate_size=14336, vocab_size=32000,
                         max_seq_len=32768, rope_theta=1000000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                         num_experts=8, num_experts_per_tok=2, router_aux_loss_coef=0.02),
}


@dataclass
class MixtralConfig(LlamaConfig):
    """LlamaConfig (rope scaling off, rope_theta 1e6, untied) plus ``num_experts`` (HF's num_local_experts),
    ``num_experts_per_tok`` and ``router_aux_loss_coef``; every layer is sparse, its experts ``intermediate_size``
    wide."""

    vocab_size: int = 32000
    rope_theta: float = 1000000.0
    rope_scaling: dict | None = None
    tie_word_embeddings: bool = False
    num_experts: int = 8
    num_experts_per_tok: int = 2
    router_aux_loss_coef: float = 0.001
    norm_topk_prob = True  # (not fields) Mixtral always renormalises the chosen weights
    moe_intermediate_size = property(lambda self: self.intermediate_size)

    def __post_init__(self):
        super().__post_init__()
        check_moe_config(self)

    @classmethod
    def presets(cls):
        return MIXTRAL_PRESETS

    def sparse_layer(self, layer):
        return True


class Mixtral(MoECausalLM, Llama):
    @classmethod
    def config_from_hf(cls, hf, source):
        from .io import llama_config_fields

        check_sliding_window(hf, source)
        if hf.get("router_jitter_noise", 0.0):
            raise WeightsError(f"{source}: router_jitter_noise {hf['router_jitter_noise']} is not supported (0 only)")
        return MixtralConfig(**llama_config_fields(hf, source, "mixtral"), num_experts=hf["num_local_experts"],
                             num_experts_per_tok=hf["num_experts_per_tok"],
                             router_aux_loss_coef=hf.get("router_aux_loss_coef", 0.001))

    def hf_config(self, dtype):
        from .io import llama_to_hf_config

        cfg = self.config
        hf = llama_to_hf_config(cfg, dtype)
        for key in ("mlp_bias", "attention_bias"):
            hf.pop(key)
        hf.update(architectures=["MixtralForCausalLM"], model_type="mixtral", num_local_experts=cfg.num_experts,
                  num_experts_per_tok=cfg.num_experts_per_tok, router_aux_loss_coef=cfg.router_aux_loss_coef,
                  sliding_window=None, router_jitter_noise=0.0, output_router_logits=False)
        return hf

    @staticmethod
    def from_hf_name(name):
        name = name.replace(".block_sparse_moe.", ".mlp.")
        return re.sub(r"(\.experts\.\d+\.)(w[123])\.", lambda m: f"{m[1]}{_FROM_HF[m[2]]}.", name)

    @staticmethod
    def to_hf_name(name):
        name = name.replace(".mlp.", ".block_sparse_moe.")
        return re.sub(r"(\.experts\.\d+\.)(gate_proj|up_proj|down_proj)\.", lambda m: f"{m[1]}{_TO_HF[m[2]]}.", name)


SPEC = register(ModelSpec("mixtral", Mixtral, MixtralConfig, parallelize_llama, _head_counts, read_hf=read_hf))

__all__ = ["Mixtral", "MixtralConfig", "MIXTRAL_PRESETS", "SPEC"]
