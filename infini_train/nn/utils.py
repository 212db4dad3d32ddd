"""Gradient utilities, torch.nn.utils' arithmetic: get_total_norm, clip_grad_norm_, clip_grads_with_norm_,
clip_grad_value_; and zero_grad, shared by Module and Optimizer."""
from __future__ import annotations

import math
import types
import warnings

import numpy as np

from .. import backend
from ..autograd.grad_mode import no_grad
from ..tensor import Tensor


def _as_list(parameters):
    return [parameters] if isinstance(parameters, Tensor) else list(parameters)


def _opmath(dtype):
    """The dtype arithmetic on ``dtype`` runs in: float32 for float16 and bfloat16 (as torch), else ``dtype``."""
    return backend.float32 if dtype.itemsize < 4 else dtype


def _norm(xp, array, norm_type):
    """torch.linalg.vector_norm of one array: a 0-d array of its dtype, accumulated in float32 at least."""
    a = array if _opmath(array.dtype) == array.dtype else array.astype(_opmath(array.dtype))
    if not a.size:
        value = a.dtype.type(0)
    elif norm_type == math.inf:
        value = xp.maximum(a.max(), -a.min())  # max |x| without an |x| temporary; nan propagates
    elif norm_type == -math.inf:
        value = xp.abs(a).min()
    elif norm_type == 0:
        value = xp.count_nonzero(a)
    elif norm_type == 2.0:  # a BLAS dot product: no temporary
        flat = a.ravel()
        value = xp.sqrt(xp.vdot(flat, flat))
    else:
        value = (xp.abs(a) ** norm_type).sum() ** (1.0 / norm_type)
    return xp.asarray(value).astype(array.dtype)


def _common_dtype(dtypes):
    """torch's promotion of the per-gradient norms (float16 with bfloat16 gives float32)."""
    dtypes = set(dtypes)
    if len(dtypes) == 1:
        return dtypes.pop()
    try:
        return np.result_type(*dtypes)
    except TypeError:  # numpy has no common type for float16 and bfloat16
        return np.result_type(backend.float32, *(d for d in dtypes if d.itemsize >= 4))


@no_grad()
def get_total_norm(tensors, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """The ``norm_type`` norm of all ``tensors`` together (torch's: the norm of their per-tensor norms), as a 0-d
    Tensor on the first tensor's device in their common dtype. ``norm_type`` may be inf, -inf, 0 or any p.
    ``foreach`` is accepted for torch compatibility: one implementation serves every device."""
    tensors = _as_list(tensors)
    norm_type = float(norm_type)
    if not tensors:
        return Tensor._make(np.zeros((), backend.float32), backend.CPU)
    first = tensors[0].device
    with np.errstate(all="ignore"):  # inf and nan gradients give inf and nan norms, as in torch
        norms = []
        for t in tensors:
            with t.device.context():
                norms.append(_norm(t.device.array_module(), t.array, norm_type))
        dtype = _common_dtype(n.dtype for n in norms)
        xp = first.array_module()
        with first.context():
            stacked = xp.stack([backend.to_device_array(n, first).astype(dtype) for n in norms])
            total = _norm(xp, stacked, norm_type)
    if error_if_nonfinite and not bool(xp.isfinite(total.astype(_opmath(dtype)))):
        raise RuntimeError(f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, so it "
                           "cannot be clipped. To disable this error and scale the gradients by the non-finite norm "
                           "anyway, set `error_if_nonfinite=False`\nHINT: a loss or gradient overflowed or is nan; "
                           "check the loss scale and learning rate")
    return Tensor._make(total, first)


@no_grad()
def clip_grads_with_norm_(parameters, max_norm, total_norm, foreach=None):
    """Scale the gradients in place by min(max_norm / (total_norm + 1e-6), 1), computed in the total norm's
    dtype as torch does, so an inf norm turns gradients into 0 (nan where they were inf) and a nan norm into nan.
    ``total_norm`` is the Tensor ``get_total_norm`` returns (or a number)."""
    grads = [p.grad for p in _as_list(parameters) if p.grad is not None]
    if not grads:
        return
    if isinstance(total_norm, Tensor):
        total, dev = total_norm.array, total_norm.device
    else:
        total, dev = np.asarray(float(total_norm)), backend.CPU
    op = _opmath(total.dtype)
    xp = dev.array_module()
    with np.errstate(all="ignore"), dev.context():
        denom = (total.astype(op) + op.type(1e-6)).astype(total.dtype)
        coef = (op.type(float(max_norm)) / denom.astype(op)).astype(total.dtype)
        coef = xp.minimum(coef, coef.dtype.type(1.0))  # nan stays nan, as torch.clamp
        for g in grads:
            with g.device.context():
                g.device.array_module().multiply(g.array, backend.to_device_array(coef, g.device), out=g.array,
                                                 casting="unsafe")
            g._version[0] += 1


@no_grad()
def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """Scale gradients in place so their global ``norm_type`` norm is at most ``max_norm``; torch's rule and
    arithmetic: ``get_total_norm`` then ``clip_grads_with_norm_``. Parameters without a grad are skipped.

    Returns the total norm before clipping as a 0-d Tensor on the first gradient's device, in the gradients'
    common dtype. A non-finite norm raises RuntimeError with ``error_if_nonfinite=True``; otherwise the gradients
    are scaled by it anyway (zeros and nans, exactly as torch). ``max_norm=float("inf")`` only measures finite
    norms."""
    if isinstance(parameters, types.GeneratorType):
        parameters = list(parameters)
        if not parameters:
            warnings.warn("`parameters` is an empty generator, no gradient clipping will occur.", stacklevel=3)
    params = _as_list(parameters)
    grads = [p.grad for p in params if p.grad is not None]
    total = get_total_norm(grads, norm_type, error_if_nonfinite, foreach)
    clip_grads_with_norm_(params, max_norm, total, foreach)
    return total


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
