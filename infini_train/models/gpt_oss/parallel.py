"""gpt-oss under tensor parallelism: LLaMA's layout (llama/parallel.py) for the attention, the embedding and the
output layer -- q_proj, k_proj, v_proj column-parallel with their biases (each rank keeps n_heads / N query heads and
n_kv_heads / N key/value heads), o_proj row-parallel (its bias added once) -- plus each rank's slice of the attention
``sinks`` (one per query head, so they split as the heads do). The mixture of experts stays whole on every rank, as
the norms do: without sequence parallelism each rank routes the same tokens (the same gradients everywhere), with it
its slice of the sequence (the experts' and router's weights marked ``sequence_parallel``: their gradients are
summed over the group)."""
from __future__ import annotations

from ...autograd.grad_mode import no_grad
from ...nn.parallel import ColumnParallelLinear, RowParallelLinear, ShardSpec, mark_sequence_parallel
from ...nn.parallel.tensor_parallel import shard_parameter
from ..llama.parallel import split_vocabulary
from ..registry import spec_of
from ..tensor_parallel_lm import tensor_parallel_for


def parallelize_gpt_oss(model, group, sequence_parallel=False):
    """Split ``model`` (a whole GptOss) over the tensor-parallel ``group`` in place; returns the model."""
    tp = tensor_parallel_for(group, sequence_parallel, spec_of(model).head_counts(model.config))
    if tp is None:
        return model
    cfg, size, sp = model.config, group.size, tp.sequence_parallel
    with no_grad():
        for block in model.model.layers:
            attn = block.self_attn
            for name in ("q_proj", "k_proj", "v_proj"):
                setattr(attn, name, ColumnParallelLinear.from_linear(getattr(attn, name), group,
                                                                     sequence_parallel=sp))
            attn.o_proj = RowParallelLinear.from_linear(attn.o_proj, group, sequence_parallel=sp)
            attn.sinks = shard_parameter(attn.sinks, ShardSpec(0), group)
            attn.n_heads, attn.n_kv_heads = cfg.n_heads // size, cfg.n_kv_heads // size
            attn.tp = tp
            if sp:
                for module in (block.mlp, block.input_layernorm, block.post_attention_layernorm):
                    mark_sequence_parallel(module)
        split_vocabulary(model, group, sp)
    model.tp = tp
    return model


__all__ = ["parallelize_gpt_oss"]
