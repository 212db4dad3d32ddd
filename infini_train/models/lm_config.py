"""The interface every causal LM's config offers to the code that is not the model's own."""
from __future__ import annotations


class LMConfig:
    """The names every causal LM's config answers to, whatever its own fields are called: ``num_layers``,
    ``num_heads``, ``num_kv_heads``, ``head_dim``, ``hidden_size``, ``context_length`` (the longest sequence) and
    ``vocab_size``. The shell, the KV cache, the pipeline split and the run read only these."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    context_length: int
    vocab_size: int


__all__ = ["LMConfig"]
