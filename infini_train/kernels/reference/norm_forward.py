"""NumPy reference of the layer norm forward kernel (kernels/norm_forward.py), bit for bit: lane l of a row's warp
adds the values of the row's 16-byte vectors l, l + 32, ... in order, the warp's butterfly adds the lanes; the mean,
the squared deviations, 1 / sqrt(var + eps) and (x - mean) * rstd * weight + bias are the kernel's float32 operations
(sqrt and division are correctly rounded on both sides)."""
from __future__ import annotations

import numpy as np

from ..norm_forward import vector
from .common import F32, butterfly_sum


def _lane_sums(values, vec):
    """Each lane's float32 sum of (rows, size) values, in the kernel's order: (rows, 32)."""
    rows, size = values.shape
    vectors = values.reshape(rows, size // vec, vec)
    lanes = np.zeros((rows, 32), F32)
    for start in range(0, vectors.shape[1], 32):
        chunk = vectors[:, start:start + 32]
        live = chunk.shape[1]
        for e in range(vec):
            lanes[:, :live] = lanes[:, :live] + chunk[:, :, e]
    return lanes


def layer_norm(x, weight, bias, size, eps, residual=None):
    """(out, mean, rstd) as the kernel writes them (mean and rstd float32 (rows, 1)); with a residual
    (x + residual, out, mean, rstd)."""
    dtype, vec = x.dtype, vector(x.dtype)
    rows = x.size // size
    values = x.reshape(rows, size)
    total = None
    if residual is not None:
        total = (values.astype(F32) + residual.reshape(rows, size).astype(F32)).astype(dtype)
        values = total
    values = values.astype(F32)
    mean = butterfly_sum(_lane_sums(values, vec)) / F32(size)
    deviations = values - mean[:, None]
    rstd = F32(1) / np.sqrt(butterfly_sum(_lane_sums(deviations * deviations, vec)) / F32(size) + F32(eps))
    y = deviations * rstd[:, None]
    if weight is not None:
        y = y * weight.astype(F32)
    if bias is not None:
        y = y + bias.astype(F32)
    out = y.astype(dtype).reshape(x.shape)
    stats = mean.reshape(rows, 1), rstd.reshape(rows, 1)
    return (out, *stats) if total is None else (total.reshape(x.shape), out, *stats)
