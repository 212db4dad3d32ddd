"""Indexing: ``x[index]`` (basic indexing is a view, advanced indexing copies), index_put (setitem's out-of-place
form), gather and index_select; their backwards scatter-add, so repeated indices accumulate (index_add)."""
from __future__ import annotations

import numbers

from ... import backend
from ...tensor import Tensor
from ..function import Op, op_error, sum_to

__all__ = ["gather", "index_select"]


def index_add(xp, target, index, values):
    """target[index] += values in place, accumulating over repeated indices (numpy's and cupy's ``add.at``).
    ``index`` is anything numpy indexing takes; ``target`` may be a view, the sums land in its base."""
    xp.add.at(target, index, values)
    return target


def _dim(op, dim, ndim):
    if not isinstance(dim, numbers.Integral) or not -ndim <= dim < ndim:
        raise op_error(op, f"dim in [{-ndim}, {ndim - 1}]", f"dim={dim!r}", "negative dims count from the end")
    return int(dim) % ndim


def _check_range(op, index, size, dim):
    """Integer indices must lie in [-size, size) (getitem) or [0, size) (gather, index_select)."""
    if not index.size:
        return
    low = -size if op == "getitem" else 0
    lo, hi = int(index.min()), int(index.max())
    if lo < low or hi >= size:
        bad = lo if lo < low else hi
        raise op_error(op, f"indices in [{low}, {size}) for dim {dim} of size {size}", f"index {bad}",
                       "indices count from 0; check the index against the tensor's shape")


# ------------------------------------------------------------------------------------------ indexing
def _items(index):
    return index if isinstance(index, tuple) else (index,)


def is_basic(index):
    """Ints, slices, None and Ellipsis only: numpy (and torch) return a view."""
    return all(i is None or i is Ellipsis or isinstance(i, slice) or
               (isinstance(i, numbers.Integral) and not isinstance(i, bool)) for i in _items(index))


def host_index(t, index):
    """Index tensors of ``index`` as raw arrays on ``t``'s device; a uint8 index is a mask, as in torch.
    An index tensor on another device is refused, except a host index for a GPU tensor (torch allows it) or for a
    logical CPU device's (they stand for GPUs)."""
    items = _items(index)
    out = []
    for item in items:
        if isinstance(item, Tensor):
            if item.device is not t.device and not (item.device is backend.CPU and t.device.type != "meta"):
                raise op_error("index", f"index tensors on the indexed tensor's device ({t.device})",
                               f"an index tensor on {item.device}", "move the index with .to(device) first")
            item = backend.to_device_array(item.array, t.device)
        if backend.is_array_like(item) and item.dtype == backend.uint8:
            item = item.astype(bool)
        out.append(item)
    return tuple(out) if isinstance(index, tuple) else out[0]


def _as_index_array(xp, i):
    foreign = backend.is_array_like(i) and not isinstance(i, (xp.ndarray, numbers.Integral))  # numpy on a GPU
    if foreign or isinstance(i, (list, tuple)):
        i = xp.asarray(i)
        if i.size == 0 and i.dtype.kind == "f":  # x[[]] selects nothing; asarray([]) says float64
            i = i.astype("int64")
    return i


def normalize_index(xp, index, shape, op="getitem", view=False):
    """Check every index against its dim; bool masks become their nonzero() integer arrays (numpy defines
    mask indexing that way), so backward only meets integers and cupy bounds-checks nothing. A view index
    gets a trailing Ellipsis, which keeps x[0, 1] a 0-d view instead of a numpy scalar."""
    items = [_as_index_array(xp, i) for i in _items(index)]
    used = sum(_dims_used(i) for i in items)
    if used > len(shape):
        raise op_error(op, f"at most {len(shape)} indices for shape {shape}", f"{used} indices")
    out, dim = [], 0
    for item in items:
        if item is None or _is_scalar_bool(item):  # x[True] adds a dim of size 1 and uses none
            out.append(item)
            continue
        if item is Ellipsis:
            dim += len(shape) - used
        elif isinstance(item, slice):
            dim += 1
        elif _is_mask(item):
            if item.shape != shape[dim:dim + item.ndim]:
                raise op_error(op, f"a bool mask of shape {shape[dim:dim + item.ndim]} (dims {dim}..)",
                               f"a mask of shape {item.shape}")
            out.extend(item.nonzero())
            dim += item.ndim
            continue
        elif backend.is_array_like(item):
            if item.dtype.kind not in "iu":
                raise op_error(op, "integer or bool index arrays", f"an index of dtype {item.dtype}",
                               "convert with .long()")
            _check_range("getitem", item, shape[dim], dim)
            dim += 1
        else:
            if not -shape[dim] <= item < shape[dim]:
                raise op_error(op, f"indices in [{-shape[dim]}, {shape[dim]}) for dim {dim} of size "
                               f"{shape[dim]}", f"index {item}", "check the index against the tensor's shape")
            dim += 1
        out.append(item)
    if view and not any(i is Ellipsis for i in out):
        out.append(Ellipsis)
    return tuple(out)


class GetItem(Op):
    """x[index]. Basic indexing (ints, slices, None, ...) is a view; advanced indexing (integer arrays,
    lists, int tensors, bool masks) copies, and its backward scatter-adds so repeated indices accumulate."""

    def __init__(self, index):
        self.index = index
        self.is_view = is_basic(index)

    def forward(self, x):
        self.index = index = normalize_index(self.xp, self.index, x.shape, "getitem", self.is_view)
        return x[index]

    def view_of(self, array):
        return array[self.index]

    def backward(self, g):
        return _scatter_back(self.xp, g, self.index, self._input_shapes[0], not self.is_view)

    def backward_graph(self, g):
        return ScatterBack(self.index, self._input_shapes[0], not self.is_view).apply(g)


