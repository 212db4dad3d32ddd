"""Whole tensors out of a sharded checkpoint, one at a time: ``whole_tensor`` assembles one from its saved chunks;
``write_whole_safetensors`` streams a chosen set of them into one safetensors file, holding at most one whole
tensor in memory (the header comes from the metadata's shapes and dtypes, written first)."""
from __future__ import annotations

import json
import struct

import numpy as np

from ...atomic_file import write_atomically
from ...safetensors_io import _numpy_dtype
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
        self.dtype = np.dtype(_numpy_dtype(info["dtype"], directory, entry))

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


def write_whole_safetensors(directory, path, names, file_metadata=None):
    """Write the global tensors ``names`` ({name in the file: entry in the checkpoint}) of the sharded checkpoint
    in ``directory`` to the safetensors file ``path`` (atomically), one tensor in memory at a time."""
    metadata = read_metadata(directory)
    header, offset = {}, 0
    for name, entry in names.items():
        info = metadata["tensors"][entry]
        nbytes = int(np.prod(info["shape"], dtype=np.int64)) * np.dtype(
            _numpy_dtype(info["dtype"], directory, entry)).itemsize
        header[name] = {"dtype": info["dtype"], "shape": list(info["shape"]), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    if file_metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in file_metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)

    def write(tmp):
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for entry in names.values():
                f.write(np.ascontiguousarray(whole_tensor(directory, entry, metadata)).reshape(-1).view(np.uint8).data)

    write_atomically(path, write)
    return path


__all__ = ["whole_tensor", "write_whole_safetensors"]
