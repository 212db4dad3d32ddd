"""Misc ops: split/chunk, cat/stack, indexing (basic and advanced), gather, index_select."""
from __future__ import annotations

from .function import Op, op_error


def index_add(xp, target, index, values):
    """target[index] += values, accumulating over repeated indices (numpy's add.at; cupyx on GPUs)."""
    if xp.__name__ == "numpy":
        xp.add.at(target, index, values)
    else:
        import cupyx
        cupyx.scatter_add(target, index, values)
    return target


def _dim(dim, ndim, op):
    if not -ndim <= dim < ndim:
        raise op_error(op, f"dim in [{-ndim}, {ndim - 1}]", f"dim={dim}")
    return dim % ndim


class Split(Op):
    def __init__(self, split_size_or_sections, dim=0):
        self.spec = split_size_or_sections
        self.dim = dim

    def forward(self, x):
        dim = self.dim = _dim(self.dim, x.ndim, "split")
        n = x.shape[dim]
        if isinstance(self.spec, int):
            if self.spec <= 0:
                raise op_error("split", "a positive split size", self.spec)
            sizes = [min(self.spec, n - i) for i in range(0, n, self.spec)] or [0]
        else:
            sizes = [int(s) for s in self.spec]
            if sum(sizes) != n:
                raise op_error("split", f"sections summing to the size of dim {dim} ({n})", f"{sizes}",
                               "give a split size or sections that add up exactly")
        bounds = [sum(sizes[:i]) for i in range(1, len(sizes))]
        return tuple(self.xp.split(x, bounds, axis=dim))

    def backward(self, *grads):
        return self.xp.concatenate(grads, axis=self.dim)


class Cat(Op):
    def __init__(self, dim=0):
        self.dim = dim

    def forward(self, *xs):
        _check_same(xs, "cat", stacked=False, dim=self.dim)
        self.dim = _dim(self.dim, xs[0].ndim, "cat")
        self.sizes = [x.shape[self.dim] for x in xs]
        return self.xp.concatenate(xs, axis=self.dim)

    def backward(self, g):
        bounds = [sum(self.sizes[:i]) for i in range(1, len(self.sizes))]
        return tuple(self.xp.split(g, bounds, axis=self.dim))


class Stack(Op):
    def __init__(self, dim=0):
        self.dim = dim

    def forward(self, *xs):
        _check_same(xs, "stack", stacked=True)
        self.dim = _dim(self.dim, xs[0].ndim + 1, "stack")
        return self.xp.stack(xs, axis=self.dim)

    def backward(self, g):
        return tuple(self.xp.moveaxis(g, self.dim, 0))


def _check_same(xs, op, stacked, dim=0):
    if not xs:
        raise op_error(op, "a non-empty sequence of tensors", "an empty sequence")
    first = xs[0]
    for i, x in enumerate(xs[1:], start=1):
        if x.dtype != first.dtype:
            raise op_error(op, "tensors of one dtype", f"tensor 0 is {first.dtype}, tensor {i} is {x.dtype}",
                           "cast with .to(dtype) first")
        same = x.shape == first.shape if stacked else (
            x.ndim == first.ndim and all(a == b for k, (a, b) in enumerate(zip(x.shape, first.shape))
                                         if k != dim % max(first.ndim, 1)))
        if not same:
            what = "equal shapes" if stacked else f"equal shapes except in dim {dim}"
            raise op_error(op, what, f"tensor 0 has shape {first.shape}, tensor {i} has shape {x.shape}")


def _is_basic(index):
    items = index if isinstance(index, tuple) else (index,)
    return all(i is None or i is Ellipsis or isinstance(i, (int, slice)) for i in items)


