"""Whole tensors out of a sharded checkpoint, one at a time: ``whole_tensor`` assembles one from its saved chunks,
``SavedTensor`` reads any box of one (only the chunks it overlaps)."""
from __future__ import annotations

import numpy as np

from ...safetensors_io import numpy_dtype
from .pieces import LocalPieces
from .storage import load, read_metadata


def whole_tensor(directory, entry, metadata=None):
    """The global tensor ``entry`` of the sharded checkpoint in ``directory``, assembled (a numpy array)."""
    return SavedTensor(directory, entry, metadata)[...]


class SavedTensor:
    """A global tensor of the sharded checkpoint in ``directory``, read box by box: ``t[a:b, c:d]`` reads only the
    saved chunks the box overlaps (as a MappedArray does for one file)."""

    def __init__(self, directory, entry, metadata=None):
        self.directory, self.entry = directory, entry
        self.metadata = metadata or read_metadata(directory)
        info = self.metadata["tensors"][entry]
        self.shape = tuple(info["shape"])
        self.dtype = np.dtype(numpy_dtype(info["dtype"], directory, entry))

    @property
    def ndim(self):
        return len(self.shape)

    def __getitem__(self, key):
        key = key if isinstance(key, tuple) else (key,)
        if key == (Ellipsis,):
            key = ()
        offsets, sizes = [], []
        for k, n in zip(key + (slice(None),) * (len(self.shape) - len(key)), self.shape):
            if not isinstance(k, slice) or k.step not in (None, 1):
                raise IndexError(f"SavedTensor {self.entry!r}: only boxes (slices with step 1) can be read, got {k!r}")
            start, stop, _ = k.indices(n)
            offsets.append(start)
            sizes.append(max(0, stop - start))
        box = np.zeros(tuple(sizes), self.dtype)
        if box.size:
            load({self.entry: LocalPieces(self.shape, self.dtype, [(tuple(offsets), box)])}, self.directory,
                 metadata=self.metadata)
        return box

    def __array__(self, dtype=None, copy=None):
        whole = self[...]
        return whole if dtype is None else whole.astype(dtype)


__all__ = ["whole_tensor", "SavedTensor"]
