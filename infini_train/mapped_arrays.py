"""Tensors stored in files, read box by box: a ``MappedArray`` knows a tensor's file, byte offset, shape and dtype,
and indexing it (``a[10:20, :64]``) maps just that tensor, copies out the box and unmaps it again, so the pages read
are the box's and a process's memory grows by what it keeps. Weight files (safetensors, llm.c) open as
{name: MappedArray} (safetensors_io.mapped_safetensors, the models' weight readers); a rank that keeps a part of
each tensor reads only that part."""
from __future__ import annotations

import os

import numpy as np


class MappedArray:
    """``MappedArray(path, offset, shape, dtype)``: the C-ordered tensor at byte ``offset`` of ``path``.
    ``.T`` is its transpose (a 2-D tensor stored (in, out), read as (out, in)); ``.row(i)`` the sub-tensor at index
    ``i`` of the first dim (a layer of a stacked tensor); ``.first(n)`` its first ``n`` rows."""

    def __init__(self, path, offset, shape, dtype, transposed=False):
        self.path, self.offset = os.fspath(path), int(offset)
        self.stored_shape, self.dtype = tuple(int(n) for n in shape), np.dtype(dtype)
        self.transposed = transposed

    @property
    def shape(self):
        return self.stored_shape[::-1] if self.transposed else self.stored_shape

    @property
    def ndim(self):
        return len(self.stored_shape)

    @property
    def size(self):
        return int(np.prod(self.stored_shape, dtype=np.int64))

    @property
    def T(self):
        return MappedArray(self.path, self.offset, self.stored_shape, self.dtype, not self.transposed)

    def row(self, i):
        if self.transposed:
            raise ValueError("MappedArray.row: not on a transposed tensor")
        inner = self.stored_shape[1:]
        return MappedArray(self.path, self.offset + i * int(np.prod(inner, dtype=np.int64)) * self.dtype.itemsize,
                           inner, self.dtype)

    def first(self, n):
        if self.transposed:
            raise ValueError("MappedArray.first: not on a transposed tensor")
        return MappedArray(self.path, self.offset, (n,) + self.stored_shape[1:], self.dtype)

    def __getitem__(self, key):
        if not self.size:
            return np.zeros(self.shape, self.dtype)[key]
        stored = np.memmap(self.path, dtype=self.dtype, mode="r", offset=self.offset, shape=self.stored_shape)
        view = stored.T if self.transposed else stored
        return np.array(view[key])  # a copy: the map is dropped when this returns

    def __array__(self, dtype=None, copy=None):
        whole = self[...]
        return whole if dtype is None else whole.astype(dtype)

    def __repr__(self):
        return f"MappedArray({self.path!r}, shape={self.shape}, dtype={self.dtype})"


def read_box(array, offsets, sizes):
    """The box of ``array`` (a MappedArray or an ndarray) at ``offsets`` of ``sizes``, as an ndarray."""
    return np.asarray(array[tuple(slice(o, o + n) for o, n in zip(offsets, sizes))])


__all__ = ["MappedArray", "read_box"]
