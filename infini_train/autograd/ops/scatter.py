"""Writing values at indices, as torch: scatter / scatter_add / scatter_reduce along a dim by an index tensor,
index_add / index_copy / index_fill along a dim by a list of positions, masked_scatter by a mask, and take.

All but scatter_reduce's prod/amax/amin are indexing in disguise: the index becomes a tuple of integer arrays (one
per dim, ``index`` itself along ``dim``) and the result is ``x + ScatterBack(...)`` (a sum at repeated positions)
or ``IndexPut`` (an overwrite), whose backward and double backward read the same positions back. The in-place
``_`` forms compute out of place and ``copy_`` the result in, recorded as every in-place op is (``in_place``)."""
from __future__ import annotations

import numbers
import warnings

import numpy as np

from ... import backend
from ...tensor import Tensor
from . import inplace
from ..function import Op, op_error
from .indexing import GetItem, IndexPut, ScatterBack, index_add as _add_at

__all__ = ["scatter", "scatter_add", "scatter_reduce", "index_add", "index_copy", "index_fill", "masked_scatter",
           "take"]

REDUCTIONS = ("sum", "prod", "mean", "amax", "amin")


def _dim(op, dim, ndim):
    bound = max(ndim, 1)
    if not isinstance(dim, numbers.Integral) or isinstance(dim, bool) or not -bound <= dim < bound:
        raise op_error(op, f"dim in [{-bound}, {bound - 1}]", f"dim={dim!r}", "negative dims count from the end")
    return int(dim) % bound


def _index_array(op, x, index):
    if not isinstance(index, Tensor) or index.dtype.kind not in "iu":
        got = f"a tensor of dtype {index.dtype}" if isinstance(index, Tensor) else type(index).__name__
        raise op_error(op, "an integer (int64) index tensor", got, "build it with it.tensor([...]) or .long()")
    if index.device is not x.device:
        raise op_error(op, f"the index on the tensor's device ({x.device})", f"an index on {index.device}",
                       "move it with .to(device)")
    return index.array


def _check_range(op, index, size, dim):
    if index.size and (int(index.min()) < 0 or int(index.max()) >= size):
        bad = int(index.min()) if int(index.min()) < 0 else int(index.max())
        raise op_error(op, f"indices in [0, {size}) for dim {dim} of size {size}", f"index {bad}",
                       "check the index against the tensor's shape")


def _grid(op, x, dim, index, src_shape=None):
    """The positions ``x[grid]`` of torch's scatter: grid[d] = index along ``dim``, else the element's own
    coordinate; checks index against x (and src) as torch does."""
    idx = _index_array(op, x, index)
    dim = _dim(op, dim, x.ndim)
    if idx.ndim != max(x.ndim, 1) and not (idx.ndim == 0 and x.ndim == 0):
        raise op_error(op, f"an index with as many dims as the tensor ({x.ndim})", f"an index of shape {idx.shape}")
    if x.ndim == 0:
        _check_range(op, idx, 1, 0)
        return (), dim, idx
    for d, n in enumerate(idx.shape):
        if (d != dim and n > x.shape[d]) or (src_shape is not None and n > src_shape[d]):
            raise op_error(op, f"index sizes <= the tensor's {tuple(x.shape)} in every dim but {dim}"
                           + (f" and <= the source's {tuple(src_shape)}" if src_shape is not None else ""),
                           f"an index of shape {tuple(idx.shape)}")
    _check_range(op, idx, x.shape[dim], dim)
    xp = x.device.array_module()
    grid = []
    for d, n in enumerate(idx.shape):
        grid.append(idx if d == dim else xp.arange(n).reshape((1,) * d + (n,) + (1,) * (idx.ndim - d - 1)))
    return tuple(grid), dim, idx


def _src_part(src, index_shape):
    """The leading block of ``src`` the index covers (torch reads only that much of src)."""
    if tuple(src.shape) == tuple(index_shape):
        return src
    return src[tuple(slice(0, n) for n in index_shape)]


def _same_dtype(op, x, src):
    if src.dtype != x.dtype:
        raise op_error(op, f"src of the tensor's dtype ({x.dtype})", f"src of dtype {src.dtype}",
                       f"convert it with .to({x.dtype})")


