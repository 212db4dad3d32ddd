"""Tensor methods beside the core ones in tensor.py: reordering (flip, roll, rot90, unbind, diff), scatter and index
updates, selection (nonzero, unique, take) and statistics (prod, var/std with ``unbiased``, nansum, logsumexp,
norm, fmod). ``Tensor`` inherits them; each calls the op family that implements it (imported on use: the families
import Tensor)."""
from __future__ import annotations

import numbers

from . import backend
from .memory_format import check_contiguous_format, contiguous_format


def _dims_arg(dims):
    """flip(0, 1) and flip((0, 1)) alike."""
    return tuple(dims[0]) if len(dims) == 1 and not isinstance(dims[0], numbers.Integral) else dims


class TensorMethods:
    __slots__ = ()

    # ----------------------------------------------------------------------------------- layout, size
    @property
    def is_meta(self):
        return self.device is backend.META

    def is_floating_point(self):
        return backend.is_floating(self.array.dtype)

    @property
    def itemsize(self):
        return self.array.dtype.itemsize

    def nelement(self):
        return int(self.array.size)

    def ndimension(self):
        return self.array.ndim

    def stride(self, dim=None):
        """Strides in elements, as torch's (a meta or empty tensor's are those of a contiguous one)."""
        if self.device is backend.META or self.array.size == 0:
            steps, step = [], 1
            for n in reversed(self.array.shape):
                steps.append(step)
                step *= max(n, 1)
            strides = tuple(reversed(steps))
        else:
            size = self.array.dtype.itemsize
            strides = tuple(s // size for s in self.array.strides)
        if dim is None:
            return strides
        if not strides:
            raise IndexError(f"stride: dim {dim!r} given for a 0-d tensor, which has no dims\nHINT: stride() gives ()")
        from .autograd.ops.transform import _dim
        return strides[_dim("stride", dim, len(strides))]

    def storage_offset(self):
        """Elements from the start of this tensor's storage (the array it is a view of) to its first element, as
        torch's: 0 for a tensor that owns its memory."""
        array = self.array
        if self.device is backend.META or array.size == 0:
            return 0
        root = array
        while getattr(root, "base", None) is not None and hasattr(root.base, "strides"):  # the array that owns it
            root = root.base
        return (backend.data_pointer(array) - backend.data_pointer(root)) // array.dtype.itemsize

    def is_contiguous(self, memory_format=contiguous_format):
        check_contiguous_format("is_contiguous", memory_format)
        return self.device is backend.META or bool(self.array.flags.c_contiguous)

    def unflatten(self, dim, sizes):
        from .autograd.ops import transform
        return transform.unflatten(self, dim, sizes)

    # ------------------------------------------------------------------------------------- reordering
    def flip(self, *dims):
        from .autograd.ops import reorder
        return reorder.flip(self, _dims_arg(dims))

    def fliplr(self):
        from .autograd.ops import reorder
        return reorder.fliplr(self)

    def flipud(self):
        from .autograd.ops import reorder
        return reorder.flipud(self)

    def roll(self, shifts, dims=None):
        from .autograd.ops import reorder
        return reorder.roll(self, shifts, dims)

    def rot90(self, k=1, dims=(0, 1)):
        from .autograd.ops import reorder
        return reorder.rot90(self, k, dims)

    def unbind(self, dim=0):
        from .autograd.ops import reorder
        return reorder.unbind(self, dim)

    def diff(self, n=1, dim=-1, prepend=None, append=None):
        from .autograd.ops import reorder
        return reorder.diff(self, n, dim, prepend, append)

    # ---------------------------------------------------------------------------- scatter / index updates
    def scatter_add(self, dim, index, src):
        from .autograd.ops import scatter
        return scatter.scatter_add(self, dim, index, src)

    def scatter_add_(self, dim, index, src):
        from .autograd.ops import scatter
        return scatter.in_place(self, scatter.scatter_add, "scatter_add_", dim, index, src)

    def scatter(self, dim, index, src=None, value=None, *, reduce=None):
        from .autograd.ops import scatter
        return scatter.scatter(self, dim, index, src, value, reduce=reduce)

    def scatter_(self, dim, index, src=None, value=None, *, reduce=None):
        from .autograd.ops import scatter
        return scatter.in_place(self, scatter.scatter, "scatter_", dim, index, src, value, reduce=reduce)

    def scatter_reduce(self, dim, index, src, reduce, *, include_self=True):
        from .autograd.ops import scatter
        return scatter.scatter_reduce(self, dim, index, src, reduce, include_self=include_self)

    def scatter_reduce_(self, dim, index, src, reduce, *, include_self=True):
        from .autograd.ops import scatter
        return scatter.in_place(self, scatter.scatter_reduce, "scatter_reduce_", dim, index, src, reduce,
                                include_self=include_self)

    def index_add(self, dim, index, source, *, alpha=1):
        from .autograd.ops import scatter
        return scatter.index_add(self, dim, index, source, alpha=alpha)

    def index_add_(self, dim, index, source, *, alpha=1):
        from .autograd.ops import scatter
        return scatter.in_place(self, scatter.index_add, "index_add_", dim, index, source, alpha=alpha)

    def index_copy(self, dim, index, source):
        from .autograd.ops import scatter
        return scatter.index_copy(self, dim, index, source)

    def index_copy_(self, dim, index, source):
        from .autograd.ops import scatter
        return scatter.in_place(self, scatter.index_copy, "index_copy_", dim, index, source)

    def index_fill(self, dim, index, value):
        from .autograd.ops import scatter
        return scatter.index_fill(self, dim, index, value)

    def index_fill_(self, dim, index, value):
        from .autograd.ops import scatter
        return scatter.in_place(self, scatter.index_fill, "index_fill_", dim, index, value)

    def masked_scatter(self, mask, source):
        from .autograd.ops import scatter
        return scatter.masked_scatter(self, mask, source)

    def masked_scatter_(self, mask, source):
        from .autograd.ops import scatter
        return scatter.in_place(self, scatter.masked_scatter, "masked_scatter_", mask, source)

    def take(self, index):
        from .autograd.ops import scatter
        return scatter.take(self, index)

    # -------------------------------------------------------------------------------------- selection
    def nonzero(self, *, as_tuple=False):
        from .autograd.ops import selection
        return selection.nonzero(self, as_tuple=as_tuple)

    def argwhere(self):
        from .autograd.ops import selection
        return selection.argwhere(self)

    def count_nonzero(self, dim=None):
        from .autograd.ops import selection
        return selection.count_nonzero(self, dim)

    def unique(self, sorted=True, return_inverse=False, return_counts=False, dim=None):
        from .autograd.ops import selection
        return selection.unique(self, sorted, return_inverse, return_counts, dim)

    # ------------------------------------------------------------------------------------- statistics
    def prod(self, dim=None, keepdim=False, *, dtype=None):
        from .autograd.ops import statistics
        return statistics.prod(self, dim, keepdim, dtype=dtype)

    def var(self, dim=None, unbiased=None, keepdim=False, *, correction=None):
        from .autograd.ops import statistics
        return statistics.var(self, dim, unbiased, keepdim, correction=correction)

    def std(self, dim=None, unbiased=None, keepdim=False, *, correction=None):
        from .autograd.ops import statistics
        return statistics.std(self, dim, unbiased, keepdim, correction=correction)

    def nansum(self, dim=None, keepdim=False, *, dtype=None):
        from .autograd.ops import statistics
        return statistics.nansum(self, dim, keepdim, dtype=dtype)

    def nanmean(self, dim=None, keepdim=False, *, dtype=None):
        from .autograd.ops import statistics
        return statistics.nanmean(self, dim, keepdim, dtype=dtype)

    def logsumexp(self, dim, keepdim=False):
        from .autograd.ops import statistics
        return statistics.logsumexp(self, dim, keepdim)

    def norm(self, p="fro", dim=None, keepdim=False, dtype=None):
        from .autograd.ops import statistics
        return statistics.norm(self, p, dim, keepdim, dtype)

    def fmod(self, other):
        from .autograd.ops import fmod
        return fmod.fmod(self, other)

    def fmod_(self, other):
        from .autograd.ops import fmod, inplace
        return inplace.run(self, fmod.Fmod(), (other,), "fmod_")
