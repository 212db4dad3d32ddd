"""Reductions: sum, mean (with dtype=), max/min (values, or (values, indices) over a dim, as torch),
amax/amin, var/std, argmax/argmin, all/any.

Each differentiable reduction has a double backward (create_graph=True): its gradient is the incoming one
broadcast back, times a gradient-free mask where the reduction selects elements.
"""
from __future__ import annotations

import builtins
import numbers

from ... import backend, return_types
from ...tensor import Tensor
from ..function import Op, op_error, ignore_fp_errors

__all__ = ["sum", "mean", "max", "min", "amax", "amin", "argmax", "argmin", "var", "std", "all", "any"]


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
    if keepdim or not axes:
        return out
    if isinstance(out, Tensor):
        shape = list(out.shape)
        for ax in axes:
            shape.insert(ax, 1)
        return out.reshape(tuple(shape))
    return xp.expand_dims(out, axes)


def _expand_grad(xp, g, in_shape, axes, keepdim):
    """Broadcast a reduced gradient back to the input shape (a view: nothing is materialised). ``g`` is a
    Tensor during a create_graph backward."""
    if in_shape:
        g = _keep_reduced(xp, g, axes, keepdim)
    if isinstance(g, Tensor):
        return g.expand(in_shape) if g.shape != in_shape else g
    return xp.broadcast_to(g, in_shape)


def _mask(like, array):
    return Tensor._make(array, like.device) if isinstance(like, Tensor) else array


def _integral(a):
    return a.dtype.kind in "biu"


class Sum(Op):
    def __init__(self, dim=None, keepdim=False):
        self.dim = dim
        self.keepdim = keepdim

    def forward(self, a):
        self.axes = _axes(self.dim, a.ndim)
        if _integral(a) and a.dtype != backend.int64:
            a = a.astype(backend.int64)  # integer and bool sums are int64, as in torch
        return a.sum(axis=self.axes, keepdims=self.keepdim)

    def backward(self, g):
        return _expand_grad(self.xp, g, self._input_shapes[0], self.axes, self.keepdim)

    backward_graph = backward


class Mean(Op):
    def __init__(self, dim=None, keepdim=False):
        self.dim = dim
        self.keepdim = keepdim

    def forward(self, a):
        if _integral(a):
            raise op_error("mean", "a floating-point input (or dtype=...)", f"dtype {a.dtype}",
                           "convert with .float() or pass dtype=infini_train.float32")
        self.axes = _axes(self.dim, a.ndim)
        return a.mean(axis=self.axes, keepdims=self.keepdim)

    def backward(self, g):
        shape = self._input_shapes[0]
        count = _count(shape, self.axes)
        return _expand_grad(self.xp, g / builtins.max(count, 1), shape, self.axes, self.keepdim)

    backward_graph = backward


def _check_nonempty(op, a, axes):
    for ax in axes:
        if a.shape[ax] == 0:
            raise op_error(op, f"a non-empty reduction dim {ax}", f"a tensor of shape {tuple(a.shape)}",
                           "the max/min/argmax of zero elements is undefined; reduce over another dim")


class _Extremum(Op):
    """max/min. An int dim gives (values, indices) and sends the gradient to the first extremal element of each
    slice (as torch.max(x, dim)); a full or tuple reduction gives values only and splits the gradient evenly
    among ties (as torch's x.max() and amax)."""

    reduce = arg = None  # the xp method names

    def __init__(self, dim=None, keepdim=False):
        self.dim = dim
        self.keepdim = keepdim

    def forward(self, a):
        self.axes = _axes(self.dim, a.ndim)
        _check_nonempty(self.name, a, self.axes)
        self.by_index = isinstance(self.dim, numbers.Integral)
        if not self.by_index:
            return getattr(a, self.reduce)(axis=self.axes, keepdims=self.keepdim)
        if a.ndim == 0:
            return a.copy(), self.xp.zeros((), backend.int64)
        (axis,) = self.axes
        index = getattr(a, self.arg)(axis=axis, keepdims=True)
        self.stash(index)
        out = self.xp.take_along_axis(a, index, axis=axis)
        if not self.keepdim:
            out, index = out.squeeze(axis), index.squeeze(axis)
        return out, index.astype(backend.int64, copy=False)

    def setup_context(self, inputs, output):
        if not self.by_index:
            self.save_for_backward(inputs[0], output)

    def backward(self, g, g_indices=None):
        xp = self.xp
        g = _keep_reduced(xp, g, self.axes, self.keepdim)
        shape = self._input_shapes[0]
        if self.by_index:
            if not shape:
                return g
            (index,) = self.stashed
            (axis,) = self.axes
            size = shape[axis]
            positions = xp.arange(size).reshape((size,) + (1,) * (len(shape) - axis - 1))
            return g * _mask(g, positions == index)
        a, out = (_raw(t) for t in self.saved_arrays)
        hit = a == _keep_reduced(xp, out, self.axes, self.keepdim)
        share = hit / hit.sum(axis=self.axes, keepdims=True, dtype=g.dtype)
        return g * _mask(g, share.astype(g.dtype, copy=False))

    backward_graph = backward