class GetItem(Op):
    """x[index]. Basic indexing (ints, slices, None, ...) is a view; advanced indexing (integer arrays,
    lists, bool masks) copies, and its backward scatter-adds so repeated indices accumulate."""

    def __init__(self, index):
        self.index = index
        self.is_view = _is_basic(index)

    def forward(self, x):
        index = self.index
        if not self.is_view:
            index = tuple(self._as_array(i) for i in index) if isinstance(index, tuple) else self._as_array(index)
            self.index = index
        try:
            return x[index]
        except IndexError as exc:
            raise op_error("getitem", f"indices within the shape {x.shape}", str(exc)) from None

    def _as_array(self, i):
        if hasattr(i, "array") and hasattr(i, "device"):
            i = i.array
        if isinstance(i, list):
            i = self.xp.asarray(i)
        return i

    def backward(self, g):
        grad = self.xp.zeros(self._input_shapes[0], g.dtype)
        if self.is_view:
            grad[self.index] = g
        else:
            index_add(self.xp, grad, self.index, g)
        return grad


class Gather(Op):
    """torch.gather: out[i][j] = x[i][index[i][j]] along ``dim`` (for dim=1 in 2-D)."""

    def __init__(self, dim):
        self.dim = dim

    def forward(self, x, index):
        self.dim = _dim(self.dim, x.ndim, "gather")
        if index.ndim != x.ndim:
            raise op_error("gather", f"an index with {x.ndim} dims like the input", f"{index.ndim} dims")
        if index.size and (index.min() < 0 or index.max() >= x.shape[self.dim]):
            raise op_error("gather", f"indices in [0, {x.shape[self.dim]})",
                           f"values from {int(index.min())} to {int(index.max())}")
        self.idx = index
        return self.xp.take_along_axis(x, index, axis=self.dim)

    def backward(self, g):
        xp = self.xp
        grad = xp.zeros(self._input_shapes[0], g.dtype)
        grids = list(xp.indices(self.idx.shape, sparse=True))
        grids[self.dim] = self.idx
        index_add(xp, grad, tuple(grids), g)
        return grad, None


class IndexSelect(Op):
    def __init__(self, dim):
        self.dim = dim

    def forward(self, x, index):
        self.dim = _dim(self.dim, x.ndim, "index_select")
        if index.ndim != 1:
            raise op_error("index_select", "a 1-D index", f"an index of shape {index.shape}")
        if index.size and (index.min() < -x.shape[self.dim] or index.max() >= x.shape[self.dim]):
            raise op_error("index_select", f"indices in [0, {x.shape[self.dim]})",
                           f"values from {int(index.min())} to {int(index.max())}")
        self.idx = index
        return self.xp.take(x, index, axis=self.dim)

    def backward(self, g):
        xp = self.xp
        grad = xp.zeros(self._input_shapes[0], g.dtype)
        moved = xp.moveaxis(grad, self.dim, 0)  # a view: adding into it fills grad
        index_add(xp, moved, self.idx, xp.moveaxis(g, self.dim, 0))
        return grad, None


def split(x, split_size_or_sections, dim=0):
    """Split into chunks of ``split_size`` (last may be smaller) or into the given section sizes."""
    out = Split(split_size_or_sections, dim).apply(x)
    return out if isinstance(out, tuple) else (out,)


def chunk(x, chunks, dim=0):
    """torch.chunk: ceil(n / chunks) per piece, so fewer pieces may come back."""
    if chunks <= 0:
        raise op_error("chunk", "a positive number of chunks", chunks)
    n = x.shape[dim]
    size = max(-(-n // chunks), 1)
    return split(x, size, dim)


def cat(tensors, dim=0):
    """Concatenate tensors along an existing dimension."""
    return Cat(dim).apply(*tensors)


concat = cat


def stack(tensors, dim=0):
    """Stack equal-shaped tensors along a new dimension."""
    return Stack(dim).apply(*tensors)


def getitem(x, index):
    return GetItem(index).apply(x)


def gather(x, dim, index):
    """Values of ``x`` at ``index`` along ``dim`` (torch.gather)."""
    return Gather(dim).apply(x, index)


def index_select(x, dim, index):
    """Entries of ``x`` along ``dim`` at the 1-D ``index``."""
    return IndexSelect(dim).apply(x, index)


__all__ = ["split", "chunk", "cat", "concat", "stack", "gather", "index_select"]
