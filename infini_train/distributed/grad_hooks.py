"""Gradient hooks that communicate: AllReducePostAccumulateHook all-reduces a parameter's gradient across a process
group as soon as backward has accumulated it (the simplest data parallelism; DDP buckets and overlaps instead).
``globally_unused`` agrees over a group on the parameters no rank got a gradient for (DDP's and ZeRO's
find_unused_parameters)."""
from __future__ import annotations

import numpy as np

from ..autograd.accumulate import PostAccumulateGradHook
from ..tensor import Tensor


class AllReducePostAccumulateHook(PostAccumulateGradHook):
    """All-reduces a parameter's gradient across ``process_group`` (default: the world) with ``reduce_op``."""

    def __init__(self, reduce_op, process_group=None):
        self.reduce_op = reduce_op
        self.process_group = process_group

    def __call__(self, tensor):
        group = self.process_group
        if group is None:
            from . import default_group
            group = default_group()
        group.all_reduce(tensor.grad, self.reduce_op)


def globally_unused(used, group, *more_groups):
    """The indices of ``used`` (one flag per parameter, in the same order on every rank of ``group``) that no rank of
    ``group`` set: one all-reduce of the flags, as torch's reducer agrees on unused parameters; ``more_groups``:
    further groups whose ranks hold the same parameters and must agree too (one all-reduce each)."""
    if not len(used):
        return []
    flags = Tensor(np.array(used, np.int64))
    for g in (group, *more_groups):
        if g is not None and g.size > 1:
            g.all_reduce(flags, "sum")
    return [k for k, count in enumerate(flags.numpy()) if count == 0]


__all__ = ["AllReducePostAccumulateHook", "globally_unused"]
