"""Sorting: sort, argsort and topk along one dim, with int64 indices as torch.

Every order here is stable (equal elements keep their input order, also when descending) and puts nan above
everything else, as torch does with ``stable=True``; ``stable=False`` gets the same order, which is one of
the orders torch may return. Gradients go back to the positions the values were taken from.
"""
from __future__ import annotations

import numbers

from ... import return_types
from ..function import Op, op_error

__all__ = ["sort", "argsort", "topk"]


def _dim(op, dim, ndim):
    bound = max(ndim, 1)  # a 0-d tensor takes dim 0 and -1, as in torch
    if not isinstance(dim, numbers.Integral) or not -bound <= dim < bound:
        raise op_error(op, f"dim in [{-bound}, {bound - 1}] for a {ndim}-D tensor", f"dim={dim!r}",
                       "negative dims count from the end")
    return int(dim) % bound


def stable_order(xp, a, axis, descending):
    """Indices (int64) that sort ``a`` along ``axis``, equal elements in input order, nan as the largest.

    A descending stable order is the ascending stable order of the reversed input, reversed: ties, met last
    to first in the reversed input, come out first to last again (negating would break on ints and nan)."""
    if not descending:
        return xp.argsort(a, axis=axis, kind="stable").astype("int64", copy=False)
    order = xp.argsort(xp.flip(a, axis), axis=axis, kind="stable")
    return (a.shape[axis] - 1 - xp.flip(order, axis)).astype("int64", copy=False)


def _place_along(xp, shape, axis, index, values):
    """A zero array of ``shape`` holding ``values`` at ``index`` along ``axis`` (no index repeats)."""
    out = xp.zeros(shape, values.dtype)
    grids = [xp.arange(n).reshape((1,) * d + (n,) + (1,) * (index.ndim - d - 1)) for d, n in enumerate(index.shape)]
    grids[axis] = index
    out[tuple(grids)] = values
    return out


class _Picking(Op):
    """Outputs (values, indices): values taken from the input at the indices along ``self.axis``. The
    gradient goes back to those positions; the indices output is saved, so changing it in place is caught."""

    axis = None

    def setup_context(self, inputs, outputs):
        self.save_for_backward(outputs[1])

    def backward(self, g_values, g_indices):
        shape = self._input_shapes[0]
        if not shape:
            return g_values
        (index,) = self.saved_arrays
        return _place_along(self.xp, shape, self.axis, index, g_values)


class Sort(_Picking):
    def __init__(self, dim, descending):
        self.dim, self.descending = dim, descending

    def forward(self, x):
        axis = self.axis = _dim("sort", self.dim, x.ndim)
        if x.ndim == 0:
            return x.copy(), self.xp.zeros((), "int64")
        index = stable_order(self.xp, x, axis, self.descending)
        return self.xp.take_along_axis(x, index, axis=axis), index


class Topk(_Picking):
    def __init__(self, k, dim, largest):
        self.k, self.dim, self.largest = k, dim, largest

    def forward(self, x):
        axis = self.axis = _dim("topk", self.dim, x.ndim)
        if x.dtype.kind == "b":
            raise op_error("topk", "a numeric tensor", "a bool tensor", "convert it with .long() or .float() first")
        size = x.shape[axis] if x.ndim else 1
        if not isinstance(self.k, numbers.Integral) or not 0 <= self.k <= size:
            raise op_error("topk", f"k in [0, {size}] (the size of dim {axis})", f"k={self.k!r}")
        if x.ndim == 0:  # torch hands a 0-d input back for k = 0 as well as k = 1
            return x.copy(), self.xp.zeros((), "int64")
        order = stable_order(self.xp, x, axis, descending=self.largest)
        index = order[(slice(None),) * axis + (slice(0, self.k),)]
        return self.xp.take_along_axis(x, index, axis=axis), index


class Argsort(Op):
    differentiable = False

    def __init__(self, dim, descending):
        self.dim, self.descending = dim, descending

    def forward(self, x):
        axis = _dim("argsort", self.dim, x.ndim)
        if x.ndim == 0:
            return self.xp.zeros((), "int64")
        return stable_order(self.xp, x, axis, self.descending)


def sort(x, dim=-1, descending=False, stable=False):
    """Sort along ``dim``: (values, indices) with int64 indices, as torch.sort. Equal elements keep their
    input order (also when descending) and nan sorts as the largest value."""
    return return_types.sort(*Sort(dim, descending).apply(x))


def argsort(x, dim=-1, descending=False, stable=False):
    """The int64 indices that sort ``x`` along ``dim`` (the ``indices`` of ``sort``)."""
    return Argsort(dim, descending).apply(x)


def topk(x, k, dim=-1, largest=True, sorted=True):  # noqa: A002 - mirrors torch.topk
    """The ``k`` largest (or smallest) elements along ``dim``: (values, indices), as torch.topk.

    nan counts as the largest value; among equal values the first in the input comes first. The result is
    always in sorted order, which ``sorted=False`` also allows."""
    return return_types.topk(*Topk(k, dim, largest).apply(x))