def scatter_add(x, dim, index, src):
    """``out = x; out[index[i][j]][j] += src[i][j]`` along ``dim`` (repeated positions add up)."""
    grid, _, idx = _grid("scatter_add", x, dim, index, tuple(src.shape))
    _same_dtype("scatter_add", x, src)
    if x.ndim == 0:
        return x + src
    return x + ScatterBack(grid, tuple(x.shape), True).apply(_src_part(src, idx.shape))


def scatter(x, dim, index, src=None, value=None, *, reduce=None):
    """``out = x; out[index[i][j]][j] = src[i][j]`` (or ``value``, a number) along ``dim``. ``reduce`` ("add" /
    "multiply"), which torch deprecates, is accepted with torch's warning and runs scatter_reduce."""
    if src is not None and not isinstance(src, Tensor):  # scatter(dim, index, 2.0): the value, positionally
        src, value = None, src
    if (src is None) == (value is None):
        raise op_error("scatter", "either src (a tensor) or value (a number)", f"src={src!r}, value={value!r}")
    if reduce is not None:
        if reduce not in ("add", "multiply"):
            raise op_error("scatter", "reduce 'add' or 'multiply'", f"reduce={reduce!r}",
                           "use scatter_reduce for sum, prod, mean, amax and amin")
        warnings.warn("The reduce argument of torch.scatter with Tensor src is deprecated and will be removed in a "
                      "future PyTorch release. Use torch.scatter_reduce instead for more reduction options.",
                      UserWarning, stacklevel=3)
        if src is None:
            src = Tensor._make(x.device.array_module().full(tuple(index.shape), value, x.dtype), x.device)
        return scatter_reduce(x, dim, index, src, "sum" if reduce == "add" else "prod")
    grid, _, idx = _grid("scatter", x, dim, index, tuple(src.shape) if src is not None else None)
    if src is not None:
        _same_dtype("scatter", x, src)
    if x.ndim == 0:
        return src.reshape(()).clone() if src is not None else x * 0 + value
    return IndexPut(grid).apply(x, _src_part(src, idx.shape) if src is not None else value)


# -------------------------------------------------------------------------------------- scatter_reduce
def _at(xp, name, target, index, values):
    """target[index] (op)= values with repeated positions combined, in place."""
    if name == "add":
        return _add_at(xp, target, index, values)
    if xp.__name__ == "numpy":
        getattr(np, name).at(target, index, values)
        return target
    import cupyx
    if name in ("maximum", "minimum"):
        getattr(cupyx, "scatter_max" if name == "maximum" else "scatter_min")(target, index, values)
        return target
    host = xp.asnumpy(target)  # cupy has no multiply.at: combine the products on the host
    np.multiply.at(host, tuple(xp.asnumpy(i) for i in index), xp.asnumpy(values))
    target[...] = xp.asarray(host)
    return target


_COMBINE = {"sum": "add", "mean": "add", "prod": "multiply", "amax": "maximum", "amin": "minimum"}


def _identity(reduce, dtype):
    if reduce in ("sum", "mean"):
        return 0
    if reduce == "prod":
        return 1
    if dtype.kind == "f":
        return -np.inf if reduce == "amax" else np.inf
    info = np.iinfo(dtype)
    return info.min if reduce == "amax" else info.max


def _reduce_into(xp, x, grid, src, reduce, touched, include_self):
    """x with src reduced into x[grid] (x's own values there left out unless ``include_self``); mean is the sum
    before its division."""
    out = x.copy()
    if not include_self:
        out[touched] = _identity(reduce, x.dtype)
    return _at(xp, _COMBINE[reduce], out, grid, src)


