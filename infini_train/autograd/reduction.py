"""Reductions: sum, mean, max, min (full or over dims, keepdim), var/std, argmax/argmin."""
from __future__ import annotations

import builtins
import numbers

from .function import Op, op_error, ignore_fp_errors

__all__ = ["sum", "mean", "max", "min", "argmax", "argmin", "var", "std"]


def _axes(dim, ndim):
    """Normalise dim (None | int | sequence) to a sorted tuple of non-negative axes."""
    if dim is None:
        return tuple(range(ndim))
    dims = (dim,) if isinstance(dim, numbers.Integral) else tuple(dim)
    bound = builtins.max(ndim, 1)  # a 0-d tensor accepts dim 0 and -1, as in torch
    out = []
    for d in dims:
        if not -bound <= d < bound:
            raise IndexError(f"dim {d} is out of range for a tensor with {ndim} dims (expected -{bound}..{bound - 1})")
        if ndim:
            out.append(d % ndim)
    return tuple(sorted(set(out)))


def _count(shape, axes):
    count = 1
    for ax in axes:
        count *= shape[ax]
    return count


def _keep_reduced(xp, out, axes, keepdim):
    """The reduced result with the reduced axes kept as size 1, so it broadcasts against the input."""
    return out if keepdim or not axes else xp.expand_dims(out, axes)


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
        count = _count(shape, self.axes)
        return _expand_grad(self.xp, g / builtins.max(count, 1), shape, self.axes, self.keepdim)


def _check_nonempty(op, a, axes):
    for ax in axes:
        if a.shape[ax] == 0:
            raise op_error(op, f"a non-empty reduction dim {ax}", f"a tensor of shape {tuple(a.shape)}",
                           "the max/min/argmax of zero elements is undefined; reduce over another dim")


class _Extremum(Op):
    """max/min values. An int dim sends the gradient to the first extremal element of each slice (as
    torch.max(x, dim)); a full or tuple reduction splits it evenly among ties (as torch's x.max(), amax)."""

    reduce = arg = None  # the xp method names

    def __init__(self, dim=None, keepdim=False):
        self.dim = dim
        self.keepdim = keepdim

    def forward(self, a):
        self.axes = _axes(self.dim, a.ndim)
        _check_nonempty(self.name, a, self.axes)
        self.by_index = isinstance(self.dim, numbers.Integral) and a.ndim > 0
        if not self.by_index:
            return getattr(a, self.reduce)(axis=self.axes, keepdims=self.keepdim)
        (axis,) = self.axes
        index = getattr(a, self.arg)(axis=axis, keepdims=True)
        self.stash(index)
        out = self.xp.take_along_axis(a, index, axis=axis)
        return out if self.keepdim else out.squeeze(axis)

    def setup_context(self, inputs, output):
        if not self.by_index:
            self.save_for_backward(inputs[0], output)

    def backward(self, g):
        xp = self.xp
        g = _keep_reduced(xp, g, self.axes, self.keepdim)
        if self.by_index:
            (index,) = self.stashed
            (axis,) = self.axes
            size = self._input_shapes[0][axis]
            positions = xp.arange(size).reshape((size,) + (1,) * (g.ndim - axis - 1))
            return xp.where(positions == index, g, 0)
        a, out = self.saved_arrays
        hit = a == _keep_reduced(xp, out, self.axes, self.keepdim)
        ties = hit.sum(axis=self.axes, keepdims=True, dtype=g.dtype)
        return xp.where(hit, g / ties, 0)


class Max(_Extremum):
    reduce, arg = "max", "argmax"


class Min(_Extremum):
    reduce, arg = "min", "argmin"


class _ArgExtremum(Op):
    differentiable = False
    arg = None

    def __init__(self, dim=None, keepdim=False):
        if dim is not None and not isinstance(dim, numbers.Integral):
            raise op_error(type(self).__name__, "dim as None or an int", f"dim={dim!r}",
                           "argmax/argmin reduce one dim (or the flattened tensor with dim=None)")
        self.dim = dim
        self.keepdim = keepdim

    def forward(self, a):
        axes = _axes(self.dim, a.ndim)
        _check_nonempty(self.name, a, axes)
        if self.dim is None or a.ndim == 0:  # index into the flattened tensor
            index = getattr(a.reshape(-1), self.arg)()
            shape = (1,) * a.ndim if self.keepdim else ()
            return self.xp.asarray(index, dtype="int64").reshape(shape)
        return getattr(a, self.arg)(axis=axes[0], keepdims=self.keepdim).astype("int64", copy=False)


