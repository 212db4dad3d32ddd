"""rms_norm as one fused Op, as torch 2.13's: y = x / sqrt(mean(x^2 over normalized_shape) + eps) * weight.

The statistic and the normalisation run in float32 at least (float16/bfloat16 inputs are widened, as torch's
opmath upcast), the weight multiplies in the promotion of that and its own dtype (a float32 or float64 weight
next to a bfloat16 input is exact there), and the result is rounded once to the input's dtype: torch returns
the input's dtype whatever the weight's. Each gradient has its tensor's dtype. ``eps=None`` is the machine
epsilon of the computation dtype (float32's for float16/bfloat16/float32 inputs, float64's for float64), as in
torch. Forward keeps 1/rms per row; backward rebuilds x-hat from the saved input.
"""
from __future__ import annotations

import math

import numpy as np

from ... import backend
from ...promotion import promote_types
from ..function import Op, op_error
from .low_precision import narrow
from .softmax import row_dot, upcast


def _default_eps(dtype):
    return float(np.finfo(np.float64 if dtype == np.float64 else np.float32).eps)


class RMSNorm(Op):
    def __init__(self, normalized_shape, eps=None):
        self.normalized_shape = normalized_shape
        self.eps = eps

    def _check(self, x, weight):
        ns = self.normalized_shape
        if not backend.is_floating(x.dtype):
            raise op_error("rms_norm", "a floating-point input", f"input of dtype {x.dtype}",
                           "convert it first, e.g. x.float()")
        if weight is not None and tuple(weight.shape) != ns:
            raise op_error("rms_norm", f"weight of shape {ns} (= normalized_shape)",
                           f"weight of shape {tuple(weight.shape)}")
        if len(ns) > x.ndim or x.shape[x.ndim - len(ns):] != ns:
            raise op_error("rms_norm", f"input whose trailing dims are normalized_shape={ns}",
                           f"input of shape {tuple(x.shape)}",
                           "normalized_shape names the last dims of the input, e.g. hidden_size for (B, T, hidden)")

    def _compute_dtype(self, x, weight):
        wide = upcast(x).dtype if x.dtype.itemsize < 4 else x.dtype
        return wide if weight is None else promote_types(wide, weight.dtype)

    def forward(self, x, weight=None):
        self._check(x, weight)
        xp = self.xp
        if x.size == 0:
            self.stash(None)
            return x.copy()
        size = math.prod(self.normalized_shape)
        xw = upcast(x)
        rows = xw.reshape(-1, size)
        eps = _default_eps(xw.dtype) if self.eps is None else self.eps
        rstd = row_dot(xp, rows, rows, 1)
        rstd /= size
        rstd += eps
        xp.sqrt(rstd, out=rstd)
        xp.reciprocal(rstd, out=rstd)
        out = rows * rstd  # x-hat, rounded in the input's opmath dtype as torch rounds it
        if weight is not None:
            dtype = self._compute_dtype(x, weight)
            if dtype != out.dtype:
                out = out.astype(dtype)
            out *= weight.reshape(size).astype(dtype, copy=False)
        self.stash(rstd)
        return narrow(xp, out.reshape(x.shape), x.dtype)

    def setup_context(self, inputs, output):
        weight = inputs[1] if inputs[1] is not None and self.needs_input_grad[0] else None
        self.save_for_backward(inputs[0], weight)

    def backward(self, g):
        xp = self.xp
        x, weight = self.saved_arrays
        (rstd,) = self.stashed
        need_x, need_w = self.needs_input_grad
        shapes, dtypes = self._input_shapes, self._input_dtypes
        if x.size == 0:
            return tuple(xp.zeros(s, d) if n else None for s, d, n in zip(shapes, dtypes, (need_x, need_w)))
        size = math.prod(self.normalized_shape)
        wide = upcast(x).dtype
        dtype = wide if shapes[1] is None else promote_types(wide, dtypes[1])
        g_rows = g.reshape(-1, size).astype(dtype, copy=False)
        xhat = upcast(x).reshape(-1, size) * rstd
        gw = gx = None
        if need_w:  # column sums: einsum beats .sum(axis=0), as in layer_norm
            gw = narrow(xp, xp.einsum("ij,ij->j", g_rows, xhat.astype(dtype, copy=False)).reshape(shapes[1]),
                        dtypes[1])
        if need_x:
            # dx = rstd * (dxhat - xhat * mean(dxhat * xhat)), dxhat = g * weight (rounded to x-hat's dtype)
            dxhat = g_rows * weight.reshape(size).astype(dtype, copy=False) if weight is not None else g_rows
            dxhat = dxhat.astype(wide, copy=False)
            mean_proj = row_dot(xp, dxhat, xhat, 1)
            mean_proj /= size
            xhat *= mean_proj
            gx = xp.subtract(dxhat, xhat, out=xhat)
            gx *= rstd
            gx = narrow(xp, gx.reshape(shapes[0]), dtypes[0])
        return gx, gw

    def backward_graph(self, g):
        x, weight = self.saved_tensors
        need_x, need_w = self.needs_input_grad
        dims = tuple(range(x.ndim - len(self.normalized_shape), x.ndim))
        xw = x.float() if x.dtype.itemsize < 4 else x
        if g.dtype.itemsize < 4:
            g = g.float()
        eps = _default_eps(xw.dtype) if self.eps is None else self.eps
        rstd = ((xw * xw).mean(dim=dims, keepdim=True) + eps).rsqrt()
        xhat = xw * rstd
        gw = None
        if need_w:
            lead = tuple(range(x.ndim - len(self.normalized_shape)))
            gw = (g * xhat).sum(dim=lead) if lead else g * xhat
        gx = None
        if need_x:
            dxhat = g * weight if weight is not None else g
            gx = rstd * (dxhat - xhat * (dxhat * xhat).mean(dim=dims, keepdim=True))
        return gx, gw


def rms_norm(x, normalized_shape, weight=None, eps=None):
    """Divide by the root mean square over the trailing ``normalized_shape`` dims (an int or a tuple), then
    scale by ``weight`` (of shape ``normalized_shape``, or None). ``eps=None`` is the float32 machine epsilon
    (float64's for a float64 input), as torch.nn.functional.rms_norm."""
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    normalized_shape = tuple(int(n) for n in normalized_shape)
    if not normalized_shape:
        raise op_error("rms_norm", "a normalized_shape with at least one dim", "normalized_shape=()")
    return RMSNorm(normalized_shape, None if eps is None else float(eps)).apply(x, weight)


__all__ = ["rms_norm"]