class ScatterReduce(Op):
    """torch.scatter_reduce with sum, prod, mean, amax or amin, and its gradients: mean divides by the count of
    values reduced into each position; prod's is exact with zeros (the product of the others); amax/amin share
    the gradient evenly among the values that reach the result."""

    def __init__(self, grid, reduce, include_self):
        self.grid, self.reduce, self.include_self = grid, reduce, include_self

    def setup_context(self, inputs, output):
        self.save_for_backward(inputs[0], inputs[1], output)

    def _counts(self, xp, shape, dtype):
        counts = xp.full(shape, 1 if self.include_self else 0, dtype)
        return _add_at(xp, counts, self.grid, xp.ones(self.src_shape, dtype))

    def forward(self, x, src):
        xp = self.xp
        self.src_shape = src.shape
        self.touched = xp.zeros(x.shape, bool)
        self.touched[self.grid] = True
        out = _reduce_into(xp, x, self.grid, src, self.reduce, self.touched, self.include_self)
        if self.reduce == "mean":
            counts = xp.maximum(self._counts(xp, x.shape, out.dtype), 1)
            out = out // counts if out.dtype.kind in "iu" else out / counts
        return out

    def backward(self, g):
        x, src, out = self.saved_arrays
        xp, grid, reduce = self.xp, self.grid, self.reduce
        keep_self = 1 if self.include_self else (~self.touched).astype(g.dtype)
        if reduce == "sum":
            return g * keep_self, g[grid]
        if reduce == "mean":
            share = g / xp.maximum(self._counts(xp, x.shape, g.dtype), 1)
            return share * keep_self, share[grid]
        if reduce == "prod":
            return self._prod_grads(xp, g, x, src, out, keep_self)
        # amax / amin: the gradient shared evenly by the values equal to the result (torch counts self's value
        # among them even when include_self=False, and then gives self no gradient at the scattered positions)
        self_hits = (x == out).astype(g.dtype)
        src_hits = (src == out[grid]).astype(g.dtype)
        share = g / xp.maximum(_add_at(xp, self_hits.copy(), grid, src_hits), 1)
        return share * self_hits * keep_self, share[grid] * src_hits

    def _prod_grads(self, xp, g, x, src, out, keep_self):
        """torch's: self's gradient from the product with self's zeros taken as 1; a src value's from the product
        of the others (its own zero taken as 1 where it is the only zero reduced into its position)."""
        grid, touched, with_self = self.grid, self.touched, self.include_self
        masked_self = xp.where(x == 0, 1, x)
        grad_self = g * _reduce_into(xp, masked_self, grid, src, "prod", touched, with_self) / masked_self * keep_self
        zeros_at = _add_at(xp, xp.zeros(x.shape, g.dtype), grid, (src == 0).astype(g.dtype))
        single_zero = (src == 0) & (zeros_at[grid] == 1)
        masked_src = xp.where(single_zero, 1, src)
        others_of_zero = (g * _reduce_into(xp, x, grid, masked_src, "prod", touched, with_self))[grid]
        grad_src = xp.where(single_zero, others_of_zero, (g * out)[grid] / xp.where(src == 0, 1, src))
        return grad_self, grad_src


def scatter_reduce(x, dim, index, src, reduce, *, include_self=True):
    """out = x with each ``src[i][j]`` reduced into ``out[index[i][j]][j]`` along ``dim`` by ``reduce`` ("sum", "prod",
    "mean", "amax", "amin"); ``include_self=False`` leaves x's values at the scattered positions out."""
    if reduce not in REDUCTIONS:
        raise op_error("scatter_reduce", f"reduce in {REDUCTIONS}", f"reduce={reduce!r}")
    grid, _, idx = _grid("scatter_reduce", x, dim, index, tuple(src.shape))
    _same_dtype("scatter_reduce", x, src)
    if x.ndim == 0:
        first = (x.device.array_module().zeros(1, backend.int64),)
        return ScatterReduce(first, reduce, bool(include_self)).apply(x.reshape(1), src.reshape(-1)[:1]).reshape(())
    return ScatterReduce(grid, reduce, bool(include_self)).apply(x, _src_part(src, idx.shape))


# ------------------------------------------------------------------------------------ index_* family
def _positions(op, x, dim, index, source_shape=None):
    """x[:, ..., index] along ``dim``: the index tuple, and the shape a source for it must have."""
    dim = _dim(op, dim, x.ndim)
    idx = _index_array(op, x, index)
    if idx.ndim > 1:
        raise op_error(op, "a 0-d or 1-D index", f"an index of shape {tuple(idx.shape)}")
    idx = idx.reshape(-1)
    size = x.shape[dim] if x.ndim else 1
    if idx.size and (int(idx.min()) < -size or int(idx.max()) >= size):
        bad = int(idx.min()) if int(idx.min()) < -size else int(idx.max())
        raise op_error(op, f"indices in [{-size}, {size}) for dim {dim} of size {size}", f"index {bad}")
    idx = idx % size if idx.size else idx
    shape = tuple(x.shape[:dim]) + (idx.size,) + tuple(x.shape[dim + 1:]) if x.ndim else (idx.size,)
    if source_shape is not None and tuple(source_shape) != shape and not (x.ndim == 0 and
                                                                          tuple(source_shape) in ((), (1,))):
        raise op_error(op, f"a source of shape {shape} (the tensor's with dim {dim} of the index's length)",
                       f"a source of shape {tuple(source_shape)}")
    return (slice(None),) * dim + (idx,), shape


