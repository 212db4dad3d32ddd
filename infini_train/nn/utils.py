"""Gradient utilities: clip_grad_norm_ and clip_grad_value_."""
from __future__ import annotations

import math

from .. import backend
from ..autograd.grad_mode import no_grad
from ..tensor import Tensor


@no_grad()
def clip_grad_norm_(parameters, max_norm, norm_type=2.0):
    """Scale gradients in place so their global norm is at most ``max_norm``; returns the total norm
    (before clipping) as a 0-d float32 tensor."""
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return Tensor._make(backend.CPU.xp.zeros((), "float32"), backend.CPU)
    dev = grads[0].device
    xp = dev.array_module()
    norm_type = float(norm_type)
    if math.isinf(norm_type):
        total = max(float(xp.abs(g.array).max()) for g in grads)
    else:
        acc = 0.0
        for g in grads:
            a = g.array
            # float32 dot products are accumulated in float64 per tensor, then summed on the host
            acc += float(xp.vdot(a.ravel(), a.ravel())) if norm_type == 2.0 else \
                float((xp.abs(a.astype("float64")) ** norm_type).sum())
        total = acc ** (1.0 / norm_type) if norm_type != 2.0 else math.sqrt(acc)
    coef = max_norm / (total + 1e-6)
    if coef < 1.0:
        for g in grads:
            g.mul_(coef)
    return Tensor._make(xp.asarray(total, dtype="float32"), dev)


@no_grad()
def clip_grad_value_(parameters, clip_value):
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    for p in parameters:
        if p.grad is not None:
            p.grad.clamp_(-clip_value, clip_value)
