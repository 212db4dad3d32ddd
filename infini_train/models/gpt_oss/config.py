"""GptOssConfig: the shape of a gpt-oss model (LlamaConfig's names, Hugging Face's GptOssConfig's as aliases when
reading config.json), its alternating sliding-window / full attention layers, its experts (the clamped SwiGLU's
``swiglu_alpha`` / ``swiglu_limit``) and its YaRN rope scaling (models/yarn.py); presets of the released shapes and a
tiny one."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..llama.config import LlamaConfig
from ..moe_lm import check_moe_config
from ..yarn import YARN_KEYS, yarn_parameters

LAYER_TYPES = ("sliding_attention", "full_attention")
GPT_OSS_YARN = dict(factor=32.0, beta_fast=32.0, beta_slow=1.0, truncate=False, original_max_position_embeddings=4096)

GPT_OSS_PRESETS = {  # the released shapes (config.json of openai/gpt-oss-20b and openai/gpt-oss-120b)
    "gpt-oss-20b": dict(dim=2880, n_layers=24, n_heads=64, n_kv_heads=8, head_dim=64, intermediate_size=2880,
                        vocab_size=201088, max_seq_len=131072, rope_theta=150000.0, rope_scaling=dict(GPT_OSS_YARN),
                        rms_norm_eps=1e-5, tie_word_embeddings=False, sliding_window=128, num_experts=32,
                        num_experts_per_tok=4, router_aux_loss_coef=0.9),
    "gpt-oss-120b": dict(dim=2880, n_layers=36, n_heads=64, n_kv_heads=8, head_dim=64, intermediate_size=2880,
                         vocab_size=201088, max_seq_len=131072, rope_theta=150000.0, rope_scaling=dict(GPT_OSS_YARN),
                         rms_norm_eps=1e-5, tie_word_embeddings=False, sliding_window=128, num_experts=128,
                         num_experts_per_tok=4, router_aux_loss_coef=0.9),
    # a few-MB model of the same structure (yarn, sinks, alternating windows, biased router and experts)
    "gpt-oss-tiny": dict(dim=64, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=16, intermediate_size=64,
                         vocab_size=257, max_seq_len=256, rope_theta=150000.0,
                         rope_scaling=dict(GPT_OSS_YARN, factor=4.0, original_max_position_embeddings=64),
                         rms_norm_eps=1e-5, tie_word_embeddings=False, sliding_window=16, num_experts=4,
                         num_experts_per_tok=2, router_aux_loss_coef=0.01),
}


def alternating_layers(n_layers):
    """HF's default layer_types: even layers sliding-window, odd layers full attention."""
    return [LAYER_TYPES[i % 2] for i in range(n_layers)]


@dataclass
class GptOssConfig(LlamaConfig):
    """LlamaConfig's fields plus: ``sliding_window`` (the keys a sliding layer's query sees, itself included),
    ``layer_types`` (one of LAYER_TYPES per layer; None: alternating, sliding first), ``num_experts`` (HF's
    num_local_experts) of width ``intermediate_size``, ``num_experts_per_tok``, ``swiglu_alpha`` / ``swiglu_limit``
    (the experts' clamped SwiGLU), ``router_aux_loss_coef``. ``rope_scaling``: None or YaRN's parameters (factor,
    beta_fast, beta_slow, truncate, original_max_position_embeddings; models/yarn.py). Attention has biases and one
    learned sink per head."""

    vocab_size: int = 201088
    dim: int = 2880
    n_layers: int = 24
    n_heads: int = 64
    n_kv_heads: int | None = 8
    intermediate_size: int = 2880
    head_dim: int | None = 64
    max_seq_len: int = 131072
    rope_theta: float = 150000.0
    rope_scaling: dict | None = field(default_factory=lambda: dict(GPT_OSS_YARN))
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    attention_bias: bool = True
    sliding_window: int | None = 128
    layer_types: list | None = None
    num_experts: int = 32
    num_experts_per_tok: int = 4
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    router_aux_loss_coef: float = 0.9
    norm_topk_prob = True  # (not fields) the softmax runs over the chosen logits only: the weights sum to 1
    moe_intermediate_size = property(lambda self: self.intermediate_size)
    RUN_KEYS = {**LlamaConfig.RUN_KEYS, "rope_scaling": ("rope_scaling_factor", "rope_original_context"),
                "layer_types": "layer_types", "sliding_window": "sliding_window"}

    def __post_init__(self):
        yarn, self.rope_scaling = self.rope_scaling, None  # (LlamaConfig checks llama3 scaling)
        super().__post_init__()
        if yarn is not None:
            unknown = sorted(set(yarn) - set(YARN_KEYS) - {"rope_type", "rope_theta"})
            if unknown or "factor" not in yarn or "original_max_position_embeddings" not in yarn:
                raise ValueError(f"GptOssConfig.rope_scaling: expected YaRN's keys {list(YARN_KEYS)} (factor and "
                                 f"original_max_position_embeddings required), got {sorted(yarn)}\nHINT: "
                                 "rope_scaling=None turns the scaling off")
            yarn = {k: v for k, v in yarn.items() if k in YARN_KEYS}
        self.rope_scaling = yarn
        if self.layer_types is None:
            self.layer_types = alternating_layers(self.n_layers)
        self.layer_types = list(self.layer_types)
        if len(self.layer_types) != self.n_layers or any(t not in LAYER_TYPES for t in self.layer_types):
            raise ValueError(f"GptOssConfig.layer_types: expected {self.n_layers} entries (n_layers), each one of "
                             f"{LAYER_TYPES}, got {self.layer_types}")
        window = self.sliding_window
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise ValueError(f"GptOssConfig.sliding_window: expected an integer >= 1 or None, got {window!r}")
        if window is None and "sliding_attention" in self.layer_types:
            raise ValueError("GptOssConfig.sliding_window: None, but layer_types has sliding_attention layers\n"
                             "HINT: give a window, or make every layer full_attention")
        if not self.swiglu_limit > 0:
            raise ValueError(f"GptOssConfig.swiglu_limit: expected a number > 0, got {self.swiglu_limit!r}")
        check_moe_config(self)

    @classmethod
    def presets(cls):
        return GPT_OSS_PRESETS

    def sparse_layer(self, layer):
        return True  # every gpt-oss layer's MLP is a mixture of experts

    def window(self, layer):
        """The sliding window of layer ``layer``'s attention, or None (full attention)."""
        return self.sliding_window if self.layer_types[layer] == "sliding_attention" else None

    def rope_parameters(self):
        """(inv_freq (head_dim / 2,) float32, attention factor the cos / sin tables are multiplied by), as HF's
        GptOssRotaryEmbedding holds them."""
        if self.rope_scaling is None:
            return super().inv_freq(), 1.0
        inv, factor = yarn_parameters(self.head_dim, self.rope_theta, self.rope_scaling, self.max_seq_len)
        return np.asarray(inv, np.float32), float(factor)

    def inv_freq(self):
        return self.rope_parameters()[0]


__all__ = ["GptOssConfig", "GPT_OSS_PRESETS", "LAYER_TYPES", "alternating_layers"]
