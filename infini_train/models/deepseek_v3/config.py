"""DeepseekV3Config: the shape of a DeepSeek-V3 model -- multi-head latent attention (the low-rank query and the
compressed key/value paths, the decoupled rotary key), YaRN rope scaling, the first ``first_k_dense_replace`` layers
dense and the others DeepSeek-MoE layers (sigmoid routing with the correction bias, group-limited top-k, shared
experts) -- on the LMConfig interface, with presets of the released shape and a tiny one."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..lm_config import LMConfig
from ..yarn import YARN_KEYS

DEEPSEEK_V3_PRESETS = {
    # config.json of deepseek-ai/DeepSeek-V3 (671B, 37B active), multi-token prediction left out
    "deepseek-v3": dict(vocab_size=129280, dim=7168, n_layers=61, n_heads=128, intermediate_size=18432,
                        max_seq_len=163840, rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                        q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                        rope_scaling=dict(factor=40.0, original_max_position_embeddings=4096, beta_fast=32,
                                          beta_slow=1, mscale=1.0, mscale_all_dim=1.0),
                        first_k_dense_replace=3, n_routed_experts=256, num_experts_per_tok=8,
                        moe_intermediate_size=2048, n_shared_experts=1, routed_scaling_factor=2.5, n_group=8,
                        topk_group=4, norm_topk_prob=True),
    # a small model of the same layout for tests and trials (the byte tokenizer's 257 tokens)
    "deepseek-v3-tiny": dict(vocab_size=257, dim=64, n_layers=4, n_heads=4, intermediate_size=128, max_seq_len=256,
                             rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False, q_lora_rank=32,
                             kv_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                             rope_scaling=dict(factor=4.0, original_max_position_embeddings=64, beta_fast=32,
                                               beta_slow=1, mscale=1.0, mscale_all_dim=1.0),
                             first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=2,
                             moe_intermediate_size=32, n_shared_experts=1, routed_scaling_factor=2.5, n_group=2,
                             topk_group=1, norm_topk_prob=True),
}
_POSITIVE = ("vocab_size", "dim", "n_layers", "n_heads", "intermediate_size", "max_seq_len", "kv_lora_rank",
             "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts", "num_experts_per_tok",
             "moe_intermediate_size", "n_group", "topk_group")


@dataclass
class DeepseekV3Config(LMConfig):
    """``dim`` is HF's hidden_size, ``n_layers`` num_hidden_layers, ``n_heads`` num_attention_heads, ``max_seq_len``
    max_position_embeddings, ``n_routed_experts`` the routed experts (HF's n_routed_experts / num_local_experts).
    ``q_lora_rank`` None: the direct q_proj. ``rope_scaling``: None or YaRN's keys (models/yarn.py: factor,
    original_max_position_embeddings, beta_fast, beta_slow, mscale, mscale_all_dim). ``rope_interleave``: the rotary
    pairs are (x0, x1), (x2, x3), ... (DeepSeek's layout; HF's default). Layers ``>= first_k_dense_replace`` are
    DeepSeek-MoE layers; ``bias_update_rate`` is the auxiliary-loss-free bias's step (0: frozen) and
    ``seq_aux_loss_alpha`` the sequence-wise balance loss's weight (0: none); ``num_nextn_predict_layers``: the
    multi-token prediction modules (mtp.py; 0: none). HF's defaults otherwise."""

    vocab_size: int = 129280
    dim: int = 7168
    n_layers: int = 61
    n_heads: int = 128
    intermediate_size: int = 18432
    max_seq_len: int = 4096
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    rope_interleave: bool = True
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    dropout: float = 0.0
    pad_token_id: int | None = None
    q_lora_rank: int | None = 1536
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    first_k_dense_replace: int = 3
    n_routed_experts: int = 256
    num_experts_per_tok: int = 8
    moe_intermediate_size: int = 2048
    n_shared_experts: int = 1
    routed_scaling_factor: float = 2.5
    n_group: int = 8
    topk_group: int = 4
    norm_topk_prob: bool = True
    bias_update_rate: float = 1e-3
    seq_aux_loss_alpha: float = 0.0
    num_nextn_predict_layers: int = 0
    RUN_KEYS = {"dim": "n_embd", "n_layers": "n_layer", "n_heads": "n_head", "max_seq_len": "block_size",
                "tie_word_embeddings": "tie_embeddings", "attention_bias": "bias", "pad_token_id": "pretrained",
                "n_routed_experts": "num_experts"}

    def __post_init__(self):
        name = "DeepseekV3Config"
        for field in _POSITIVE:
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name}.{field}: expected a positive integer, got {value!r}")
        if self.q_lora_rank is not None and (not isinstance(self.q_lora_rank, int) or self.q_lora_rank <= 0):
            raise ValueError(f"{name}.q_lora_rank: expected a positive integer or None (the direct q_proj), got "
                             f"{self.q_lora_rank!r}")
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"{name}.qk_rope_head_dim: expected an even size (rotary embeddings rotate pairs), got "
                             f"{self.qk_rope_head_dim}")
        if not 0 <= self.first_k_dense_replace <= self.n_layers:
            raise ValueError(f"{name}.first_k_dense_replace: expected 0 .. n_layers ({self.n_layers}), got "
                             f"{self.first_k_dense_replace}")
        if self.num_experts_per_tok > self.n_routed_experts:
            raise ValueError(f"{name}.num_experts_per_tok: expected at most n_routed_experts "
                             f"({self.n_routed_experts}), got {self.num_experts_per_tok}")
        if self.n_routed_experts % self.n_group or not 1 <= self.topk_group <= self.n_group:
            raise ValueError(f"{name}: n_group ({self.n_group}) must divide n_routed_experts "
                             f"({self.n_routed_experts}) and topk_group ({self.topk_group}) be in 1 .. n_group")
        if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"{name}.pad_token_id: expected None or an id in [0, {self.vocab_size}), got "
                             f"{self.pad_token_id!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"{name}.dropout: expected a value in [0, 1), got {self.dropout!r}")
        if not (self.bias_update_rate >= 0 and self.seq_aux_loss_alpha >= 0 and self.routed_scaling_factor > 0):
            raise ValueError(f"{name}: expected bias_update_rate >= 0, seq_aux_loss_alpha >= 0 and "
                             f"routed_scaling_factor > 0, got {self.bias_update_rate!r}, {self.seq_aux_loss_alpha!r}, "
                             f"{self.routed_scaling_factor!r}")
        if not isinstance(self.num_nextn_predict_layers, int) or self.num_nextn_predict_layers < 0:
            raise ValueError(f"{name}.num_nextn_predict_layers: expected an integer >= 0 (0: no multi-token "
                             f"prediction), got {self.num_nextn_predict_layers!r}")
        if self.rope_scaling is not None:
            unknown = sorted(set(self.rope_scaling) - set(YARN_KEYS))
            if unknown or "original_max_position_embeddings" not in self.rope_scaling:
                raise ValueError(f"{name}.rope_scaling: expected YaRN's keys {list(YARN_KEYS)} with "
                                 f"original_max_position_embeddings, got {dict(self.rope_scaling)}\nHINT: "
                                 "rope_scaling=None turns the scaling off")
            self.rope_scaling = dict(self.rope_scaling)

    @classmethod
    def presets(cls):
        return DEEPSEEK_V3_PRESETS

    @classmethod
    def from_preset(cls, name, **overrides):
        if name not in DEEPSEEK_V3_PRESETS:
            raise ValueError(f"DeepseekV3Config.from_preset: unknown preset {name!r}; expected one of "
                             f"{sorted(DEEPSEEK_V3_PRESETS)}")
        return cls(**{**DEEPSEEK_V3_PRESETS[name], **overrides})

    # the LMConfig names (head_dim: a query / key head's width, nope + rope)
    hidden_size = property(lambda self: self.dim)
    num_layers = property(lambda self: self.n_layers)
    num_heads = property(lambda self: self.n_heads)
    num_kv_heads = property(lambda self: self.n_heads)
    context_length = property(lambda self: self.max_seq_len)
    head_dim = property(lambda self: self.qk_nope_head_dim + self.qk_rope_head_dim)
    num_experts = property(lambda self: self.n_routed_experts)
    router_aux_loss_coef = 0.0  # (not fields) DeepSeek-V3 has no Switch load-balancing loss, no MLP biases
    mlp_bias = False

    def to_dict(self):
        return dataclasses.asdict(self)

    def sparse_layer(self, layer):
        """Whether block ``layer``'s MLP is a DeepSeek-MoE layer."""
        return layer >= self.first_k_dense_replace

    def rope_parameters(self):
        """(inv_freq (qk_rope_head_dim / 2,) float32, the factor cos / sin are multiplied by), as HF computes them."""
        import numpy as np

        from ..yarn import yarn_parameters

        dim = self.qk_rope_head_dim
        if self.rope_scaling is None:
            exponents = np.arange(0, dim, 2).astype(np.float32) / np.float32(dim)
            inv = 1.0 / (np.float64(np.float32(self.rope_theta)) ** exponents.astype(np.float64)).astype(np.float32)
            return inv.astype(np.float32), 1.0
        return yarn_parameters(dim, self.rope_theta, self.rope_scaling, self.max_seq_len)

    def softmax_scale(self):
        from ..yarn import deepseek_softmax_scale

        return deepseek_softmax_scale(self.head_dim, self.rope_scaling)


__all__ = ["DeepseekV3Config", "DEEPSEEK_V3_PRESETS"]
