"""Gradient hooks that communicate: AllReducePostAccumulateHook all-reduces a parameter's gradient across a process
group as soon as backward has accumulated it (the simplest data parallelism; DDP buckets and overlaps instead)."""
from __future__ import annotations

from ..autograd.accumulate import PostAccumulateGradHook


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


__all__ = ["AllReducePostAccumulateHook"]
