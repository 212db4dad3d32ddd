"""LLaMA under tensor parallelism (Megatron-LM's layout), optionally with sequence parallelism.

``parallelize_llama(model, group, sequence_parallel)`` turns a whole Llama (built and initialised as in one process)
into this rank's part, in place: q_proj, k_proj and v_proj column-parallel (each rank keeps n_heads / N query heads
and n_kv_heads / N key/value heads, so grouped-query attention stays within a rank), o_proj row-parallel; gate_proj
and up_proj column-parallel, down_proj row-parallel; the token embedding vocab-parallel, and the output layer over
the same vocabulary rows (tied: the embedding's Parameter; untied: its own shards). The loss is the vocab-parallel
cross-entropy. With ``sequence_parallel`` the RMSNorms run on slices of the sequence (their weights marked
``sequence_parallel``). A mixture of experts (Qwen3-MoE, Mixtral) stays whole on every rank, as the norms do:
without sequence parallelism each rank runs it on the same tokens (its gradients are the same everywhere), with it on
its slice of the sequence (its weights marked ``sequence_parallel``: their gradients are summed over the group). See
gpt2/parallel.py for the GPT-2 counterpart and the dropout streams.
"""
from __future__ import annotations

from ...autograd.grad_mode import no_grad
from ...nn.moe import MoE
from ...nn.parallel import (ColumnParallelLinear, RowParallelLinear, ShardSpec, VocabParallelEmbedding,
                           mark_sequence_parallel)
from ...nn.parallel.tensor_parallel import shard_parameter
from ..registry import spec_of
from ..tensor_parallel_lm import VocabParallelHead, tensor_parallel_for


def parallelize_llama(model, group, sequence_parallel=False):
    """Split ``model`` (a whole Llama) over the tensor-parallel ``group`` in place; returns the model."""
    tp = tensor_parallel_for(group, sequence_parallel, spec_of(model).head_counts(model.config))
    if tp is None:
        return model
    cfg, size, sp = model.config, group.size, tp.sequence_parallel
    with no_grad():
        for block in model.model.layers:
            attn, mlp = block.self_attn, block.mlp
            for name in ("q_proj", "k_proj", "v_proj"):
                setattr(attn, name, ColumnParallelLinear.from_linear(getattr(attn, name), group,
                                                                     sequence_parallel=sp))
            attn.o_proj = RowParallelLinear.from_linear(attn.o_proj, group, sequence_parallel=sp)
            attn.n_heads, attn.n_kv_heads = cfg.n_heads // size, cfg.n_kv_heads // size
            attn.tp = tp
            if isinstance(mlp, MoE):  # whole on every rank: the same tokens, or (sp) its slice of the sequence
                if sp:
                    mark_sequence_parallel(mlp)
            else:
                mlp.gate_proj = ColumnParallelLinear.from_linear(mlp.gate_proj, group, sequence_parallel=sp)
                mlp.up_proj = ColumnParallelLinear.from_linear(mlp.up_proj, group, sequence_parallel=sp)
                mlp.down_proj = RowParallelLinear.from_linear(mlp.down_proj, group, sequence_parallel=sp)
            if sp:
                for norm in (block.input_layernorm, block.post_attention_layernorm):
                    mark_sequence_parallel(norm)
        split_vocabulary(model, group, sp)
    model.tp = tp
    return model


def split_vocabulary(model, group, sequence_parallel):
    """The LLaMA shell's token embedding vocab-parallel and its output layer over the same vocabulary rows (tied: the
    embedding's Parameter; untied: its own rows, split and padded like the embedding's); with sequence parallelism the
    final norm runs on slices of the sequence. Shared by the models built on the shell (gpt-oss, DeepSeek-V3)."""
    untied = None if model.config.tie_word_embeddings else model.lm_head.weight
    embed = VocabParallelEmbedding.from_embedding(model.model.embed_tokens, group)
    model.model.embed_tokens = embed
    head_weight = embed.weight if untied is None else shard_parameter(
        untied, ShardSpec(0, whole_size=model.config.vocab_size), group)
    model.lm_head = VocabParallelHead(head_weight, group, sequence_parallel)
    if sequence_parallel:
        mark_sequence_parallel(model.model.norm)


__all__ = ["parallelize_llama", "split_vocabulary"]
