"""Shape transforms: reshape/view, transpose, permute, expand, (un)squeeze, flatten, repeat, tril/triu,
masked_fill, repeat_interleave, contiguous.

View ops alias their input and can rebuild themselves from any array laid out like it (``view_of``; see
autograd/views.py). ``view`` is a view or an error, as in torch; ``reshape`` and ``flatten`` are views when the strides
allow (torch's computeStride rule) and real copies otherwise, so a copy never shares the input's version.
"""
from __future__ import annotations

import numbers

import numpy as np

from ... import backend
from ...tensor import Tensor
from ..function import Op, op_error, sum_to
from .indexing import index_add

__all__ = ["reshape", "view", "transpose", "permute", "expand", "squeeze", "unsqueeze", "flatten", "unflatten", "tril",
           "triu",
           "masked_fill", "repeat_interleave", "contiguous", "repeat"]


def _dim(op, dim, ndim):
    """Normalize a (possibly negative) dim into [0, ndim); a 0-d tensor accepts dim 0 and -1 like torch."""
    bound = max(ndim, 1)
    if not isinstance(dim, numbers.Integral) or not -bound <= dim < bound:
        raise op_error(op, f"dim in [{-bound}, {bound - 1}] for a {ndim}-d tensor", f"dim={dim!r}",
                       "negative dims count from the end")
    return int(dim) % bound


def view_strides(shape, strides, new_shape):
    """Strides that let ``new_shape`` view memory laid out as (shape, strides), or None (torch's computeStride)."""
    if not shape:
        return (0,) * len(new_shape)
    if 0 in shape:
        return tuple(0 for _ in new_shape)
    new_strides = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk_base_stride = strides[-1]
    tensor_numel = view_numel = 1
    for tensor_d in range(len(shape) - 1, -1, -1):
        tensor_numel *= shape[tensor_d]
        if tensor_d == 0 or (shape[tensor_d - 1] != 1 and strides[tensor_d - 1] != tensor_numel * chunk_base_stride):
            while view_d >= 0 and (view_numel < tensor_numel or new_shape[view_d] == 1):
                new_strides[view_d] = view_numel * chunk_base_stride
                view_numel *= new_shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if tensor_d > 0:
                chunk_base_stride = strides[tensor_d - 1]
                tensor_numel = view_numel = 1
    return tuple(new_strides) if view_d == -1 else None


def reshape_view(xp, a, shape):
    """``a`` seen with ``shape`` without copying, or None when its strides do not allow it."""
    if a.flags.c_contiguous:
        return a.reshape(shape)
    strides = view_strides(a.shape, a.strides, shape)
    if strides is None:
        return None
    return xp.lib.stride_tricks.as_strided(a, shape, strides)


