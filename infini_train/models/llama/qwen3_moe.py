"""Qwen3-MoE: Qwen3's attention (q_norm / k_norm, its own head_dim) and an ``it.nn.MoE`` MLP in the layers HF makes
sparse (``(layer + 1) % decoder_sparse_step == 0`` and not in ``mlp_only_layers``; the others keep a dense SwiGLU
of ``intermediate_size``); the loss adds the load-balancing loss (models/moe_lm.py). Names are Qwen3MoeForCausalLM's
checkpoint names (``mlp.gate.weight``, ``mlp.experts.{i}.gate_proj.weight``)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..moe_lm import MoECausalLM, check_moe_config
from ..registry import ModelSpec, register
from .model import Llama, _head_counts, read_hf
from .qwen3 import Qwen3Config, check_sliding_window, parallelize_qwen3, qk_norm_layout, qwen3_to_hf_config

HF_MOE_KEYS = ("num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob", "decoder_sparse_step",
               "mlp_only_layers", "router_aux_loss_coef")

QWEN3_MOE_PRESETS = {  # the released shape (config.json of Qwen/Qwen3-30B-A3B)
    "qwen3-30b-a3b": dict(dim=2048, n_layers=48, n_heads=32, n_kv_heads=4, head_dim=128, intermediate_size=6144,
                          vocab_size=151936, max_seq_len=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
                          tie_word_embeddings=False, num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
                          norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], router_aux_loss_coef=0.001),
}


@dataclass
class Qwen3MoeConfig(Qwen3Config):
    """Qwen3Config plus the experts: ``num_experts`` of width ``moe_intermediate_size``, ``num_experts_per_tok``
    chosen per token (renormalised when ``norm_topk_prob``), the sparse layers (``decoder_sparse_step``,
    ``mlp_only_layers``) and the auxiliary loss's ``router_aux_loss_coef``. HF's defaults."""

    num_experts: int = 128
    num_experts_per_tok: int = 8
    moe_intermediate_size: int = 768
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: list = field(default_factory=list)
    router_aux_loss_coef: float = 0.001

    def __post_init__(self):
        super().__post_init__()
        check_moe_config(self)
        if not isinstance(self.decoder_sparse_step, int) or self.decoder_sparse_step <= 0:
            raise ValueError(f"Qwen3MoeConfig.decoder_sparse_step: expected a positive integer, got "
                             f"{self.decoder_sparse_step!r}")
        self.mlp_only_layers = [int(i) for i in self.mlp_only_layers]
        if not any(self.sparse_layer(i) for i in range(self.n_layers)):
            raise ValueError("Qwen3MoeConfig: no layer is sparse (decoder_sparse_step / mlp_only_layers leave every "
                             "layer dense)\nHINT: use the arch qwen3 for a dense model")

    @classmethod
    def presets(cls):
        return QWEN3_MOE_PRESETS

    def sparse_layer(self, layer):
        """HF's Qwen3MoeDecoderLayer rule."""
        return layer not in self.mlp_only_layers and (layer + 1) % self.decoder_sparse_step == 0


class Qwen3Moe(MoECausalLM, Llama):
    @classmethod
    def config_from_hf(cls, hf, source):
        from .io import llama_config_fields

        check_sliding_window(hf, source)
        fields = llama_config_fields(hf, source, "qwen3_moe")
        experts = hf.get("num_experts", hf.get("num_local_experts"))
        return Qwen3MoeConfig(**fields, num_experts=experts, **{k: hf[k] for k in HF_MOE_KEYS if k in hf})

    def hf_config(self, dtype):
        cfg = self.config
        hf = qwen3_to_hf_config(cfg, dtype, "qwen3_moe", "Qwen3MoeForCausalLM")
        hf.update({k: getattr(cfg, k) for k in HF_MOE_KEYS}, num_experts=cfg.num_experts)
        return hf


SPEC = register(ModelSpec("qwen3_moe", Qwen3Moe, Qwen3MoeConfig, parallelize_qwen3, _head_counts,
                          qk_norm_layout("qwen3_moe"), read_hf=read_hf))

__all__ = ["Qwen3Moe", "Qwen3MoeConfig", "QWEN3_MOE_PRESETS", "SPEC"]