def index_add(x, dim, index, source, *, alpha=1):
    """out = x; out[..., index[i], ...] += alpha * source[..., i, ...] along ``dim`` (repeats add up)."""
    if x.ndim == 0:
        return x + source.reshape(()) * alpha
    positions, _ = _positions("index_add", x, dim, index, tuple(source.shape))
    _same_dtype("index_add", x, source)
    return x + ScatterBack(positions, tuple(x.shape), True).apply(source * alpha if alpha != 1 else source)


def index_copy(x, dim, index, source):
    """out = x; out[..., index[i], ...] = source[..., i, ...] along ``dim``."""
    positions, _ = _positions("index_copy", x, dim, index, tuple(source.shape))
    _same_dtype("index_copy", x, source)
    if x.ndim == 0:
        return source.reshape(()).clone()
    return IndexPut(positions).apply(x, source)


def index_fill(x, dim, index, value):
    """out = x with ``value`` (a number or a 0-d tensor) at positions ``index`` along ``dim``."""
    if isinstance(value, Tensor) and value.ndim != 0:
        raise op_error("index_fill", "a number or a 0-d tensor as value", f"a tensor of shape {tuple(value.shape)}")
    positions, _ = _positions("index_fill", x, dim, index)
    if x.ndim == 0:
        return x * 0 + value
    if isinstance(value, Tensor) and value.dtype != x.dtype:
        value = value.to(x.dtype)
    return IndexPut(positions).apply(x, value)


def masked_scatter(x, mask, source):
    """out = x with the positions where ``mask`` (broadcast to x) is True filled, in row-major order, from the
    leading elements of ``source``."""
    if not isinstance(mask, Tensor) or mask.dtype != bool:
        raise op_error("masked_scatter", "a bool mask tensor", getattr(mask, "dtype", type(mask).__name__))
    _same_dtype("masked_scatter", x, source)
    xp = x.device.array_module()
    try:
        where = xp.nonzero(xp.broadcast_to(mask.array, tuple(x.shape)))
    except ValueError:
        raise op_error("masked_scatter", f"a mask broadcastable to {tuple(x.shape)}",
                       f"a mask of shape {tuple(mask.shape)}") from None
    count = int(where[0].size) if where else int(bool(mask.array))
    if count > source.numel():
        raise op_error("masked_scatter", f"a source of at least {count} elements (the mask's True count)",
                       f"{source.numel()} elements")
    if x.ndim == 0:
        return source.reshape(-1)[0].clone() if count else x.clone()
    return IndexPut(tuple(where)).apply(x, source.reshape(-1)[:count])


def take(x, index):
    """x.flatten()[index]: elements by their row-major position, in index's shape (negative counts from the end)."""
    idx = _index_array("take", x, index)
    n = x.numel()
    if idx.size and (int(idx.min()) < -n or int(idx.max()) >= n):
        bad = int(idx.min()) if int(idx.min()) < -n else int(idx.max())
        raise op_error("take", f"indices in [{-n}, {n}) (the tensor has {n} elements)", f"index {bad}")
    return GetItem((idx,)).apply(x.reshape(-1))


def in_place(t, fn, op, *args, **kwargs):
    """``t.op_(...)``: the out-of-place ``fn`` written into t by copy_. When a graph is recorded, ``fn`` reads a
    clone of t, so the values its backward saved are not the ones the write replaces."""
    tensors = [a for a in args if isinstance(a, Tensor)]
    if inplace.needs_graph(t, tensors):
        inplace.check_writable(t, op)
        return inplace.copy(t, fn(t.clone(), *args, **kwargs))
    return inplace.copy(t, fn(t, *args, **kwargs))
