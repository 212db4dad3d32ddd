"""Scans: cumsum and cumprod along one dim, as torch.

Integer and bool inputs give int64; ``dtype`` casts the input before the scan. The gradient comes back in
the input's dtype.
"""
from __future__ import annotations

import numbers

from ...backend import as_dtype
from ..function import Op, ignore_fp_errors, op_error

__all__ = ["cumsum", "cumprod"]


def _reversed_cumsum(xp, a, axis):
    """out[k] = sum of a[j] for j >= k along ``axis``."""
    return xp.flip(xp.cumsum(xp.flip(a, axis), axis=axis), axis)


class _Scan(Op):
    scan = None  # the xp function name

    def __init__(self, dim, dtype):
        self.dim, self.dtype = dim, dtype

    def forward(self, x):
        bound = max(x.ndim, 1)  # a 0-d tensor takes dim 0 and -1, as in torch
        if not isinstance(self.dim, numbers.Integral) or not -bound <= self.dim < bound:
            raise op_error(self.scan, f"dim in [{-bound}, {bound - 1}] for a {x.ndim}-D tensor", f"dim={self.dim!r}",
                           "negative dims count from the end")
        self.axis = int(self.dim) % bound
        self.input_dtype = x.dtype
        if self.dtype is not None:
            dtype = as_dtype(self.dtype)
        else:
            dtype = "int64" if x.dtype.kind in "biu" else x.dtype
        x = x.astype(dtype, copy=False)
        if x.ndim == 0:
            return x.copy()
        return getattr(self.xp, self.scan)(x, axis=self.axis, dtype=x.dtype)  # numpy would widen small ints


class Cumsum(_Scan):
    scan = "cumsum"

    def backward(self, g):
        if g.ndim:
            g = _reversed_cumsum(self.xp, g, self.axis)
        return g.astype(self.input_dtype, copy=False)

    def backward_graph(self, g):
        from .reorder import flip

        if g.ndim:
            g = flip(flip(g, (self.axis,)).cumsum(self.axis), (self.axis,))
        return g.to(self.input_dtype)


class Cumprod(_Scan):
    scan = "cumprod"

    def setup_context(self, inputs, output):
        self.save_for_backward(inputs[0], output)

    def backward(self, g):
        x, out = self.saved_arrays
        if g.ndim == 0 or g.shape[self.axis] <= 1:
            return g.astype(self.input_dtype, copy=False)
        with ignore_fp_errors(self.xp):
            grad = self._grad(x.astype(out.dtype, copy=False), out, g)
        return grad.astype(self.input_dtype, copy=False)

    def _grad(self, x, out, g):
        """torch's cumprod_backward. Without zeros, d out[j] / d x[k] = out[j] / x[k] for j >= k. With zeros
        (z1 the first, z2 the second): positions before z1 keep that formula, summed over outputs before z1
        (the later ones are 0); z1 gets the sum over j in [z1, z2) of g[j] * prod(x[i] for i <= j, i != z1);
        positions after z1 get 0, since every output they reach holds the zero at z1 as a factor."""
        xp, axis = self.xp, self.axis
        weighted = out * g
        is_zero = x == 0
        if not bool(is_zero.any()):
            return _reversed_cumsum(xp, weighted, axis) / x
        zeros_so_far = xp.cumsum(is_zero, axis=axis)
        before = zeros_so_far == 0
        grad = xp.where(before, _reversed_cumsum(xp, xp.where(before, weighted, 0), axis) / xp.where(before, x, 1), 0)
        first_run = zeros_so_far == 1  # from the first zero up to the second
        first_zero = first_run & is_zero
        after_first = xp.cumprod(xp.where(first_run & ~is_zero, x, 1), axis=axis)  # prod of x in (z1, j]
        at_first = (after_first * xp.where(first_run, g, 0)).sum(axis=axis, keepdims=True)
        head = [slice(None)] * out.ndim
        head[axis] = slice(0, 1)
        body = list(head)
        body[axis] = slice(0, -1)
        before_first = xp.concatenate([xp.ones_like(out[tuple(head)]), out[tuple(body)]], axis=axis)  # prod x[:k]
        return xp.where(first_zero, at_first * before_first, grad)


def cumsum(x, dim, dtype=None):
    """Running sum along ``dim``. Integer and bool inputs give int64; ``dtype`` casts the input first."""
    return Cumsum(dim, dtype).apply(x)


def cumprod(x, dim, dtype=None):
    """Running product along ``dim``. Integer and bool inputs give int64; ``dtype`` casts the input first.
    The gradient is exact where the input has zeros (torch's formula, no division by zero)."""
    return Cumprod(dim, dtype).apply(x)
