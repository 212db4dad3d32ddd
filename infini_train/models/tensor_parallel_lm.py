"""What a language model needs to run split over a tensor-parallel group, whatever its blocks: the group and the
model-level steps (scattering the sequence, the vocab-parallel loss or gathered logits), the output layer tied to
(or copied from) a vocab-parallel embedding, and running with whole sequences for generation."""
from __future__ import annotations

import contextlib

from ..nn import functional as F
from ..nn.module import Module
from ..nn.parallel import (ColumnParallelLinear, RowParallelLinear, copy_to_tensor_parallel_region,
                           gather_from_sequence_parallel_region, gather_from_tensor_parallel_region,
                           scatter_to_sequence_parallel_region, vocab_parallel_cross_entropy)
from .token_loss import tokens_counted


class TensorParallelError(ValueError):
    """A model shape that does not split over the tensor group: names the numbers and a hint."""


def check_split(size, sequence_parallel, heads):
    """Refuse a split the model cannot take: sequence parallelism without a tensor group, or a head count
    (``heads``: {config key: count}) that ``size`` ranks cannot share evenly."""
    if sequence_parallel and size == 1:
        raise TensorParallelError("parallel.sequence: expected parallel.tensor > 1 (sequence parallelism splits the "
                                  "sequence over the tensor group), got parallel.tensor = 1")
    for name, count in heads.items():
        if count % size:
            raise TensorParallelError(
                f"model.{name}: expected a multiple of parallel.tensor = {size} (each rank takes {name} / tensor "
                f"heads), got {name} = {count}\nHINT: choose parallel.tensor among the divisors of {count}")


class TensorParallel:
    """The tensor group a model is split over, and the model-level steps that need it."""

    def __init__(self, group, sequence_parallel=False):
        self.group = group
        self.size, self.rank = group.size, group.rank
        self.sequence_parallel = bool(sequence_parallel)

    def scatter_sequence(self, x):
        return scatter_to_sequence_parallel_region(x, self.group, dim=1)

    def logits_and_loss(self, logits, targets, vocab_size):
        """Training (``targets`` given): this rank's logits and the cross-entropy over the whole vocabulary (the mean
        over the trained tokens, or their sum over token_loss.loss_over_tokens' count).
        Inference: the whole logits, gathered over the group, without the vocabulary padding."""
        if targets is None:
            full = gather_from_tensor_parallel_region(logits, self.group)
            return full[..., :vocab_size], None
        flat_targets = targets.view(-1)
        losses = vocab_parallel_cross_entropy(logits.view(-1, logits.shape[-1]), flat_targets, self.group,
                                              vocab_size, ignore_index=-1)
        count = tokens_counted()
        if count is None:
            count = max(int((flat_targets.numpy() != -1).sum()), 1)
        return logits, losses.sum() / count


def tensor_parallel_for(group, sequence_parallel, heads):
    """The TensorParallel a model's tensor plan splits it with over ``group``, after refusing a split its ``heads``
    ({config key: count}) cannot take (check_split); None for a group of one (nothing to split)."""
    check_split(group.size, sequence_parallel, heads)
    return TensorParallel(group, sequence_parallel) if group.size > 1 else None


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


__all__ = ["check_split", "TensorParallel", "TensorParallelError", "VocabParallelHead", "tensor_parallel_for",
           "without_sequence_parallel"]
