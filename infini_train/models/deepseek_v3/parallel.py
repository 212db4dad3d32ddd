"""DeepSeek-V3 under tensor parallelism (Megatron-LM's layout for multi-head latent attention).

``parallelize_deepseek_v3(model, group)`` turns a whole DeepseekV3 into this rank's part, in place: the heads are
split -- q_proj (or, on the low-rank path, q_b_proj) and kv_b_proj column-parallel (each rank keeps n_heads / N
heads' queries, k_nope and values), o_proj row-parallel -- while the shared down-projections (q_a_proj,
kv_a_proj_with_mqa) and their norms stay whole on every rank: their outputs feed every head. Their gradients are the
one process's on every rank: the column-parallel layers sum their input gradients over the group, and the shared
rope key passes through ``copy_to_tensor_parallel_region`` (model.py) for the same reason. The dense MLPs split as
LLaMA's (gate_proj / up_proj column-, down_proj row-parallel); the DeepSeek-MoE layers stay whole on every rank (the
same tokens, the same gradients); the embedding and output layer are vocab-parallel.

With sequence parallelism each rank runs the shared down-projections, their norms, the block norms and the MoE layers
on its slice of the sequence (their weights marked ``sequence_parallel``: gradients summed over the group); q_b_proj
(or q_proj) and kv_b_proj all-gather the sequence before their heads (reduce-scattering the gradient back), and so
does the shared rope key (model.py), and o_proj reduce-scatters its output (the sequence-wise balance loss pools the
slices' routing: moe_lm.py)."""
from __future__ import annotations

from ...autograd.grad_mode import no_grad
from ...nn.moe import MoE
from ...nn.parallel import ColumnParallelLinear, RowParallelLinear, mark_sequence_parallel
from ..llama.parallel import split_vocabulary
from ..registry import spec_of
from ..tensor_parallel_lm import tensor_parallel_for


def parallelize_deepseek_v3(model, group, sequence_parallel=False):
    """Split ``model`` (a whole DeepseekV3) over the tensor-parallel ``group`` in place; returns the model."""
    tp = tensor_parallel_for(group, sequence_parallel, spec_of(model).head_counts(model.config))
    if tp is None:
        return model
    sp = tp.sequence_parallel
    with no_grad():
        mtp = list(model._modules.get("mtp") or [])  # the multi-token prediction modules' blocks split alike
        for block in [*model.model.layers, *mtp]:
            attn, mlp = block.self_attn, block.mlp
            for name in ("q_proj", "q_b_proj", "kv_b_proj"):
                if name in attn._modules:
                    setattr(attn, name, ColumnParallelLinear.from_linear(getattr(attn, name), group,
                                                                         sequence_parallel=sp))
            attn.o_proj = RowParallelLinear.from_linear(attn.o_proj, group, sequence_parallel=sp)
            attn.tp = tp
            if isinstance(mlp, MoE):  # whole on every rank: the same tokens, or (sp) its slice of the sequence
                if sp:
                    mark_sequence_parallel(mlp)
            else:
                mlp.gate_proj = ColumnParallelLinear.from_linear(mlp.gate_proj, group, sequence_parallel=sp)
                mlp.up_proj = ColumnParallelLinear.from_linear(mlp.up_proj, group, sequence_parallel=sp)
                mlp.down_proj = RowParallelLinear.from_linear(mlp.down_proj, group, sequence_parallel=sp)
            if sp:  # whole on every rank, each running its slice of the sequence: gradients summed over the group
                shared = [attn._modules[n] for n in ("q_a_proj", "q_a_layernorm", "kv_a_proj_with_mqa",
                                                     "kv_a_layernorm") if n in attn._modules]
                for module in shared + [block.input_layernorm, block.post_attention_layernorm]:
                    mark_sequence_parallel(module)
        split_vocabulary(model, group, sp)
        if mtp:
            from .mtp import parallelize_mtp
            parallelize_mtp(model, sp)
    model.tp = tp
    return model


__all__ = ["parallelize_deepseek_v3"]
