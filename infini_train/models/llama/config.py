"""LlamaConfig: the shape of a LLaMA-3 model (Meta's names, with Hugging Face's as aliases), its rotary embedding
(llama3 frequency scaling) and presets of the released shapes."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from ..lm_config import LMConfig

LLAMA_PRESETS = {
    # LLaMA-3.2-1B's shape: 16 layers, 2048 wide, 32 heads sharing 8 key/value heads, tied embeddings
    "llama3.2-1b": dict(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, intermediate_size=8192, vocab_size=128256,
                        rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, max_seq_len=131072,
                        rope_scaling=dict(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                          original_max_position_embeddings=8192)),
    "llama3.2-3b": dict(dim=3072, n_layers=28, n_heads=24, n_kv_heads=8, intermediate_size=8192, vocab_size=128256,
                        rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, max_seq_len=131072,
                        rope_scaling=dict(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                          original_max_position_embeddings=8192)),
    "llama3.1-8b": dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, intermediate_size=14336, vocab_size=128256,
                        rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, max_seq_len=131072,
                        rope_scaling=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                          original_max_position_embeddings=8192)),
}
ROPE_SCALING_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


@dataclass
class LlamaConfig(LMConfig):
    """``dim`` is HF's hidden_size, ``n_layers`` num_hidden_layers, ``n_heads`` num_attention_heads, ``n_kv_heads``
    num_key_value_heads (None: as many as n_heads), ``max_seq_len`` max_position_embeddings (the longest sequence,
    also called block_size here). ``rope_scaling``: None, or the llama3 scaling's ``factor``, ``low_freq_factor``,
    ``high_freq_factor`` and ``original_max_position_embeddings``. ``dropout`` applies to attention probabilities."""

    vocab_size: int = 128256
    dim: int = 2048
    n_layers: int = 16
    n_heads: int = 32
    n_kv_heads: int | None = 8
    intermediate_size: int = 8192
    head_dim: int | None = None
    max_seq_len: int = 2048
    rope_theta: float = 500000.0
    rope_scaling: dict | None = field(default_factory=lambda: dict(LLAMA_PRESETS["llama3.2-1b"]["rope_scaling"]))
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = True
    dropout: float = 0.0
    attention_bias: bool = False
    mlp_bias: bool = False
    pad_token_id: int | None = None  # HF's padding_idx: the token embedding row that gets no gradient
    qk_norm = False  # (not a field) Qwen3Config makes it one: RMSNorm on each head's queries and keys
    # (not a field) the run config key (model.<key>) setting each field whose name differs; messages name the key
    RUN_KEYS = {"dim": "n_embd", "n_layers": "n_layer", "n_heads": "n_head", "n_kv_heads": "n_kv_head",
                "max_seq_len": "block_size", "tie_word_embeddings": "tie_embeddings", "attention_bias": "bias",
                "mlp_bias": "bias", "pad_token_id": "pretrained", "qk_norm": "arch",
                "rope_scaling": ("rope_scaling_factor", "rope_low_freq_factor", "rope_high_freq_factor",
                                 "rope_original_context")}

    def __post_init__(self):
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "intermediate_size", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"LlamaConfig.{name}: expected a positive integer, got {value!r}")
        if self.pad_token_id is not None and not (isinstance(self.pad_token_id, int)
                                                  and 0 <= self.pad_token_id < self.vocab_size):
            raise ValueError(f"LlamaConfig.pad_token_id: expected None or an id in [0, {self.vocab_size}), got "
                             f"{self.pad_token_id!r}")
        if self.head_dim is None:
            if self.dim % self.n_heads:
                raise ValueError(f"LlamaConfig: dim ({self.dim}) must be divisible by n_heads ({self.n_heads})\n"
                                 "HINT: pick n_heads among the divisors of dim, or give head_dim explicitly")
            self.head_dim = self.dim // self.n_heads
        if self.head_dim % 2:
            raise ValueError(f"LlamaConfig.head_dim: expected an even size (rotary embeddings rotate pairs), got "
                             f"{self.head_dim}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"LlamaConfig: n_heads ({self.n_heads}) must be a multiple of n_kv_heads "
                             f"({self.n_kv_heads}): each key/value head serves a group of query heads\nHINT: pick "
                             f"n_kv_heads among the divisors of {self.n_heads}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LlamaConfig.dropout: expected a value in [0, 1), got {self.dropout!r}")
        if self.rope_scaling is not None:
            missing = [k for k in ROPE_SCALING_KEYS if k not in self.rope_scaling]
            if missing:
                raise ValueError(f"LlamaConfig.rope_scaling: expected the llama3 keys {list(ROPE_SCALING_KEYS)}, "
                                 f"missing {missing}\nHINT: rope_scaling=None turns the scaling off")
            self.rope_scaling = {k: self.rope_scaling[k] for k in ROPE_SCALING_KEYS}

    @classmethod
    def presets(cls):
        """{name: fields} of the released shapes of this config's model (subclasses name their own)."""
        return LLAMA_PRESETS

    @classmethod
    def from_preset(cls, name, **overrides):
        presets = cls.presets()
        if name not in presets:
            import difflib
            close = difflib.get_close_matches(name, presets, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(f"{cls.__name__}.from_preset: unknown preset {name!r}; expected one of "
                             f"{sorted(presets)}\nHINT: {hint}or give the shape explicitly")
        return cls(**{**presets[name], **overrides})

    # the LMConfig names
    hidden_size = property(lambda self: self.dim)
    num_layers = property(lambda self: self.n_layers)
    num_heads = property(lambda self: self.n_heads)
    num_kv_heads = property(lambda self: self.n_kv_heads)
    context_length = property(lambda self: self.max_seq_len)

    def to_dict(self):
        return dataclasses.asdict(self)

    def sparse_layer(self, layer):
        """Whether block ``layer``'s MLP is a mixture of experts (never for LLaMA; see models/moe_lm.py)."""
        return False

    def inv_freq(self):
        """The rotary inverse frequencies (head_dim / 2,), float32, as HF computes them (llama3 scaling applied)."""
        dim = self.head_dim
        inv = (1.0 / (np.float32(self.rope_theta) ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim)))
        inv = inv.astype(np.float32)
        if self.rope_scaling is None:
            return inv
        s = self.rope_scaling
        factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
        old_context = s["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_context / low, old_context / high
        wavelen = (2 * math.pi / inv).astype(np.float32)
        scaled = np.where(wavelen > low_wavelen, inv / factor, inv).astype(np.float32)
        smooth = ((old_context / wavelen - low) / (high - low)).astype(np.float32)
        smoothed = ((1 - smooth) * scaled / factor + smooth * scaled).astype(np.float32)
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, scaled).astype(np.float32)


__all__ = ["LlamaConfig", "LLAMA_PRESETS"]
