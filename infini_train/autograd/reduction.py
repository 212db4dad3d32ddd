"""Reductions: sum, mean, max, min (full or over dims, keepdim), var/std, argmax/argmin."""
from __future__ import annotations

from .function import Op

__all__ = ["sum", "mean"]


def _axes(dim, ndim):
    """Normalise dim (None | int | sequence) to a sorted tuple of non-negative axes."""
    if dim is None:
        return tuple(range(ndim))
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    out = []
    for d in dims:
        if not -max(ndim, 1) <= d < max(ndim, 1):
            raise IndexError(f"dim {d} is out of range for a tensor with {ndim} dims "
                             f"(expected -{max(ndim, 1)}..{max(ndim, 1) - 1})")
        out.append(d % ndim if ndim else 0)
    return tuple(sorted(set(out)))


def _expand_grad(xp, g, in_shape, axes, keepdim):
    """Broadcast a reduced gradient back to the input shape (a view: nothing is materialised)."""
    if not keepdim and in_shape:
        g = xp.expand_dims(g, axes)
    return xp.broadcast_to(g, in_shape)


class Sum(Op):
    def __init__(self, dim=None, keepdim=False):
        self.dim = dim
        self.keepdim = keepdim

    def forward(self, a):
        self.axes = _axes(self.dim, a.ndim)
        return a.sum(axis=self.axes, keepdims=self.keepdim)

    def backward(self, g):
        return _expand_grad(self.xp, g, self._input_shapes[0], self.axes, self.keepdim)


class Mean(Op):
    def __init__(self, dim=None, keepdim=False):
        self.dim = dim
        self.keepdim = keepdim

    def forward(self, a):
        self.axes = _axes(self.dim, a.ndim)
        return a.mean(axis=self.axes, keepdims=self.keepdim)

    def backward(self, g):
        shape = self._input_shapes[0]
        count = 1
        for ax in self.axes:
            count *= shape[ax] if shape else 1
        return _expand_grad(self.xp, g / max(count, 1), shape, self.axes, self.keepdim)


def sum(x, dim=None, keepdim=False):  # noqa: A001 - mirrors torch.sum
    """Sum over all elements, or over ``dim`` (int or tuple)."""
    return Sum(dim, keepdim).apply(x)


def mean(x, dim=None, keepdim=False):
    """Mean over all elements, or over ``dim`` (int or tuple)."""
    return Mean(dim, keepdim).apply(x)
