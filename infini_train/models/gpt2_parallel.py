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

import contextlib

from ..autograd.grad_mode import no_grad
from ..nn import functional as F
from ..nn.module import Module
from ..nn.parallel import (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding,
                           copy_to_tensor_parallel_region, gather_from_sequence_parallel_region,
                           gather_from_tensor_parallel_region, mark_sequence_parallel,
                           scatter_to_sequence_parallel_region, vocab_parallel_cross_entropy)


class TensorParallelError(ValueError):
    """A model shape that does not split over the tensor group: names the numbers and a hint."""


class TensorParallel:
    """The tensor group a model is split over, and the model-level steps that need it."""

    def __init__(self, group, sequence_parallel=False):
        self.group = group
        self.size, self.rank = group.size, group.rank
        self.sequence_parallel = bool(sequence_parallel)

    def scatter_sequence(self, x):
        return scatter_to_sequence_parallel_region(x, self.group, dim=1)

    def logits_and_loss(self, logits, targets, vocab_size):
        """Training (``targets`` given): this rank's logits and the mean cross-entropy over the whole vocabulary.
        Inference: the whole logits, gathered over the group, without the vocabulary padding."""
        if targets is None:
            full = gather_from_tensor_parallel_region(logits, self.group)
            return full[..., :vocab_size], None
        flat_targets = targets.view(-1)
        losses = vocab_parallel_cross_entropy(logits.view(-1, logits.shape[-1]), flat_targets, self.group,
                                              vocab_size, ignore_index=-1)
        counted = max(int((flat_targets.numpy() != -1).sum()), 1)
        return logits, losses.sum() / counted


class VocabParallelHead(Module):
    """The output layer tied to a VocabParallelEmbedding: the logits of this rank's vocabulary rows (its columns
    of the whole logits, padding included). The input is the whole sequence (copied in: its gradient is summed
    over the group) or, under sequence parallelism, this rank's slice (all-gathered first)."""

    def __init__(self, weight, group, sequence_parallel=False):
        super().__init__()
        self.weight = weight  # the embedding's Parameter (tied: one gradient, one optimizer entry), or its copy
        self.group, self.sequence_parallel = group, sequence_parallel

    def forward(self, x):
        if self.sequence_parallel:
            x = gather_from_sequence_parallel_region(x, self.group, 1)
        else:
            x = copy_to_tensor_parallel_region(x, self.group)
        return F.linear(x, self.weight)


def parallelize_gpt2(model, group, sequence_parallel=False):
    """Split ``model`` (a whole GPT2) over the tensor-parallel ``group`` in place; returns the model."""
    cfg = model.config
    size = group.size
    if sequence_parallel and size == 1:
        raise TensorParallelError("parallel.sequence: expected parallel.tensor > 1 (sequence parallelism splits the "
                                  "sequence over the tensor group), got parallel.tensor = 1")
    if cfg.n_head % size:
        raise TensorParallelError(
            f"model.n_head: expected a multiple of parallel.tensor = {size} (each rank takes n_head / tensor heads), "
            f"got n_head = {cfg.n_head}\nHINT: choose parallel.tensor among the divisors of {cfg.n_head}")
    if size == 1:
        return model
    tp = TensorParallel(group, sequence_parallel)
    sp = tp.sequence_parallel
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


@contextlib.contextmanager
def without_sequence_parallel(model):
    """Run ``model`` with whole sequences on every rank of its tensor group (generation: one new token at a time
    does not split); the weights are the same, so are the outputs. A no-op without sequence parallelism."""
    tp = getattr(model, "tp", None)
    if tp is None or not tp.sequence_parallel:
        yield model
        return
    layers = [m for m in model.modules() if isinstance(m, (ColumnParallelLinear, RowParallelLinear,
                                                          VocabParallelHead))]
    tp.sequence_parallel = False
    for layer in layers:
        layer.sequence_parallel = False
    try:
        yield model
    finally:
        tp.sequence_parallel = True
        for layer in layers:
            layer.sequence_parallel = True


__all__ = ["TensorParallel", "TensorParallelError", "VocabParallelHead", "parallelize_gpt2",
           "without_sequence_parallel"]