class Argmax(_ArgExtremum):
    arg = "argmax"


class Argmin(_ArgExtremum):
    arg = "argmin"


class Var(Op):
    """Variance with ``correction`` (1: unbiased, 0: population), accumulated in float32 at least.
    Degrees of freedom <= 0 give inf/nan, as in torch."""

    def __init__(self, dim=None, keepdim=False, correction=1):
        self.dim = dim
        self.keepdim = keepdim
        self.correction = correction

    def centered(self, a):
        if a.dtype.kind != "f" and a.dtype.kind != "V":
            raise op_error(self.name, "a floating-point tensor", f"dtype {a.dtype}", "convert it with .float()")
        if a.dtype.itemsize < 4:
            a = a.astype("float32")
        count = _count(a.shape, self.axes)
        return a - a.sum(axis=self.axes, keepdims=True) / builtins.max(count, 1), count

    def forward(self, a):
        self.axes = _axes(self.dim, a.ndim)
        centered, count = self.centered(a)
        self.dof = builtins.max(count - self.correction, 0)
        with ignore_fp_errors(self.xp):
            var = (centered * centered).sum(axis=self.axes, keepdims=self.keepdim) / self.dof
        return var.astype(a.dtype, copy=False)

    def setup_context(self, inputs, output):
        self.save_for_backward(inputs[0])

    def backward(self, g):
        (a,) = self.saved_arrays
        return self.var_grad(a, _keep_reduced(self.xp, g, self.axes, self.keepdim))

    def var_grad(self, a, g):
        centered, _ = self.centered(a)
        with ignore_fp_errors(self.xp):
            return ((g * centered) * 2 / self.dof).astype(a.dtype, copy=False)


class Std(Var):
    def forward(self, a):
        return self.xp.sqrt(super().forward(a))

    def setup_context(self, inputs, output):
        self.save_for_backward(inputs[0], output)

    def backward(self, g):
        a, out = self.saved_arrays
        xp = self.xp
        out = _keep_reduced(xp, out, self.axes, self.keepdim)
        g = _keep_reduced(xp, g, self.axes, self.keepdim)
        with ignore_fp_errors(xp):
            g_var = xp.where(out == 0, 0, g / (2 * out))  # torch masks std == 0 to a zero gradient
        return self.var_grad(a, g_var)


def sum(x, dim=None, keepdim=False):  # noqa: A001 - mirrors torch.sum
    """Sum over all elements, or over ``dim`` (int or tuple)."""
    return Sum(dim, keepdim).apply(x)


def mean(x, dim=None, keepdim=False):
    """Mean over all elements, or over ``dim`` (int or tuple)."""
    return Mean(dim, keepdim).apply(x)


def max(x, dim=None, keepdim=False):  # noqa: A001 - mirrors torch.max
    """Largest value over all elements, or over ``dim`` (int or tuple); returns values only.
    Gradient: an int dim picks the first maximal element (torch.max(x, dim)); a full or tuple
    reduction splits it evenly among ties (x.max(), x.amax(dims))."""
    return Max(dim, keepdim).apply(x)


def min(x, dim=None, keepdim=False):  # noqa: A001 - mirrors torch.min
    """Smallest value over all elements, or over ``dim``; gradient as for ``max``."""
    return Min(dim, keepdim).apply(x)


def argmax(x, dim=None, keepdim=False):
    """Index (int64) of the first maximal element over ``dim``, or in the flattened tensor for dim=None."""
    return Argmax(dim, keepdim).apply(x)


def argmin(x, dim=None, keepdim=False):
    """Index (int64) of the first minimal element over ``dim``, or in the flattened tensor for dim=None."""
    return Argmin(dim, keepdim).apply(x)


def var(x, dim=None, keepdim=False, correction=1):
    """Variance over all elements or ``dim``; divides by N - correction (torch semantics)."""
    return Var(dim, keepdim, correction).apply(x)


def std(x, dim=None, keepdim=False, correction=1):
    """Standard deviation: sqrt(var(x, dim, keepdim, correction))."""
    return Std(dim, keepdim, correction).apply(x)