def _raw(x):
    return x.array if isinstance(x, Tensor) else x


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
        if isinstance(a, Tensor):
            return a - a.mean(dim=self.axes, keepdim=True), _count(a.shape, self.axes)
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

    backward_graph = backward

    def var_grad(self, a, g):
        centered, _ = self.centered(a)
        with ignore_fp_errors(self.xp):
            grad = (g * centered) * (2 / self.dof) if self.dof else (g * centered) * float("inf")
        return grad if isinstance(grad, Tensor) else grad.astype(a.dtype, copy=False)


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
            nonzero = _mask(g, (_raw(out) != 0).astype(g.dtype))  # torch masks std == 0 to a zero gradient
            g_var = g * nonzero / (2 * out + (1 - nonzero))
        return self.var_grad(a, g_var)

    backward_graph = backward


class _Truth(Op):
    """all / any: a bool result, never differentiable."""

    differentiable = False
    reduce = None

    def __init__(self, dim=None, keepdim=False):
        self.dim = dim
        self.keepdim = keepdim

    def forward(self, a):
        return getattr(a.astype(bool, copy=False), self.reduce)(axis=_axes(self.dim, a.ndim), keepdims=self.keepdim)


class All(_Truth):
    reduce = "all"


class Any(_Truth):
    reduce = "any"


def _cast_for(x, dtype):
    return x if dtype is None else x.to(dtype)


def every_dim_if_empty(dim):
    """torch's sum/mean/var/std (and nansum, nanmean, norms) read an empty dim list, () or [], as every dim;
    all/any read it as no dim, so ``_axes`` keeps () as is and these entry points translate it."""
    return None if isinstance(dim, (tuple, list)) and len(dim) == 0 else dim


def sum(x, dim=None, keepdim=False, dtype=None):  # noqa: A001 - mirrors torch.sum
    """Sum over all elements (dim None or ()), or over ``dim`` (int or tuple); ``dtype`` casts the input first.
    Integer and bool inputs sum to int64, as in torch."""
    return Sum(every_dim_if_empty(dim), keepdim).apply(_cast_for(x, dtype))


def mean(x, dim=None, keepdim=False, dtype=None):
    """Mean over all elements, or over ``dim`` (int or tuple); integer inputs need ``dtype``, as in torch."""
    return Mean(every_dim_if_empty(dim), keepdim).apply(_cast_for(x, dtype))


def _extremum(cls, name, x, dim, keepdim):
    if isinstance(dim, Tensor):  # torch.max(a, b): the elementwise maximum
        from .elementwise import maximum, minimum
        return (maximum if name == "max" else minimum)(x, dim)
    if dim is not None and not isinstance(dim, numbers.Integral):
        raise op_error(name, "dim as an int (or None for the whole tensor)", f"dim={dim!r}",
                       f"to reduce over several dims use a{name}(dims)")
    out = cls(dim, keepdim).apply(x)
    return out if dim is None else getattr(return_types, name)(*out)


def max(x, dim=None, keepdim=False):  # noqa: A001 - mirrors torch.max
    """The largest value (dim=None), or ``(values, indices)`` over the int ``dim`` (a named tuple, as torch),
    or the elementwise maximum when ``dim`` is a tensor. The gradient goes to the first maximal element of
    each slice over a dim, and is split evenly among ties for dim=None."""
    return _extremum(Max, "max", x, dim, keepdim)


def min(x, dim=None, keepdim=False):  # noqa: A001 - mirrors torch.min
    """The smallest value, or ``(values, indices)`` over ``dim``; as ``max``."""
    return _extremum(Min, "min", x, dim, keepdim)


def amax(x, dim=(), keepdim=False):
    """Largest values over ``dim`` (an int or tuple; () means all dims); ties share the gradient evenly."""
    return Max(_amax_dims(dim), keepdim).apply(x)


def amin(x, dim=(), keepdim=False):
    """Smallest values over ``dim`` (an int or tuple; () means all dims); ties share the gradient evenly."""
    return Min(_amax_dims(dim), keepdim).apply(x)


def _amax_dims(dim):
    if isinstance(dim, numbers.Integral):
        return (int(dim),)
    return None if len(tuple(dim)) == 0 else tuple(dim)


def all(x, dim=None, keepdim=False):  # noqa: A001 - mirrors torch.all
    """True where every element (over ``dim``, or all) is nonzero."""
    return All(dim, keepdim).apply(x)


def any(x, dim=None, keepdim=False):  # noqa: A001 - mirrors torch.any
    """True where some element (over ``dim``, or all) is nonzero."""
    return Any(dim, keepdim).apply(x)


def argmax(x, dim=None, keepdim=False):
    """Index (int64) of the first maximal element over ``dim``, or in the flattened tensor for dim=None."""
    return Argmax(dim, keepdim).apply(x)


def argmin(x, dim=None, keepdim=False):
    """Index (int64) of the first minimal element over ``dim``, or in the flattened tensor for dim=None."""
    return Argmin(dim, keepdim).apply(x)


def var(x, dim=None, keepdim=False, correction=1):
    """Variance over all elements or ``dim``; divides by N - correction (torch semantics)."""
    return Var(every_dim_if_empty(dim), keepdim, correction).apply(x)


def std(x, dim=None, keepdim=False, correction=1):
    """Standard deviation: sqrt(var(x, dim, keepdim, correction))."""
    return Std(every_dim_if_empty(dim), keepdim, correction).apply(x)
