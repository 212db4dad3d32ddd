"""The safetensors format read and written directly, bfloat16 included (the safetensors package's numpy API has no
bfloat16): an 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}} (plus
``__metadata__``), then the raw little-endian data. Files are written atomically (temp file, fsync, rename)."""
from __future__ import annotations

import json
import os
import struct

import numpy as np

from . import backend
from .atomic_file import write_atomically

_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": None, "I64": np.int64, "I32": np.int32,
           "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


class SafetensorsError(ValueError):
    """A file that is not valid safetensors: names the file and what is wrong."""


def numpy_dtype(code, path, name):
    """The numpy dtype of a safetensors dtype code (``path`` and ``name`` name the tensor in errors)."""
    if code == "BF16":
        if backend.bfloat16 is None:
            raise SafetensorsError(f"{path}: tensor {name!r} is bfloat16, which needs the ml_dtypes package\n"
                                   "HINT: pip install ml_dtypes")
        return backend.bfloat16
    if code not in _DTYPES:
        raise SafetensorsError(f"{path}: tensor {name!r} has dtype {code!r}; expected one of {sorted(_DTYPES)}")
    return np.dtype(_DTYPES[code])


def dtype_code(dtype):
    """The safetensors dtype code of a numpy dtype ("F32", "BF16", ...)."""
    dtype = np.dtype(dtype)
    if backend.bfloat16 is not None and dtype == backend.bfloat16:
        return "BF16"
    for code, known in _DTYPES.items():
        if known is not None and np.dtype(known) == dtype:
            return code
    raise SafetensorsError(f"safetensors: cannot store dtype {dtype}; expected one of {sorted(_DTYPES)}")


_numpy_dtype, _code = numpy_dtype, dtype_code  # (their earlier names)


def read_header(path):
    """(header dict without __metadata__, metadata dict, data offset) of a safetensors file."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise SafetensorsError(f"{path}: too short to be a safetensors file ({len(raw)} bytes)")
        (length,) = struct.unpack("<Q", raw)
        try:
            header = json.loads(f.read(length))
        except (ValueError, UnicodeDecodeError) as exc:
            raise SafetensorsError(f"{path}: unreadable safetensors header ({exc})") from exc
    metadata = header.pop("__metadata__", {}) or {}
    return header, metadata, 8 + length


def mapped_safetensors(path, names=None):
    """{name: MappedArray} of a safetensors file's tensors (only ``names`` when given); nothing is read but the
    header. Raises SafetensorsError for a tensor whose bytes run past the file's end."""
    from .mapped_arrays import MappedArray

    header, _, base = read_header(path)
    size = os.path.getsize(path)
    out = {}
    for name, info in header.items():
        if names is not None and name not in names:
            continue
        dtype = _numpy_dtype(info["dtype"], path, name)
        start, stop = info["data_offsets"]
        shape = tuple(info["shape"])
        expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if stop - start != expected or base + stop > size:
            raise SafetensorsError(f"{path}: tensor {name!r} of shape {shape} {info['dtype']} needs {expected} bytes, "
                                   f"its offsets give {stop - start} (file {size} bytes): truncated or damaged")
        out[name] = MappedArray(path, base + start, shape, dtype)
    return out


def read_safetensors(path, names=None):
    """{name: numpy array} of the file's tensors (only ``names`` when given), copied out of a memory map."""
    return {name: tensor[...] for name, tensor in mapped_safetensors(path, names).items()}


class Deferred:
    """A tensor ``write_safetensors`` reads only when its turn comes (``read()``: the host array of ``shape`` and
    ``dtype``), so a file of many tensors never holds more than one of them in memory (a checkpoint shard of device
    arrays, or of an optimizer state kept in a file)."""

    def __init__(self, shape, dtype, read):
        self.shape, self.dtype, self.read = tuple(int(n) for n in shape), np.dtype(dtype), read


def _deferred(value):
    if isinstance(value, Deferred):
        return value
    array = np.require(value.numpy() if hasattr(value, "numpy") else value, requirements="C")
    return Deferred(array.shape, array.dtype, lambda: array)  # (np.ascontiguousarray would make a 0-d array 1-d)


def write_safetensors(path, tensors, metadata=None, digest=None):
    """Write {name: array} (numpy, anything with ``.numpy()``, or a Deferred) to ``path`` atomically; ``digest`` (a
    hashlib object) is updated with every byte written, so the file's hash needs no second read."""
    arrays = {name: _deferred(value) for name, value in tensors.items()}
    header, offset = {}, 0
    for name, array in arrays.items():
        nbytes = int(np.prod(array.shape, dtype=np.int64)) * array.dtype.itemsize
        header[name] = {"dtype": _code(array.dtype), "shape": list(array.shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    def write(tmp):
        with open(tmp, "wb") as f:
            def put(block):
                f.write(block)
                if digest is not None:
                    digest.update(block)

            put(struct.pack("<Q", len(text)))
            put(text)
            for name, deferred in arrays.items():
                array = np.require(deferred.read(), deferred.dtype, "C")
                if array.shape != deferred.shape:
                    raise ValueError(f"write_safetensors: {name!r} read as shape {array.shape}, announced "
                                     f"{deferred.shape}")
                put(array.reshape(-1).view(np.uint8).data)  # no copy

    write_atomically(path, write)


__all__ = ["read_safetensors", "mapped_safetensors", "write_safetensors", "Deferred", "read_header",
           "SafetensorsError", "numpy_dtype", "dtype_code"]
