"""GPT2Config: the model's shape, with the presets of OpenAI's GPT-2 and llm.c's depth-named models."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..lm_config import LMConfig

GPT2_PRESETS = {
    # OpenAI GPT-2 checkpoints (Hugging Face names)
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768),
    "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024),
    "gpt2-large": dict(n_layer=36, n_head=20, n_embd=1280),
    "gpt2-xl": dict(n_layer=48, n_head=25, n_embd=1600),
    # llm.c names by depth (same shapes as the four above)
    "d12": dict(n_layer=12, n_head=12, n_embd=768),
    "d24": dict(n_layer=24, n_head=16, n_embd=1024),
    "d36": dict(n_layer=36, n_head=20, n_embd=1280),
    "d48": dict(n_layer=48, n_head=25, n_embd=1600),
}


@dataclass
class GPT2Config(LMConfig):
    block_size: int = 1024
    vocab_size: int = 50257
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True

    def __post_init__(self):
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"GPT2Config.{name}: expected a positive integer, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPT2Config: n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})\n"
                             "HINT: pick n_head among the divisors of n_embd")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPT2Config.dropout: expected a value in [0, 1), got {self.dropout!r}")

    @classmethod
    def presets(cls):
        """{name: fields} of the presets (GPT2_PRESETS)."""
        return GPT2_PRESETS

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "GPT2Config":
        if name not in GPT2_PRESETS:
            import difflib
            close = difflib.get_close_matches(name, GPT2_PRESETS, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(f"GPT2Config.from_preset: unknown preset {name!r}; expected one of "
                             f"{sorted(GPT2_PRESETS)}\nHINT: {hint}or give n_layer/n_head/n_embd explicitly")
        return cls(**{**GPT2_PRESETS[name], **overrides})

    def to_dict(self):
        return dataclasses.asdict(self)

    # the LMConfig names
    head_dim = property(lambda self: self.n_embd // self.n_head)
    hidden_size = property(lambda self: self.n_embd)
    num_layers = property(lambda self: self.n_layer)
    num_heads = num_kv_heads = property(lambda self: self.n_head)
    context_length = property(lambda self: self.block_size)
