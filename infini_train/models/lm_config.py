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


def pipeline_problems(config, pipeline, virtual):
    """The run-config problem, as a one-item list, when ``config``'s blocks do not cut into pipeline x virtual
    equal chunks (empty when they do)."""
    stages = pipeline * virtual
    if stages > 1 and config.num_layers % stages:
        return [f"model.n_layer: expected a multiple of parallel.pipeline x parallel.virtual_pipeline = "
                f"{pipeline} x {virtual} = {stages} (equal model chunks), got {config.num_layers}"]
    return []


__all__ = ["LMConfig", "pipeline_problems"]
