"""Splitting and joining along a dim: split/chunk (the pieces are views of the input) and cat/stack (dtypes promote)."""
from __future__ import annotations

import numbers

from ...promotion import promote_types
from ...tensor import Tensor
from ..function import Op, ViewInfo, op_error

__all__ = ["split", "chunk", "cat", "concat", "stack"]



def _dim(op, dim, ndim):
    if not isinstance(dim, numbers.Integral) or not -ndim <= dim < ndim:
        raise op_error(op, f"dim in [{-ndim}, {ndim - 1}]", f"dim={dim!r}", "negative dims count from the end")
    return int(dim) % ndim


# ---------------------------------------------------------------------------------------- split / cat
class Split(Op):
    """One node, many outputs, each a view of its region of the input: backward concatenates the output grads
    (zeros for outputs that got none)."""

    is_view = True

    def __init__(self, split_size_or_sections, dim=0):
        self.spec = split_size_or_sections
        self.dim = dim

    def forward(self, x):
        if x.ndim == 0:
            raise op_error("split", "a tensor with at least 1 dim", "a 0-d tensor")
        dim = self.dim = _dim("split", self.dim, x.ndim)
        n = x.shape[dim]
        if isinstance(self.spec, numbers.Integral):
            size = int(self.spec)
            if size <= 0:
                raise op_error("split", "a positive split size", size, "use chunk(n) to get n pieces")
            sizes = [min(size, n - i) for i in range(0, n, size)] or [0]
        else:
            sizes = [int(s) for s in self.spec]
            if sum(sizes) != n or min(sizes, default=0) < 0:
                raise op_error("split", f"non-negative sections summing to the size of dim {dim} ({n})", f"{sizes}",
                               "give a split size or sections that add up exactly")
        bounds = [sum(sizes[:i]) for i in range(1, len(sizes))]
        return tuple(self.xp.split(x, bounds, axis=dim))

    def backward(self, *grads):
        return self.xp.concatenate(grads, axis=self.dim)

    def backward_graph(self, *grads):
        return cat(grads, self.dim)

    def link_views(self, base, outputs, grad_mode):
        start = 0
        for piece in outputs:
            stop = start + piece.shape[self.dim]
            region = (slice(None),) * self.dim + (slice(start, stop), Ellipsis)
            piece._version = base._version
            piece._view = ViewInfo(base, _Region(region), base._version[0], grad_mode)
            start = stop


class _Region:
    """Rebuilds a view given by a basic index (a split piece) from its base."""

    __slots__ = ("index",)

    def __init__(self, index):
        self.index = index

    def view_of(self, array):
        return array[self.index]


class Cat(Op):
    def __init__(self, dim):
        self.dim = dim  # already normalized by cat()

    def forward(self, *xs):
        self.sizes = [x.shape[self.dim] for x in xs]
        return self.xp.concatenate(xs, axis=self.dim)

    def backward(self, g):
        bounds = [sum(self.sizes[:i]) for i in range(1, len(self.sizes))]
        return tuple(self.xp.split(g, bounds, axis=self.dim))

    def backward_graph(self, g):
        return split(g, self.sizes, self.dim)


class Stack(Op):
    def __init__(self, dim):
        self.dim = dim  # already normalized by stack()

    def forward(self, *xs):
        return self.xp.stack(xs, axis=self.dim)

    def backward(self, g):
        return tuple(self.xp.moveaxis(g, self.dim, 0))

    def backward_graph(self, g):
        return tuple(piece.squeeze(self.dim) for piece in split(g, 1, self.dim))


def _check_joinable(op, tensors, dim):
    """Validate the inputs of cat/stack and return ``dim`` normalized; errors name the offending tensor."""
    if not tensors:
        raise op_error(op, "a non-empty sequence of tensors", "an empty sequence")
    first = tensors[0]
    for i, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise op_error(op, "a sequence of Tensors", f"{type(t).__name__} at position {i}",
                           "wrap values with infini_train.tensor(...)")
        if t.device is not first.device:
            raise op_error(op, "tensors on one device", f"tensor 0 on {first.device}, tensor {i} on {t.device}",
                           "move them with .to(device) first")
    if op == "stack":
        for i, t in enumerate(tensors):
            if t.shape != first.shape:
                raise op_error(op, "tensors of equal shape", f"tensor 0 has shape {first.shape}, tensor {i} has "
                               f"shape {t.shape}", "to join along an existing dim with different sizes, use cat")
        return _dim(op, dim, first.ndim + 1)
    if first.ndim == 0:
        raise op_error(op, "tensors with at least 1 dim", "a 0-d tensor at position 0",
                       "use stack to join 0-d tensors, or unsqueeze them first")
    dim = _dim(op, dim, first.ndim)
    for i, t in enumerate(tensors):
        if t.ndim != first.ndim or any(a != b for k, (a, b) in enumerate(zip(t.shape, first.shape)) if k != dim):
            raise op_error(op, f"equal shapes except in dim {dim}",
                           f"tensor 0 has shape {first.shape}, tensor {i} has shape {t.shape}",
                           "sizes must match in every dim but the one joined; reshape or slice first")
    return dim


# ----------------------------------------------------------------------------------- public wrappers
def split(x, split_size_or_sections, dim=0):
    """Split into pieces of ``split_size`` along ``dim`` (the last may be smaller) or into the given section
    sizes. The pieces are views of ``x``."""
    return Split(split_size_or_sections, dim).apply(x)


def chunk(x, chunks, dim=0):
    """torch.chunk: pieces of ceil(n / chunks) along ``dim``, so fewer than ``chunks`` may come back."""
    if not isinstance(chunks, numbers.Integral) or chunks <= 0:
        raise op_error("chunk", "a positive number of chunks", chunks)
    if x.ndim == 0:
        raise op_error("chunk", "a tensor with at least 1 dim", "a 0-d tensor")
    n = x.shape[_dim("chunk", dim, x.ndim)]
    if n == 0:
        return split(x, [0] * chunks, dim)
    return split(x, -(-n // chunks), dim)


def _promoted(tensors):
    """The tensors cast to their common dtype (torch's promotion; each gradient comes back in its own dtype)."""
    dtype = None
    for t in tensors:
        dtype = promote_types(dtype, t.dtype)
    return tuple(t if t.dtype == dtype else t.to(dtype) for t in tensors)


def cat(tensors, dim=0):
    """Concatenate tensors (one device, equal shapes except in ``dim``) along ``dim``; dtypes promote."""
    tensors = tuple(tensors)
    dim = _check_joinable("cat", tensors, dim)
    return Cat(dim).apply(*_promoted(tensors))


concat = cat


def stack(tensors, dim=0):
    """Stack equal-shaped tensors along a new dimension ``dim``; dtypes promote."""
    tensors = tuple(tensors)
    dim = _check_joinable("stack", tensors, dim)
    return Stack(dim).apply(*_promoted(tensors))
