"""Gradient clipping of a model split over tensor-parallel ranks and pipeline stages, by the norm of the whole
model's gradient.

A parameter split over the tensor group (its placement's ``tensor_shard``) holds a different part of the gradient on
each rank of the group; a replicated one the same gradient on every rank (after ``all_reduce_sequence_parallel_grads``
for those placed ``sequence_parallel``); the last pipeline stage's copy of a tied weight (``tied_copy``) the same
gradient as the first stage's original. The global norm counts every shard once, every replicated gradient once (on
tensor rank 0) and no copy, then sums over the tensor and pipeline groups, as Megatron-LM's clip_grad_norm does.
"""
from __future__ import annotations

import math

import numpy as np

from ...autograd.grad_mode import no_grad
from ...distributed import ReduceOp
from ...tensor import Tensor
from ..utils import clip_grads_with_norm_, get_total_norm


def counts_in_norm(param, tensor_group=None, expert_group=None):
    """Whether this rank counts ``param``'s gradient in the global norm."""
    placement = param.placement
    if placement.tied_copy:
        return False
    if expert_group is not None and not placement.expert_local and expert_group.rank != 0:
        return False  # replicated over the expert group: counted on its rank 0
    return not placement.replicated or tensor_group is None or tensor_group.rank == 0


@no_grad()
def clip_grad_norm_model_parallel_(parameters, max_norm, tensor_group=None, pipeline_group=None, norm_type=2.0,
                                   expert_group=None):
    """``clip_grad_norm_`` for this rank's parameters of a model split over ``tensor_group`` and/or
    ``pipeline_group`` and/or the experts over ``expert_group`` (parameters marked ``expert_parallel``: each rank holds
    different experts): the same total norm (the whole model's, returned as a 0-d Tensor) and the same scaling on
    every rank. Without groups it is exactly ``clip_grad_norm_``."""
    params = [p for p in parameters if p.grad is not None]
    norm_type = float(norm_type)
    local = get_total_norm([p.grad for p in params if counts_in_norm(p, tensor_group, expert_group)], norm_type)
    total = local
    groups = [g for g in (expert_group, tensor_group, pipeline_group) if g is not None and g.size > 1]
    if groups:
        value = float(local.item())
        inf = norm_type == math.inf
        reduced = np.array([value if inf else value ** norm_type], np.float64)
        for group in groups:
            group.all_reduce(reduced, ReduceOp.MAX if inf else ReduceOp.SUM)
        whole = reduced[0] if inf else reduced[0] ** (1.0 / norm_type)
        with local.device.context():
            total = Tensor._make(local.device.array_module().asarray(whole, dtype=local.dtype), local.device)
    clip_grads_with_norm_(params, max_norm, total)
    return total


__all__ = ["clip_grad_norm_model_parallel_", "counts_in_norm"]
