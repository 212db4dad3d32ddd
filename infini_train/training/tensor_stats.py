"""Summary statistics and a content hash of one array, computed where the array lives (numpy or cupy), for the
precision checker's entries: one device-to-host transfer of seven 64-bit words per tensor.

min, max, mean and absmax are taken over the finite elements (None when there are none); ``nan`` and ``inf``
count the others. ``hash`` fingerprints the bytes of the array as float32 (float64 arrays: as float64; float16,
bfloat16 and integers are widened to float32 first): 16 hex digits of a position-dependent 64-bit hash computed
with the same integer arithmetic on every device, so equal hashes mean bitwise equal values on CPU and GPU alike.
"""
from __future__ import annotations

import contextlib

import numpy as np

STAT_FIELDS = ("min", "max", "mean", "absmax")
_MASK = (1 << 64) - 1
_K1 = np.uint64(0x9E3779B97F4A7C15)  # golden-ratio increment and splitmix64's multipliers
_K2 = np.uint64(0xBF58476D1CE4E5B9)
_K3 = np.uint64(0x94D049BB133111EB)


def _xp_of(array):
    if isinstance(array, np.ndarray):
        return np
    from ..backend import cupy_module
    return cupy_module()


def _finish(word, size):
    """splitmix64's finaliser of the summed word, with the element count folded in (host integers)."""
    z = (word ^ (size * 0x9E3779B97F4A7C15)) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _hash_words(flat, xp):
    """The wrapping sum of a splitmix-style mix of every 32-bit word of ``flat`` with its position: one uint64."""
    words = flat.view(xp.uint32).astype(xp.uint64)
    x = words ^ (xp.arange(words.size, dtype=xp.uint64) * _K1)
    x = (x ^ (x >> np.uint64(30))) * _K2
    x = (x ^ (x >> np.uint64(27))) * _K3
    x ^= x >> np.uint64(31)
    return x.sum(dtype=xp.uint64)


def tensor_stats(array):
    """{"min", "max", "mean", "absmax", "nan", "inf", "hash"} of a numpy or cupy array (see the module doc)."""
    xp = _xp_of(array)
    wide = np.float64 if array.dtype.itemsize == 8 and array.dtype.kind in "fiu" else np.float32
    device = array.device if xp is not np else contextlib.nullcontext()
    with device:
        flat = xp.ascontiguousarray(array.astype(wide)).reshape(-1)
        size = int(flat.size)
        if size == 0:
            return {"min": None, "max": None, "mean": None, "absmax": None, "nan": 0, "inf": 0,
                    "hash": f"{_finish(0, 0):016x}"}
        values = flat.astype(np.float64)
        finite = xp.isfinite(values)
        kept = xp.where(finite, values, 0.0)
        stats = xp.stack([xp.where(finite, values, np.inf).min(), xp.where(finite, values, -np.inf).max(),
                          kept.sum(), xp.abs(kept).max(), finite.sum().astype(np.float64),
                          xp.isnan(values).sum().astype(np.float64)])
        packed = xp.concatenate([stats.view(xp.uint64), _hash_words(flat, xp).reshape(1)])
        host = packed.get() if xp is not np else packed  # the one transfer
    lo, hi, total, absmax, count, nan = (float(v) for v in host[:6].view(np.float64))
    count, nan = int(count), int(nan)
    return {"min": lo if count else None, "max": hi if count else None, "mean": total / count if count else None,
            "absmax": absmax if count else None, "nan": nan, "inf": size - count - nan,
            "hash": f"{_finish(int(host[6]), size):016x}"}


def dtype_name(dtype):
    """"float32", "bfloat16", ... for a numpy/cupy dtype or a torch dtype (without the "torch." prefix)."""
    name = str(dtype)
    return name[len("torch."):] if name.startswith("torch.") else name


__all__ = ["STAT_FIELDS", "tensor_stats", "dtype_name"]
