"""NumPy reference of the fused classifier (kernels/classifier.py): each of a row's 256 threads keeps its running
(max, sum of exponentials) over its columns t, t + 256, ... in order; the pairs merge by the warp's butterfly, then
over the 8 warps; loss = (m - x[target]) + log s; backward exp(x - m) * (scale / s) - onehot * scale. Every operation
is the kernel's float32 one in its order; what the reference cannot pin down is expf / logf (CUDA's are within 2
ulps of the exact values, NumPy's float32 ones may differ from them by an ulp)."""
from __future__ import annotations

import numpy as np

from ..classifier import THREADS
from .common import F32

_NEG_INF = F32(-np.inf)


def _merge(m, s, m2, s2):
    top = np.maximum(m, m2)
    with np.errstate(invalid="ignore", over="ignore"):
        s = np.where(top == _NEG_INF, F32(0), s * np.exp(m - top) + s2 * np.exp(m2 - top))
    return top, s


def _warp_merge(m, s):
    """Every lane's pair after the butterfly (16, 8, 4, 2, 1) over the last axis (32 lanes)."""
    index = np.arange(32)
    for mask in (16, 8, 4, 2, 1):
        m, s = _merge(m, s, m[..., index ^ mask], s[..., index ^ mask])
    return m, s


def forward(x, targets, ignore_index=-100):
    """(losses, row_max, row_sum), float32 (rows,), of (rows, classes) logits and (rows,) targets."""
    rows, classes = x.shape
    xf = x.astype(F32)
    m = np.full((rows, THREADS), _NEG_INF)
    s = np.zeros((rows, THREADS), F32)
    with np.errstate(invalid="ignore", over="ignore"):
        for start in range(0, classes, THREADS):
            cols = start + np.arange(THREADS)
            live = cols < classes
            v = xf[:, np.minimum(cols, classes - 1)]
            greater = live & (v > m)
            other = live & ~greater & (v != _NEG_INF)
            s = np.where(greater, s * np.exp(m - v) + F32(1), np.where(other, s + np.exp(v - m), s))
            m = np.where(greater, v, m)
    m, s = _warp_merge(m.reshape(rows, -1, 32), s.reshape(rows, -1, 32))
    warps = m.shape[1]
    lane_m = np.full((rows, 32), _NEG_INF)
    lane_s = np.zeros((rows, 32), F32)
    lane_m[:, :warps], lane_s[:, :warps] = m[:, :, 0], s[:, :, 0]
    m, s = _warp_merge(lane_m, lane_s)
    m, s = m[:, 0], s[:, 0]
    target_logit = xf[np.arange(rows), np.where(targets == ignore_index, 0, targets)]
    return np.where(targets == ignore_index, F32(0), (m - target_logit) + np.log(s)), m, s


def backward(x, targets, row_max, row_sum, scale):
    """exp(x - row_max) * (scale / row_sum) - onehot(targets) * scale, in x's dtype."""
    scale = scale.astype(F32)
    d = np.exp(x.astype(F32) - row_max[:, None]) * (scale / row_sum)[:, None]
    onehot = np.arange(x.shape[1])[None, :] == targets[:, None]
    return np.where(onehot, d - scale[:, None], d).astype(x.dtype)