def _scatter_back(xp, g, index, shape, accumulate):
    grad = xp.zeros(shape, g.dtype)
    if accumulate:
        index_add(xp, grad, index, g)
    else:
        grad[index] = g
    return grad


class ScatterBack(Op):
    """The backward of ``x[index]`` as a recorded op (double backward): zeros with ``g`` placed (or summed, for
    advanced indices) at ``index``; its own gradient reads ``index`` back."""

    def __init__(self, index, shape, accumulate):
        self.index = index
        self.shape = shape
        self.accumulate = accumulate

    def forward(self, g):
        return _scatter_back(self.xp, g, self.index, self.shape, self.accumulate)

    def backward(self, gg):
        return gg[self.index]

    def backward_graph(self, gg):
        return GetItem(self.index).apply(gg)


class IndexPut(Op):
    """``x`` with ``x[index] = value`` (torch's index_put); ``value`` broadcasts to the selected shape.
    ``index`` is already normalized (normalize_index). The value's gradient is the incoming gradient at every
    selected position, repeated positions included, as torch's."""

    def __init__(self, index):
        self.index = index

    def forward(self, x, value):
        out = x.copy()
        try:
            out[self.index] = value
        except ValueError as exc:
            raise op_error("__setitem__", f"a value broadcastable to the indexed shape {out[self.index].shape}",
                           f"a value of shape {getattr(value, 'shape', ())}",
                           "the value must broadcast to the selected elements' shape") from exc
        return out

    def backward(self, g):
        need_x, need_value = self.needs_input_grad
        grad_x = grad_value = None
        if need_x:
            grad_x = g.copy()
            grad_x[self.index] = 0
        if need_value:
            grad_value = sum_to(g[self.index], self._input_shapes[1])
        return grad_x, grad_value

    def backward_graph(self, g):
        need_x, need_value = self.needs_input_grad
        grad_x = IndexPut(self.index).apply(g, 0.0) if need_x else None
        grad_value = sum_to(GetItem(self.index).apply(g), self._input_shapes[1]) if need_value else None
        return grad_x, grad_value


def _is_mask(i):
    return backend.is_array_like(i) and i.dtype == bool and i.ndim > 0


def _dims_used(i):
    if i is None or i is Ellipsis or _is_scalar_bool(i):
        return 0
    return i.ndim if _is_mask(i) else 1


def _is_scalar_bool(i):
    return isinstance(i, bool) or (backend.is_array_like(i) and i.dtype == bool and i.ndim == 0)


class Gather(Op):
    """torch.gather: out[i][j] = x[i][index[i][j]] along ``dim`` (for dim=1 in 2-D)."""

    def __init__(self, dim):
        self.dim = dim

    def forward(self, x, index):
        dim = self.dim = _dim("gather", self.dim, max(x.ndim, 1))
        if index.ndim != x.ndim or index.dtype.kind not in "iu":
            raise op_error("gather", f"an integer index with {x.ndim} dims like the input",
                           f"an index of dtype {index.dtype} and shape {index.shape}")
        if any(i > n for d, (i, n) in enumerate(zip(index.shape, x.shape)) if d != dim):
            raise op_error("gather", f"index sizes <= the input's {x.shape} in every dim but {dim}",
                           f"an index of shape {index.shape}")
        _check_range("gather", index, x.shape[dim] if x.ndim else 1, dim)
        self.idx = index
        if x.ndim == 0:
            return x[index]  # a 0-d index into a 0-d tensor (must be 0)
        # torch reads only the leading part of the other dims when index is smaller there
        x = x[tuple(slice(None) if d == dim else slice(0, n) for d, n in enumerate(index.shape))]
        return self.xp.take_along_axis(x, index, axis=dim)

    def backward(self, g):
        xp, idx = self.xp, self.idx
        grad = xp.zeros(self._input_shapes[0], g.dtype)
        if grad.ndim == 0:
            return grad + g, None
        grids = [xp.arange(n).reshape((1,) * d + (n,) + (1,) * (idx.ndim - d - 1)) for d, n in enumerate(idx.shape)]
        grids[self.dim] = idx
        index_add(xp, grad, tuple(grids), g)
        return grad, None


class IndexSelect(Op):
    def __init__(self, dim):
        self.dim = dim

    def forward(self, x, index):
        dim = self.dim = _dim("index_select", self.dim, max(x.ndim, 1))
        if index.ndim > 1 or index.dtype.kind not in "iu":
            raise op_error("index_select", "a 0-d or 1-D integer index",
                           f"an index of dtype {index.dtype} and shape {index.shape}")
        index = self.idx = index.reshape(-1)
        _check_range("index_select", index, x.shape[dim] if x.ndim else 1, dim)
        if x.ndim == 0:
            return x.reshape(1)[index].reshape(())
        return self.xp.take(x, index, axis=dim)

    def backward(self, g):
        xp = self.xp
        grad = xp.zeros(self._input_shapes[0], g.dtype)
        if grad.ndim == 0:
            return grad + g, None
        index_add(xp, grad, (slice(None),) * self.dim + (self.idx,), g)
        return grad, None


# ----------------------------------------------------------------------------------- public wrappers
def getitem(x, index):
    """``x[index]`` (Tensor.__getitem__): numpy indexing semantics, basic indexing returns a view."""
    return GetItem(host_index(x, index)).apply(x)


def gather(x, dim, index):
    """Values of ``x`` at ``index`` along ``dim`` (torch.gather); repeated indices accumulate gradient."""
    return Gather(dim).apply(x, index)


def index_select(x, dim, index):
    """Entries of ``x`` along ``dim`` at the 1-D integer ``index`` (repeats allowed)."""
    return IndexSelect(dim).apply(x, index)
