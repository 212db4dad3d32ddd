"""GPT-2 under tensor parallelism (Megatron-LM's layout), optionally with sequence parallelism.

``parallelize_gpt2(model, group, sequence_parallel)`` turns a whole GPT2 (built and initialised as in one process,
so every layout starts from the same weights) into this rank's part, in place:

- attention: c_attn column-parallel with q|k|v as three blocks (each rank keeps its heads' rows of each), the
  heads split across the group; c_proj row-parallel (its output all-reduced);
- MLP: c_fc column-parallel, c_proj row-parallel;
- the tied wte / lm_head: a vocab-parallel embedding whose rows are also the column-parallel output layer, the
  vocabulary padded to a multiple of the group size; the loss is vocab_parallel_cross_entropy, which never
  forms the whole logits on one rank, and the padded columns never enter it.

With ``sequence_parallel`` the residual stream between blocks holds each rank's slice of the sequence: layer
norms and dropout run on slices, the column-parallel layers all-gather the sequence and the row-parallel ones
reduce-scatter it. Parameters that stay whole but see only a slice (the layer norms, the row-parallel biases) are
marked ``sequence_parallel`` and their gradients are summed over the group after backward.

Dropout: the default random stream is the same on every rank of the group (masks of whole tensors agree); the
``sharded_random`` stream, seeded per rank, draws masks of sharded activations (attention probabilities of the
local heads; with sequence parallelism the residual-stream dropouts too).
"""
from __future__ import annotations

from ...autograd.grad_mode import no_grad
from ...nn.parallel import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding, mark_sequence_parallel
from ..registry import spec_of
from ..tensor_parallel_lm import (TensorParallel, TensorParallelError, VocabParallelHead,  # noqa: F401 (re-exported)
                                 tensor_parallel_for, without_sequence_parallel)


def parallelize_gpt2(model, group, sequence_parallel=False):
    """Split ``model`` (a whole GPT2) over the tensor-parallel ``group`` in place; returns the model."""
    tp = tensor_parallel_for(group, sequence_parallel, spec_of(model).head_counts(model.config))
    if tp is None:
        return model
    cfg, size, sp = model.config, group.size, tp.sequence_parallel
    with no_grad():
        for block in model.transformer.h:
            attn, mlp = block.attn, block.mlp
            attn.c_attn = ColumnParallelLinear.from_linear(attn.c_attn, group, blocks=3, sequence_parallel=sp)
            attn.c_proj = RowParallelLinear.from_linear(attn.c_proj, group, sequence_parallel=sp)
            attn.n_head = cfg.n_head // size
            attn.tp = tp
            mlp.c_fc = ColumnParallelLinear.from_linear(mlp.c_fc, group, sequence_parallel=sp)
            mlp.c_proj = RowParallelLinear.from_linear(mlp.c_proj, group, sequence_parallel=sp)
            mlp.tp = tp
            if sp:
                for norm in (block.ln_1, block.ln_2):
                    mark_sequence_parallel(norm)
        wte = VocabParallelEmbedding.from_embedding(model.transformer.wte, group)
        model.transformer.wte = wte
        model.lm_head = VocabParallelHead(wte.weight, group, sp)
        if sp:
            mark_sequence_parallel(model.transformer.ln_f)
    model.tp = tp
    return model


__all__ = ["TensorParallel", "TensorParallelError", "VocabParallelHead", "parallelize_gpt2",
           "without_sequence_parallel"]
