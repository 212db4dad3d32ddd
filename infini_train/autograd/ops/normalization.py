"""layer_norm as one fused Op: forward keeps only the per-row mean and 1/std (float32 at least) next to the
saved input; backward recomputes x-hat and applies the analytic gradient. Statistics are accumulated in
float32 at least (float16/bfloat16 inputs are normalised in float32 and rounded once). As in torch, weight and
bias may be float32 next to a float16/bfloat16 input: the output has the input's dtype, each gradient its
tensor's."""
from __future__ import annotations

import math

import numpy as np

from ...kernels import layer_norm as layer_norm_kernels
from ...kernels import norm_forward
from ..double_backward import recomputed_grads
from ..function import Op, op_error, sum_to
from .low_precision import narrow
from .softmax import row_dot, row_sum, upcast


class LayerNorm(Op):
    def __init__(self, normalized_shape, eps=1e-5):
        self.normalized_shape = normalized_shape
        self.eps = eps

    def _check(self, x, weight, bias):
        ns = self.normalized_shape
        if x.shape[x.ndim - len(ns):] != ns or len(ns) > x.ndim:
            raise op_error("layer_norm", f"input whose trailing dims are normalized_shape={ns}",
                           f"input of shape {tuple(x.shape)}",
                           "normalized_shape names the last dims of the input, e.g. n_embd for (B, T, n_embd)")
        for name, p in (("weight", weight), ("bias", bias)):
            if p is not None and tuple(p.shape) != ns:
                raise op_error("layer_norm", f"{name} of shape {ns} (= normalized_shape)",
                               f"{name} of shape {tuple(p.shape)}")

    def forward(self, x, weight=None, bias=None):
        self._check(x, weight, bias)
        xp = self.xp
        size = math.prod(self.normalized_shape)
        if x.size == 0:
            self.stash(None, None)
            return x.copy()
        if norm_forward.why_not(x, weight, bias, size) is None:  # a registry kernel (kernels/registry.py)
            fused = norm_forward.layer_norm(xp, x, weight, bias, size, self.eps)
            if fused is not None:
                self.stash(*fused[1:])
                return fused[0]
        xw = upcast(x)
        rows = xw.reshape(-1, size)
        mean = row_sum(xp, rows, 1)
        mean /= size
        out = xp.subtract(rows, mean, out=rows if xw is not x else None)
        # a float32 row sum rounds at the scale of the sum: with a large offset (x = 1e3 + noise) the mean is
        # off by ~1e-4 sigma. The residual mean of x - mean measures that error; correct it when it matters.
        residual = row_sum(xp, out, 1)
        residual /= size
        var = row_dot(xp, out, out, 1)
        var /= size
        var -= residual * residual
        var += self.eps
        rstd = xp.sqrt(var, out=var)
        xp.reciprocal(rstd, out=rstd)
        if float(abs(residual * rstd).max()) > 1e-6:
            out -= residual
            mean += residual
        out *= rstd  # x-hat
        if weight is not None:
            out *= weight.reshape(size)
        if bias is not None:
            out += bias.reshape(size)
        self.stash(mean, rstd)
        return narrow(xp, out.reshape(x.shape), x.dtype)

    def setup_context(self, inputs, output):
        self.save_for_backward(inputs[0], inputs[1])

    def backward(self, g):
        xp = self.xp
        x, weight = self.saved_arrays
        mean, rstd = self.stashed
        need_x, need_w, need_b = self.needs_input_grad
        shapes, dtypes = self._input_shapes, self._input_dtypes
        if x.size == 0:
            return tuple(xp.zeros(s, d) if n else None for s, d, n in zip(shapes, dtypes, (need_x, need_w, need_b)))
        size = math.prod(self.normalized_shape)
        if xp is not np:  # one pass for the input's gradient on GPUs (kernels/layer_norm.py)
            fused = layer_norm_kernels.backward(xp, x, g, weight, mean, rstd, size, need_x, need_w or need_b)
            if fused is not None:
                gx, sums = fused
                gw = narrow(xp, sums[0].reshape(shapes[1]), dtypes[1]) if need_w else None
                gb = narrow(xp, sums[1].reshape(shapes[2]), dtypes[2]) if need_b else None
                return gx, gw, gb
        g_rows = upcast(g).reshape(-1, size)
        xhat = xp.subtract(upcast(x).reshape(-1, size), mean)
        xhat *= rstd
        gw = gb = gx = None
        if need_w:  # column sums: einsum / a vector-matrix product beat .sum(axis=0) by ~2x
            gw = narrow(xp, xp.einsum("ij,ij->j", g_rows, xhat).reshape(shapes[1]), dtypes[1])
        if need_b:
            gb = narrow(xp, (xp.ones(g_rows.shape[0], g_rows.dtype) @ g_rows).reshape(shapes[2]), dtypes[2])
        if need_x:
            # dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = g * weight
            dxhat = g_rows * weight.reshape(size) if weight is not None else g_rows
            mean_dxhat = row_sum(xp, dxhat, 1)
            mean_dxhat /= size
            mean_proj = row_dot(xp, dxhat, xhat, 1)
            mean_proj /= size
            xhat *= mean_proj
            gx = xp.subtract(dxhat, xhat, out=dxhat if weight is not None else xhat)
            gx -= mean_dxhat
            gx *= rstd
            gx = narrow(xp, gx.reshape(shapes[0]), dtypes[0])
        return gx, gw, gb

    def backward_graph(self, g):
        x, weight = self.saved_tensors
        gx, gw = recomputed_grads(self, self._composite, (x, weight), g)[:2]
        gb = sum_to(g, self._input_shapes[2]) if self.needs_input_grad[2] else None
        return gx, gw, gb

    def _composite(self, x, weight):
        """The forward (without the bias) in differentiable ops, for double backward."""
        dims = tuple(range(x.ndim - len(self.normalized_shape), x.ndim))
        centered = x - x.mean(dims, keepdim=True)
        out = centered * ((centered * centered).mean(dims, keepdim=True) + self.eps).rsqrt()
        return out * weight if weight is not None else out


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Normalise over the trailing ``normalized_shape`` dims (an int or a tuple), then scale by ``weight`` and
    shift by ``bias`` (both of shape ``normalized_shape``, or None)."""
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    normalized_shape = tuple(int(n) for n in normalized_shape)
    if not normalized_shape:
        raise op_error("layer_norm", "a normalized_shape with at least one dim", "normalized_shape=()")
    return LayerNorm(normalized_shape, eps).apply(x, weight, bias)


__all__ = ["layer_norm"]
