"""Reductions beside sum/mean/var: prod (its gradient exact with zeros in the input), var/std with torch's
``unbiased`` spelling and var_mean/std_mean, nansum/nanmean, logsumexp and vector norms, as torch 2.13."""
from __future__ import annotations

import math
import numbers

import numpy as np

from ... import backend
from ...tensor import Tensor
from . import reduction
from ..function import Op, op_error
from ..grad_mode import no_grad
from .reduction import _axes

__all__ = ["prod", "var", "std", "var_mean", "std_mean", "nansum", "nanmean", "logsumexp", "norm", "vector_norm"]


# ---------------------------------------------------------------------------------------------------- prod
def _others_product(xp, x, axes):
    """For each element of ``x``, the product of the other elements of its slice over ``axes``, without dividing
    (exact with zeros): the exclusive products from the left times those from the right. ``x`` is an array, or a
    Tensor during a create_graph backward (then every step is recorded)."""
    tensors = isinstance(x, Tensor)
    if not axes or (x.numel() if tensors else x.size) == 0:
        return x * 0 + 1
    order = [d for d in range(x.ndim) if d not in axes] + list(axes)
    moved = x.permute(*order) if tensors else x.transpose(order)
    lead = tuple(moved.shape[:x.ndim - len(axes)])
    flat = moved.reshape(lead + (-1,))
    ones = xp.ones(lead + (1,), x.dtype)
    if tensors:
        from .joins import cat
        from .reorder import flip
        ones = Tensor._make(ones, x.device)
        left = cat([ones, flat[..., :-1]], -1).cumprod(-1)
        right = flip(cat([ones, flip(flat, -1)[..., :-1]], -1).cumprod(-1), -1)
        return (left * right).reshape(tuple(moved.shape)).permute(*np.argsort(order).tolist())
    left = xp.cumprod(xp.concatenate([ones, flat[..., :-1]], -1), -1)
    right = xp.flip(xp.cumprod(xp.concatenate([ones, xp.flip(flat, -1)[..., :-1]], -1), -1), -1)
    return (left * right).reshape(moved.shape).transpose(tuple(np.argsort(order).tolist()))  # ints for cupy


class Prod(Op):
    """Product over ``dim`` (None: every element); integer and bool inputs multiply in int64, as torch."""

    def __init__(self, dim=None, keepdim=False):
        self.dim, self.keepdim = dim, keepdim

    def setup_context(self, inputs, output):
        self.save_for_backward(inputs[0])

    def forward(self, x):
        self.axes = _axes(self.dim, x.ndim)
        dtype = backend.int64 if x.dtype.kind in "biu" else x.dtype
        return self.xp.asarray(self.xp.prod(x, axis=self.axes, keepdims=self.keepdim, dtype=dtype))

    def backward(self, g):
        (x,) = self.saved_arrays
        return _kept(g, self._input_shapes[0], self.axes, self.keepdim) * _others_product(self.xp, x, self.axes)

    backward_graph = backward


def _kept(g, shape, axes, keepdim):
    """A reduction's gradient ``g`` with the reduced axes as size 1 (it broadcasts against the input)."""
    if keepdim or not axes:
        return g
    shape = list(shape)
    for ax in axes:
        shape[ax] = 1
    return g.reshape(tuple(shape))


def prod(x, dim=None, keepdim=False, *, dtype=None):
    """Product of all elements, or over ``dim`` (an int); ``dtype`` casts the input first (torch.prod)."""
    if dim is not None and not isinstance(dim, numbers.Integral):
        raise op_error("prod", "dim as an int (or None for every element)", f"dim={dim!r}",
                       "take the product over several dims one dim at a time")
    if dtype is not None:
        x = x.to(dtype)
    return Prod(dim, keepdim).apply(x)


# ----------------------------------------------------------------------------------------- var / std
def _correction(op, dim, unbiased, correction):
    """torch's spellings: var(dim, unbiased, keepdim), var(unbiased) and var(dim, correction=...)."""
    if isinstance(dim, bool):  # t.var(False): the first positional is ``unbiased``
        if unbiased is not None:
            raise op_error(op, "dim as an int or tuple", f"dim={dim!r}",
                           "a bool first argument is unbiased; pass unbiased= as a keyword when dim is given")
        dim, unbiased = None, dim
    if unbiased is not None and correction is not None:
        raise op_error(op, "either unbiased or correction", f"unbiased={unbiased!r} and correction={correction!r}",
                       "unbiased=True is correction=1, unbiased=False is correction=0")
    if correction is None:
        correction = 1 if unbiased is None else int(bool(unbiased))
    return dim, correction


