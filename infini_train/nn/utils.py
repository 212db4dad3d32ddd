"""Gradient utilities: get_total_norm, clip_grad_norm_, clip_grads_with_norm_, clip_grad_value_."""
from __future__ import annotations

import math

from .. import backend
from ..autograd.grad_mode import no_grad
from ..tensor import Tensor


def _as_list(parameters):
    return [parameters] if isinstance(parameters, Tensor) else list(parameters)


def _at_least_float32(array):
    return array if array.dtype in (backend.float32, backend.float64) else array.astype(backend.float32)


def _device_norm(xp, arrays, norm_type):
    """The norm of the concatenation of ``arrays`` (all on one device) as a Python float; one host sync."""
    if math.isinf(norm_type):
        peaks = [xp.maximum(a.max(), -a.min()) for a in arrays if a.size]
        return float(xp.stack(peaks).max()) if peaks else 0.0
    if norm_type == 2.0:  # BLAS dot products: no temporaries, float32 accumulation at least
        partials = [xp.vdot(a.ravel(), a.ravel()) for a in (_at_least_float32(a) for a in arrays)]
    else:
        partials = [(xp.abs(_at_least_float32(a)) ** norm_type).sum() for a in arrays]
    return float(xp.stack(partials).astype(backend.float64).sum()) if partials else 0.0


def get_total_norm(tensors, norm_type=2.0):
    """The ``norm_type`` norm of all the given tensors together, as a Python float (inf: max |x|)."""
    norm_type = float(norm_type)
    if norm_type <= 0 and not math.isinf(norm_type):
        raise ValueError(f"get_total_norm: norm_type must be positive or inf, got {norm_type}")
    by_device = {}
    for t in tensors:
        by_device.setdefault(t.device, []).append(t.array)
    parts = []
    for dev, arrays in by_device.items():
        with dev.context():
            parts.append(_device_norm(dev.array_module(), arrays, norm_type))
    if math.isinf(norm_type):
        return max(parts, default=0.0)
    if norm_type == 2.0:
        return math.sqrt(sum(parts))
    return sum(parts) ** (1.0 / norm_type)


@no_grad()
def clip_grads_with_norm_(parameters, max_norm, total_norm):
    """Scale the gradients in place by max_norm / (total_norm + 1e-6) when that is below 1."""
    coef = float(max_norm) / (float(total_norm) + 1e-6)
    if coef < 1.0:
        for p in _as_list(parameters):
            if p.grad is not None:
                p.grad.mul_(coef)


@no_grad()
def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False):
    """Scale gradients in place so their global ``norm_type`` norm is at most ``max_norm`` (torch's rule:
    multiply by max_norm / (norm + 1e-6) when that is below 1). Parameters without a grad are skipped.

    Returns the total norm before clipping as a 0-d Tensor (float32, float64 if a gradient is) on the first
    gradient's device.
    ``max_norm=float("inf")`` only measures."""
    params = _as_list(parameters)
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return Tensor._make(backend.CPU.xp.zeros((), backend.float32), backend.CPU)
    total = get_total_norm(grads, norm_type)
    if error_if_nonfinite and not math.isfinite(total):
        raise RuntimeError(f"clip_grad_norm_: the total norm of order {norm_type} of the gradients is {total}\n"
                           "HINT: a loss or gradient overflowed; pass error_if_nonfinite=False to clip anyway")
    clip_grads_with_norm_(params, max_norm, total)
    dev = grads[0].device
    dtype = backend.float64 if any(g.dtype == backend.float64 for g in grads) else backend.float32
    with dev.context():
        return Tensor._make(dev.array_module().asarray(total, dtype=dtype), dev)


@no_grad()
def clip_grad_value_(parameters, clip_value):
    """Clamp every gradient element into [-clip_value, clip_value], in place."""
    clip_value = float(clip_value)
    for p in _as_list(parameters):
        if p.grad is not None:
            p.grad.clamp_(-clip_value, clip_value)


__all__ = ["get_total_norm", "clip_grad_norm_", "clip_grads_with_norm_", "clip_grad_value_"]


def zero_grad(parameters, set_to_none=True):
    """Drop (or zero in place) the gradients of ``parameters``; Module and Optimizer zero_grad use this."""
    for p in parameters:
        if p.grad is None:
            continue
        if set_to_none:
            p.grad = None
        else:
            p.grad.array.fill(0)