def _infer_shape(op, shape, size):
    """``shape`` with its -1 (at most one) resolved; an error when it does not hold ``size`` elements."""
    known = 1
    unknown = [i for i, n in enumerate(shape) if n == -1]
    for n in shape:
        if n != -1:
            if n < 0:
                raise op_error(op, "sizes >= 0 (or one -1)", f"shape {shape}")
            known *= n
    if len(unknown) > 1:
        raise op_error(op, "at most one -1 in the shape", f"shape {shape}")
    if unknown:
        if known == 0 or size % known:
            raise op_error(op, f"a shape holding the input's {size} elements", f"shape {shape}",
                           "the -1 dim must divide the remaining elements evenly")
        shape = tuple(size // known if n == -1 else n for n in shape)
    elif known != size:
        raise op_error(op, f"a shape holding the input's {size} elements", f"shape {shape} ({known} elements)",
                       "the product of the sizes must equal the number of elements")
    return shape


class _Reshaping(Op):
    """Same elements in a new shape: backward reshapes the gradient back to the input's shape."""

    is_view = True

    def backward(self, g):
        return g.reshape(self._input_shapes[0])

    backward_graph = backward

    def view_of(self, array):
        return reshape_view(self.xp, array, self.out_shape)


class Reshape(_Reshaping):
    """reshape (``strict`` False: a view when possible, else a copy) or view (``strict``: a view or an error)."""

    def __init__(self, shape, strict=False):
        self.shape = shape
        self.strict = strict

    def forward(self, a):
        op = "view" if self.strict else "reshape"
        shape = self.out_shape = _infer_shape(op, self.shape, a.size)
        out = reshape_view(self.xp, a, shape)
        if out is not None:
            return out
        if self.strict:
            raise op_error("view", f"a shape compatible with the input's strides (input shape {a.shape}, strides "
                           f"{tuple(st // a.itemsize for st in a.strides)})", f"shape {shape}",
                           "view size is not compatible with input tensor's size and stride (at least one dimension "
                           "spans across two contiguous subspaces). Use .reshape(...) instead.")
        self.is_view = False
        return self.xp.ascontiguousarray(a).reshape(shape)


class Squeeze(_Reshaping):
    def __init__(self, dim):
        self.dim = dim

    def forward(self, a):
        if self.dim is None:
            drop = {i for i, n in enumerate(a.shape) if n == 1}
        else:
            dims = self.dim if isinstance(self.dim, (tuple, list)) else (self.dim,)
            # like torch, naming a dim whose size is not 1 leaves it in place
            drop = {d for d in (_dim("squeeze", d, a.ndim) for d in dims) if a.ndim and a.shape[d] == 1}
        self.drop = tuple(sorted(drop))
        self.out_shape = tuple(n for i, n in enumerate(a.shape) if i not in drop)
        return self.xp.squeeze(a, axis=self.drop) if self.drop else a.view()

    def view_of(self, array):
        return self.xp.squeeze(array, axis=self.drop) if self.drop else array.view()


class Unsqueeze(_Reshaping):
    def __init__(self, dim):
        self.dim = dim

    def forward(self, a):
        self.axis = _dim("unsqueeze", self.dim, a.ndim + 1)
        self.out_shape = a.shape[:self.axis] + (1,) + a.shape[self.axis:]
        return self.xp.expand_dims(a, self.axis)

    def view_of(self, array):
        return self.xp.expand_dims(array, self.axis)


class Flatten(_Reshaping):
    def __init__(self, start_dim, end_dim):
        self.start_dim = start_dim
        self.end_dim = end_dim

    def forward(self, a):
        if a.ndim == 0:
            _dim("flatten", self.start_dim, 0)
            _dim("flatten", self.end_dim, 0)
            self.out_shape = (1,)
            return a.reshape(1)
        start, end = _dim("flatten", self.start_dim, a.ndim), _dim("flatten", self.end_dim, a.ndim)
        if start > end:
            raise op_error("flatten", "start_dim <= end_dim", f"start_dim={self.start_dim}, end_dim={self.end_dim}")
        merged = 1
        for n in a.shape[start:end + 1]:
            merged *= n
        shape = self.out_shape = a.shape[:start] + (merged,) + a.shape[end + 1:]
        out = reshape_view(self.xp, a, shape)
        if out is None:
            self.is_view = False
            out = self.xp.ascontiguousarray(a).reshape(shape)
        return out


class Transpose(Op):
    is_view = True

    def __init__(self, dim0, dim1):
        self.dim0 = dim0
        self.dim1 = dim1

    def forward(self, a):
        bound = max(a.ndim, 1)
        for d in (self.dim0, self.dim1):
            if not isinstance(d, numbers.Integral) or not -bound <= d < bound:
                raise op_error("transpose", f"dims in [{-bound}, {bound - 1}] for a {a.ndim}-d tensor",
                               f"dim0={self.dim0}, dim1={self.dim1}", "negative dims count from the end")
        if a.ndim == 0:
            return a.view()
        return self.xp.swapaxes(a, self.dim0, self.dim1)

    def view_of(self, array):
        return self.xp.swapaxes(array, self.dim0, self.dim1) if array.ndim else array.view()

    def backward(self, g):
        return self.xp.swapaxes(g, self.dim0, self.dim1) if g.ndim else g

    def backward_graph(self, g):
        return g.transpose(self.dim0, self.dim1) if g.ndim else g


class Permute(Op):
    is_view = True

    def __init__(self, dims):
        self.dims = dims

    def forward(self, a):
        dims = tuple(_dim("permute", d, a.ndim) for d in self.dims) if a.ndim else tuple(self.dims)
        if sorted(dims) != list(range(a.ndim)):
            raise op_error("permute", f"a permutation of the {a.ndim} dims", f"dims={tuple(self.dims)}",
                           "name every dim exactly once")
        self.dims = dims
        return self.xp.transpose(a, dims)

    def view_of(self, array):
        return self.xp.transpose(array, self.dims)

    def _inverse(self):
        inverse = [0] * len(self.dims)
        for i, d in enumerate(self.dims):
            inverse[d] = i
        return tuple(inverse)

    def backward(self, g):
        return self.xp.transpose(g, self._inverse())

    def backward_graph(self, g):
        return g.permute(self._inverse())


class Expand(Op):
    """A read-only broadcast view; its gradient sums over the broadcast dims."""

    is_view = True

    def __init__(self, shape):
        self.shape = shape

    def forward(self, a):
        shape, lead = self.shape, len(self.shape) - a.ndim
        if lead < 0:
            raise op_error("expand", f"at least {a.ndim} sizes (one per dim of the input)", f"shape={shape}",
                           "new dims may only be added in front")
        target = []
        for i, n in enumerate(shape):
            old = a.shape[i - lead] if i >= lead else None
            if n == -1 and old is None:
                raise op_error("expand", "sizes >= 0 for new leading dims", f"-1 at dim {i} of shape={shape}")
            n = old if n == -1 else n
            if old is not None and old != n and old != 1:
                raise op_error("expand", f"size {old} or any size where the input has 1 (dim {i})",
                               f"size {n} for input shape {a.shape}", "only dims of size 1 can be expanded")
            target.append(n)
        self.target = tuple(target)
        return self.xp.broadcast_to(a, self.target)

    def view_of(self, array):
        return self.xp.broadcast_to(array, self.target)

    def backward(self, g):
        return sum_to(g, self._input_shapes[0])

    backward_graph = backward


class _Triangle(Op):
    def __init__(self, diagonal):
        self.diagonal = diagonal

    def forward(self, a):
        if a.ndim < 2:
            raise op_error(self.op, "a tensor with at least 2 dims (batched over the leading ones)",
                           f"shape {a.shape}")
        return self.keep(a)

    def backward(self, g):
        return self.keep(g)

    def backward_graph(self, g):
        return getattr(g, self.op)(self.diagonal)


class Tril(_Triangle):
    op = "tril"

    def keep(self, a):
        return self.xp.tril(a, self.diagonal)


class Triu(_Triangle):
    op = "triu"

    def keep(self, a):
        return self.xp.triu(a, self.diagonal)


class MaskedFill(Op):
    """x where mask is False, value where it is True. ``value`` may be a 0-d tensor (it then gets a gradient)."""

    def forward(self, a, mask, value):
        xp = self.xp
        mask = xp.asarray(mask)
        if mask.dtype != bool:
            raise op_error("masked_fill", "a bool mask", f"a mask of dtype {mask.dtype}", "compare first, e.g. x == 0")
        try:
            fits = np.broadcast_shapes(mask.shape, a.shape) == a.shape
        except ValueError:
            fits = False
        if not fits:
            raise op_error("masked_fill", f"a mask broadcastable to the input's shape {a.shape}",
                           f"a mask of shape {mask.shape}")
        if backend.is_array_like(value) and value.ndim != 0:
            raise op_error("masked_fill", "a Python scalar or a 0-d tensor as value",
                           f"a value of shape {value.shape}")
        self.stash(mask)
        self.value_dtype = value.dtype if backend.is_array_like(value) else None
        return xp.where(mask, xp.asarray(value, dtype=a.dtype), a)

    def backward(self, g):
        (mask,) = self.stashed
        zero = self.xp.zeros((), g.dtype)
        grad_x = self.xp.where(mask, zero, g) if self.needs_input_grad[0] else None
        grad_value = None
        if self.needs_input_grad[2]:
            grad_value = self.xp.where(mask, g, zero).sum().astype(self.value_dtype)
        return grad_x, None, grad_value

    def backward_graph(self, g):
        (mask,) = self.stashed
        keep = Tensor._make(~mask, g.device)
        grad_x = g * keep if self.needs_input_grad[0] else None
        grad_value = (g - g * keep).sum() if self.needs_input_grad[2] else None
        return grad_x, None, grad_value


class RepeatInterleave(Op):
    def __init__(self, dim):
        self.dim = dim

    def forward(self, a, repeats):
        if self.dim is None or a.ndim == 0:  # dim=None repeats the flattened elements, like torch
            dim = self.dim = 0 if self.dim is None else _dim("repeat_interleave", self.dim, 0)
            a = a.reshape(-1)
        else:
            dim = self.dim = _dim("repeat_interleave", self.dim, a.ndim)
        n = a.shape[dim]
        if isinstance(repeats, (list, tuple)):
            repeats = self.xp.asarray(repeats, dtype=np.int64)
        if backend.is_array_like(repeats):  # an int tensor: its values decide the output size, so read them
            if repeats.dtype.kind not in "iu" or repeats.ndim > 1:
                raise op_error("repeat_interleave", "an int or a 0-d/1-D integer tensor of repeats",
                               f"repeats of dtype {repeats.dtype} and shape {repeats.shape}")
            repeats = [int(r) for r in repeats.reshape(-1).tolist()]
            if len(repeats) == 1:
                repeats = repeats[0]
            elif len(repeats) != n:
                raise op_error("repeat_interleave", f"{n} repeats (one per entry of dim {dim})",
                               f"{len(repeats)} repeats", "pass one repeat count per entry, or a single int")
        if min(repeats if isinstance(repeats, list) else [repeats], default=0) < 0:
            raise op_error("repeat_interleave", "non-negative repeats", f"repeats={repeats}")
        self.repeats = repeats
        return self.xp.repeat(a, repeats, axis=dim)

    def backward(self, g):
        xp, dim, repeats = self.xp, self.dim, self.repeats
        shape = self._input_shapes[0]
        if repeats == 0:
            return xp.zeros(shape, g.dtype), None
        if not isinstance(repeats, list):  # every entry repeated r times: sum the r copies
            n = g.shape[dim] // repeats
            return g.reshape(g.shape[:dim] + (n, repeats) + g.shape[dim + 1:]).sum(axis=dim + 1).reshape(shape), None
        owner = xp.repeat(xp.arange(len(repeats)), repeats)  # output position -> input entry
        grad = xp.zeros(g.shape[:dim] + (len(repeats),) + g.shape[dim + 1:], g.dtype)
        index_add(xp, xp.moveaxis(grad, dim, 0), owner, xp.moveaxis(g, dim, 0))
        return grad.reshape(shape), None

    def backward_graph(self, g):
        """The same sums as recorded ops (double backward): copies summed by a reshape, or gathered by
        ScatterBack, whose own gradient repeats them again."""
        from .indexing import ScatterBack
        xp, dim, repeats = self.xp, self.dim, self.repeats
        shape = self._input_shapes[0]
        if repeats == 0:
            return Tensor._make(xp.zeros(shape, g.dtype), g.device), None
        if not isinstance(repeats, list):
            n = g.shape[dim] // repeats
            return g.reshape(g.shape[:dim] + (n, repeats) + g.shape[dim + 1:]).sum(dim=dim + 1).reshape(shape), None
        owner = xp.repeat(xp.arange(len(repeats)), repeats)
        entries = g.shape[:dim] + (len(repeats),) + g.shape[dim + 1:]
        return ScatterBack((slice(None),) * dim + (owner,), entries, True).apply(g).reshape(shape), None


class Contiguous(Op):
    def forward(self, a):
        return self.xp.ascontiguousarray(a).reshape(a.shape)  # reshape: ascontiguousarray makes 0-d into 1-d

    def backward(self, g):
        return g

    backward_graph = backward


class Repeat(Op):
    """torch's Tensor.repeat: tile the input ``sizes[i]`` times along dim i (leading sizes add new dims)."""

    def __init__(self, sizes):
        self.sizes = sizes

    def forward(self, a):
        if len(self.sizes) < a.ndim:
            raise op_error("repeat", f"at least {a.ndim} repeat counts (one per dim)", f"sizes={self.sizes}",
                           "new dims may be added in front, existing ones cannot be left out")
        if any(n < 0 for n in self.sizes):
            raise op_error("repeat", "non-negative repeat counts", f"sizes={self.sizes}")
        return self.xp.tile(a, self.sizes)

    def backward(self, g):
        shape = self._input_shapes[0]
        padded = (1,) * (len(self.sizes) - len(shape)) + tuple(shape)
        split = []
        for reps, n in zip(self.sizes, padded):
            split += [reps, n]
        axes = tuple(range(0, 2 * len(padded), 2))
        g = g.reshape(tuple(split))
        g = g.sum(dim=axes) if isinstance(g, Tensor) else g.sum(axis=axes)
        return g.reshape(shape)

    backward_graph = backward


def reshape(x, shape):
    """Same data, new shape (one dim may be -1): a view where the strides allow, else a copy."""
    return Reshape(tuple(int(n) for n in shape)).apply(x)


def view(x, shape):
    """The same memory seen with a new shape (one dim may be -1); an error when the strides do not allow it."""
    return Reshape(tuple(int(n) for n in shape), strict=True).apply(x)


def repeat(x, sizes):
    """Tile ``x``: ``sizes[i]`` copies along dim i (more sizes than dims add leading dims), as Tensor.repeat."""
    return Repeat(tuple(int(n) for n in sizes)).apply(x)


def transpose(x, dim0, dim1):
    """Swap two dimensions (a view)."""
    return Transpose(dim0, dim1).apply(x)


def permute(x, dims):
    """Reorder the dimensions: output dim i is input dim ``dims[i]`` (a view)."""
    return Permute(tuple(dims)).apply(x)


def expand(x, shape):
    """Broadcast size-1 dims to ``shape`` without copying (-1 keeps a dim; new dims may be added in front)."""
    return Expand(tuple(int(n) for n in shape)).apply(x)


def squeeze(x, dim=None):
    """Drop dims of size 1: all of them, or those named by ``dim`` (an int or a tuple) that have size 1."""
    return Squeeze(dim).apply(x)


def unsqueeze(x, dim):
    """Insert a dim of size 1 at ``dim`` (in [-ndim-1, ndim])."""
    return Unsqueeze(dim).apply(x)


def flatten(x, start_dim=0, end_dim=-1):
    """Merge dims ``start_dim``..``end_dim`` into one; a 0-d tensor becomes 1-d."""
    return Flatten(start_dim, end_dim).apply(x)


def unflatten(x, dim, sizes):
    """Split dim ``dim`` into ``sizes`` (one of them may be -1): a view, as torch's."""
    d = _dim("unflatten", dim, x.ndim)
    if isinstance(sizes, numbers.Integral) or not all(isinstance(n, numbers.Integral) for n in sizes):
        raise op_error("unflatten", "sizes as a tuple or list of ints", f"sizes={sizes!r}",
                       "x.unflatten(1, (2, 3)) splits dim 1 into 2 x 3")
    sizes = tuple(int(n) for n in sizes)
    length = x.shape[d] if x.ndim else 1
    if not sizes:
        raise op_error("unflatten", "non-empty sizes", "sizes=()", "give the sizes dim is split into, e.g. (2, -1)")
    if sizes.count(-1) > 1:
        raise op_error("unflatten", "at most one -1 in sizes (only one dimension can be inferred)",
                       f"sizes={sizes}")
    known = int(np.prod([n for n in sizes if n != -1]))
    if (-1 in sizes and (known == 0 or length % known)) or (-1 not in sizes and known != length):
        raise op_error("unflatten", f"sizes that multiply up to the size of dim {d} ({length})",
                       f"sizes={list(sizes)}", "one size may be -1 to infer it")
    if -1 in sizes:
        sizes = tuple(length // known if n == -1 else n for n in sizes)
    return reshape(x, x.shape[:d] + sizes + x.shape[d + 1:])


def tril(x, diagonal=0):
    """Keep the lower triangle (on and below ``diagonal``) of the last two dims; zeros elsewhere."""
    return Tril(diagonal).apply(x)


def triu(x, diagonal=0):
    """Keep the upper triangle (on and above ``diagonal``) of the last two dims; zeros elsewhere."""
    return Triu(diagonal).apply(x)


def masked_fill(x, mask, value):
    """``x`` with ``value`` where the bool ``mask`` (broadcastable to x) is True; no gradient flows there."""
    return MaskedFill().apply(x, mask, value)


def repeat_interleave(x, repeats=None, dim=None, *, output_size=None):
    """Repeat each entry along ``dim`` ``repeats`` times (an int, or a 1-D int tensor with one count per entry).
    With dim=None the input is flattened first. ``repeat_interleave(counts)`` alone (a 1-D integer tensor) gives
    each index i repeated counts[i] times, as torch's. ``output_size``, torch's hint of the result's length along
    ``dim``, must be that length."""
    if repeats is None:
        counts = x
        if counts.ndim != 1 or counts.dtype.kind not in "iu":
            raise op_error("repeat_interleave", "a 1-D integer tensor of counts (the one-argument form)",
                           f"a tensor of dtype {counts.dtype} and shape {tuple(counts.shape)}")
        positions = Tensor._make(counts.device.array_module().arange(counts.numel(), dtype=backend.int64),
                                 counts.device)
        return repeat_interleave(positions, counts.reshape(-1), 0, output_size=output_size)
    out = RepeatInterleave(dim).apply(x, repeats)
    if output_size is not None:
        length = out.shape[dim if dim is not None else 0] if out.ndim else 1
        if int(output_size) != length:
            raise op_error("repeat_interleave", f"output_size equal to the result's length ({length})",
                           f"output_size={output_size}", "drop output_size, or pass the sum of the repeats")
    return out


def contiguous(x):
    """``x`` itself when its memory is already C-contiguous, else a contiguous copy (gradient passes through)."""
    flags = x.array.flags
    if flags.c_contiguous:
        return x
    return Contiguous().apply(x)
