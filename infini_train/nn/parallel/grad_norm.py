"""Gradient clipping of a tensor-parallel model by the norm of the whole model's gradient.

A sharded parameter (``tp_spec`` set) holds a different part of the gradient on each rank of the tensor group;
a replicated one holds the same gradient on every rank (after ``all_reduce_sequence_parallel_grads`` for those
marked ``sequence_parallel``). The global norm counts every shard once and every replicated gradient once (on
tensor rank 0), then sums over the group, as Megatron-LM's clip_grad_norm does.
"""
from __future__ import annotations

import math

import numpy as np

from ...autograd.grad_mode import no_grad
from ...distributed import ReduceOp
from ...tensor import Tensor
from ..utils import clip_grads_with_norm_, get_total_norm


def counts_in_norm(param, group):
    """Whether this rank counts ``param``'s gradient in the global norm: its shard, or a replicated tensor on
    tensor rank 0 only."""
    return getattr(param, "tp_spec", None) is not None or group.rank == 0


@no_grad()
def clip_grad_norm_tensor_parallel_(parameters, max_norm, group, norm_type=2.0):
    """``clip_grad_norm_`` for parameters split over the tensor-parallel ``group``: the same total norm (the whole
    model's, returned as a 0-d Tensor) and the same scaling on every rank. In a group of one it is exactly
    ``clip_grad_norm_``."""
    params = [p for p in parameters if p.grad is not None]
    norm_type = float(norm_type)
    local = get_total_norm([p.grad for p in params if counts_in_norm(p, group)], norm_type)
    total = local
    if group.size > 1:
        value = float(local.item())
        if norm_type == math.inf:
            reduced = np.array([value], np.float64)
            group.all_reduce(reduced, ReduceOp.MAX)
            whole = reduced[0]
        else:
            reduced = np.array([value ** norm_type], np.float64)
            group.all_reduce(reduced, ReduceOp.SUM)
            whole = reduced[0] ** (1.0 / norm_type)
        with local.device.context():
            total = Tensor._make(local.device.array_module().asarray(whole, dtype=local.dtype), local.device)
    clip_grads_with_norm_(params, max_norm, total)
    return total


__all__ = ["clip_grad_norm_tensor_parallel_", "counts_in_norm"]