def var(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """Variance over all elements or ``dim``, dividing by N - correction (unbiased=True: 1, False: 0)."""
    dim, correction = _correction("var", dim, unbiased, correction)
    return reduction.var(x, dim, keepdim, correction)


def std(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """Standard deviation: sqrt(var(...)) with the same arguments."""
    dim, correction = _correction("std", dim, unbiased, correction)
    return reduction.std(x, dim, keepdim, correction)


def var_mean(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """(variance, mean) over the same elements (torch.var_mean)."""
    dim, correction = _correction("var_mean", dim, unbiased, correction)
    return reduction.var(x, dim, keepdim, correction), reduction.mean(x, dim, keepdim)


def std_mean(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """(standard deviation, mean) over the same elements (torch.std_mean)."""
    dim, correction = _correction("std_mean", dim, unbiased, correction)
    return reduction.std(x, dim, keepdim, correction), reduction.mean(x, dim, keepdim)


# ------------------------------------------------------------------------------------- nan-aware sums
def nansum(x, dim=None, keepdim=False, *, dtype=None):
    """Sum treating nan as zero (whose gradient is then zero, as torch's)."""
    if dtype is not None:
        x = x.to(dtype)
    if not backend.is_floating(x.dtype):
        return reduction.sum(x, dim, keepdim)
    from .elementwise import where
    return reduction.sum(where(x.isnan(), 0.0, x), dim, keepdim)


def nanmean(x, dim=None, keepdim=False, *, dtype=None):
    """Mean of the elements that are not nan (nan where all are)."""
    if dtype is not None:
        x = x.to(dtype)
    if not backend.is_floating(x.dtype):
        raise op_error("nanmean", "a floating-point input", f"dtype {x.dtype}", "pass dtype=infini_train.float32")
    counted = reduction.sum(x.isnan().logical_not(), dim, keepdim)
    return nansum(x, dim, keepdim) / counted.to(x.dtype)


def logsumexp(x, dim, keepdim=False):
    """log(sum(exp(x))) over ``dim``, computed stably (the largest value taken out first; -inf where every value
    is -inf, or where the slice is empty); integer inputs compute in the default float dtype."""
    if isinstance(dim, (tuple, list)) and len(dim) == 0:
        raise op_error("logsumexp", "dim as an int or a non-empty tuple of dims", f"dim={dim!r}",
                       "pass dim=tuple(range(x.ndim)) to reduce over every dim")
    if not backend.is_floating(x.dtype):
        x = x.to(backend.get_default_dtype())
    axes = _axes(dim, x.ndim)
    if any(x.shape[d] == 0 for d in axes):  # log of an empty sum: -inf, as torch (no largest value to take out)
        return x.sum(dim=axes, keepdim=keepdim) + float("-inf")
    from .elementwise import where
    with no_grad():
        peak = reduction.amax(x, dim, keepdim=True)
        peak = where(peak.isinf(), 0.0, peak)
    out = (x - peak).exp().sum(dim=dim, keepdim=True).log() + peak
    if keepdim:
        return out
    return out.reshape(tuple(n for d, n in enumerate(out.shape) if d not in axes))


# ---------------------------------------------------------------------------------------------- norms
class VectorNorm(Op):
    """The ``p``-norm over ``dim`` of the flattened elements, with torch's gradient (zero where the norm is zero;
    the inf-norms share the gradient evenly among the elements that reach the norm)."""

    def __init__(self, p, dim, keepdim):
        self.p, self.dim, self.keepdim = p, dim, keepdim

    def setup_context(self, inputs, output):
        self.save_for_backward(inputs[0], output)

    def forward(self, x):
        xp, p = self.xp, self.p
        self.axes = axes = _axes(self.dim, x.ndim)
        a = xp.abs(x.astype("float32") if x.dtype.itemsize < 4 else x)
        if p == math.inf:
            out = a.max(axis=axes, keepdims=self.keepdim)  # empty reduced dims were refused (vector_norm)
        elif p == -math.inf:
            out = a.min(axis=axes, keepdims=self.keepdim)
        elif p == 0:
            out = (a != 0).sum(axis=axes, keepdims=self.keepdim).astype(a.dtype)
        elif p == 1:
            out = a.sum(axis=axes, keepdims=self.keepdim)
        elif p == 2:
            out = xp.sqrt((a * a).sum(axis=axes, keepdims=self.keepdim))
        else:
            out = (a ** p).sum(axis=axes, keepdims=self.keepdim) ** (1.0 / p)
        return out.astype(x.dtype, copy=False)

    def backward(self, g):
        x, norm = self.saved_arrays
        p = self.p
        shape = self._input_shapes[0]
        g, norm = _kept(g, shape, self.axes, self.keepdim), _kept(norm, shape, self.axes, self.keepdim)
        tensors = isinstance(x, Tensor)
        sign = _constant_like(x, self.xp.sign(_raw(x)))
        if p == 0:  # no gradient at all (torch's is undefined: x.grad stays None)
            return None
        if p == 1:
            return g * sign
        absx = abs(x)
        nonzero = _constant_like(x, _raw(norm) != 0)
        safe = norm + (1 - nonzero)  # 1 where the norm is 0 (the gradient is 0 there)
        if p in (math.inf, -math.inf):
            hits = _constant_like(x, _raw(absx) == _raw(norm))
            count = hits.sum(dim=self.axes, keepdim=True) if tensors else hits.sum(axis=self.axes, keepdims=True)
            return g * sign * hits / count * nonzero
        if p == 2:
            return g * x / safe * nonzero
        return g * sign * absx ** (p - 1) / safe ** (p - 1) * nonzero

    backward_graph = backward


def _raw(x):
    return x.array if isinstance(x, Tensor) else x


def _constant_like(like, array):
    array = array.astype(like.dtype)
    return Tensor._make(array, like.device) if isinstance(like, Tensor) else array


def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    """torch.linalg.vector_norm: the ``ord``-norm (any real, inf, -inf, 0) of the elements over ``dim`` (None or ():
    every dim); the input must be floating point, ``dtype`` then sets the dtype computed in, as torch."""
    if isinstance(ord, str) or not isinstance(ord, numbers.Real):
        raise op_error("vector_norm", "ord as a number (2, 1, inf, -inf, 0, any real)", f"ord={ord!r}",
                       "use infini_train.norm(x, 'fro') for the Frobenius norm")
    if not backend.is_floating(x.dtype):
        raise op_error("vector_norm", "a floating-point input", f"dtype {x.dtype}", "convert it with .float() first "
                       "(dtype= only sets the dtype a floating-point input is computed in)")
    if dtype is not None:
        x = x.to(dtype)
    dim = reduction.every_dim_if_empty(dim)
    if ord < 0 or ord == math.inf:
        empty = [d for d in _axes(dim, x.ndim) if x.shape[d] == 0] if x.ndim else []
        if empty or (dim is None and x.numel() == 0):
            where = f"dim {empty[0]}" if empty else "every dim"
            raise op_error("vector_norm", f"non-empty reduced dims for ord={ord!r} (it has no value over zero "
                           "elements)", f"an input of shape {tuple(x.shape)} reduced over {where}",
                           "use ord=2, 1 or 0, or reduce over non-empty dims")
    return VectorNorm(float(ord), dim, keepdim).apply(x)


def norm(x, p="fro", dim=None, keepdim=False, dtype=None):
    """torch.norm: "fro" (and 2) is the 2-norm of the elements over ``dim`` (every dim by default); a number is
    that vector norm; "nuc" (a matrix norm) is not supported."""
    if p == "fro" or p is None:
        p = 2
    if p == "nuc":
        raise op_error("norm", "p='fro' or a number", "p='nuc'", "the nuclear norm needs an SVD, which this runtime "
                       "does not provide; compute it with numpy on .numpy()")
    if isinstance(dim, numbers.Integral):
        dim = (dim,)
    return vector_norm(x, p, dim, keepdim, dtype=dtype)

