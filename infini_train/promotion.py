"""Type promotion with PyTorch's rules, on raw operands (xp arrays, 0-d arrays, Python and NumPy scalars).

Three tiers, highest first: tensors with at least one dim, 0-d tensors, and wrapped numbers (Python or NumPy
scalars). A lower tier decides the dtype only when it is of a higher category (bool < integer < floating):
``float32 tensor * float64 0-d tensor`` is float32, ``int32 tensor + 2.5`` is the default float dtype, and
``int32 tensor + 0-d int64 tensor`` stays int32. Within a tier dtypes promote as usual, except that bfloat16
with float16 gives float32.
"""
from __future__ import annotations

import numbers

import numpy as np

from . import backend

_BOOL, _INT, _FLOAT, _COMPLEX = 0, 1, 2, 3
_promoted: dict = {}


def category(dtype) -> int:
    kind = dtype.kind
    if kind == "b":
        return _BOOL
    if kind in "iu":
        return _INT
    if kind == "c":
        return _COMPLEX
    return _FLOAT  # "f", and "V" for bfloat16


def promote_types(a, b):
    """The smallest dtype both ``a`` and ``b`` convert to (None stands for 'no operand yet')."""
    if a is None:
        return b
    if b is None or a == b:
        return a
    key = (a, b)
    found = _promoted.get(key)
    if found is None:
        ca, cb = category(a), category(b)
        bf16 = backend.bfloat16
        if ca != cb:  # across categories the higher one's dtype wins (torch: int64 + float16 is float16)
            found = a if ca > cb else b
        elif a == bf16 or b == bf16:
            other = b if a == bf16 else a
            found = backend.float32 if other.itemsize <= 4 else other
        else:
            found = np.promote_types(a, b)
        _promoted[key] = found
    return found


def _combine(higher, lower):
    """torch's combine_categories: the higher tier wins unless the lower one is of a higher category."""
    if higher is None:
        return lower
    if lower is None:
        return higher
    ch, cl = category(higher), category(lower)
    if ch >= _FLOAT and ch >= cl:
        return higher
    if ch == _BOOL or cl >= _FLOAT or cl > ch:
        return promote_types(higher, lower)
    return higher


def is_scalar(x) -> bool:
    """A wrapped number: a Python number or a NumPy scalar (not a 0-d array, which is a 0-d tensor)."""
    return isinstance(x, (numbers.Number, np.generic))


def _scalar_dtype(x):
    if isinstance(x, (bool, np.bool_)):
        return backend.bool_
    if isinstance(x, numbers.Integral):
        return backend.int64
    if isinstance(x, numbers.Real):
        return backend.get_default_dtype()
    return np.dtype(np.complex64)


def result_type(*operands):
    """The dtype torch gives an op combining ``operands`` (arrays and scalars; None entries are skipped)."""
    dim = zero = wrapped = None
    for x in operands:
        if x is None:
            continue
        if is_scalar(x):
            wrapped = promote_types(wrapped, _scalar_dtype(x))
        elif x.ndim == 0:
            zero = promote_types(zero, x.dtype)
        else:
            dim = promote_types(dim, x.dtype)
    return _combine(dim, _combine(zero, wrapped))


def can_cast(src, dst) -> bool:
    """torch's canCast for in-place results: never floating to integer/bool, nor integer to bool."""
    return category(src) <= category(dst) or (category(dst) == _FLOAT and category(src) == _FLOAT)


def as_operand(x, dtype):
    """``x`` ready to combine in ``dtype``: arrays cast when they differ, NumPy scalars become Python
    scalars (which keep the array's dtype), Python scalars pass through."""
    if x is None or isinstance(x, numbers.Number) and not isinstance(x, np.generic):
        return x if dtype.kind != "V" else np.asarray(x, dtype)  # numpy computes bfloat16 with scalars in float32
    if isinstance(x, np.generic):
        return x.item() if dtype.kind != "V" else np.asarray(x, dtype)
    return x if x.dtype == dtype else x.astype(dtype)


_SAME_KIND_SCALARS = {"f": (float, int), "i": (int,), "u": (int,)}


def is_low(dtype):
    """float16 or bfloat16: elementwise math on them runs in float32 and rounds once (torch's opmath)."""
    return dtype.itemsize == 2 and dtype.kind in "fV"


def promote_pair(a, b):
    """``(a, b, low)`` ready to combine: the hot path (arrays of one dtype, or an array with a Python scalar that
    keeps its dtype) returns them untouched with low=None. When the result dtype is float16/bfloat16, ``low`` is
    that dtype and the operands come back in float32 (scalars unrounded): compute, then ``.astype(low)``."""
    dtype = getattr(a, "dtype", None)
    if dtype is not None and not is_low(dtype):
        if a.__class__ is not b.__class__:
            if b.__class__ in _SAME_KIND_SCALARS.get(dtype.kind, ()):
                return a, b, None
        elif dtype == getattr(b, "dtype", None) and not isinstance(a, np.generic):
            return a, b, None
    (a, b), dtype, low = promote_for_compute(a, b)
    return a, b, low


def promote_for_compute(*operands):
    """``(operands, result dtype, low)`` as ``promote_pair``, for any number of operands."""
    dtype = result_type(*operands)
    if is_low(dtype):
        return tuple(_in_float32(x) for x in operands), dtype, dtype
    return tuple(as_operand(x, dtype) for x in operands), dtype, None


def _in_float32(x):
    if x is None or isinstance(x, numbers.Number) and not isinstance(x, np.generic):
        return x
    if isinstance(x, np.generic):
        return x.item()
    return x if x.dtype == backend.float32 else x.astype(backend.float32)


def promote_operands(*operands):
    """Every operand converted for the op's computation dtype, and that dtype."""
    first = operands[0]
    dtype = getattr(first, "dtype", None)
    if dtype is not None and dtype.kind != "V" and not isinstance(first, np.generic):
        kind = category(dtype)
        for x in operands[1:]:  # fast path: arrays of one dtype, with Python scalars that keep it
            if x is None:
                continue
            t = type(x)
            if t is float:
                if kind >= _FLOAT:
                    continue
                break
            if t is int:
                if kind >= _INT:
                    continue
                break
            if isinstance(x, np.generic) or getattr(x, "dtype", None) != dtype:
                break
        else:
            return operands, dtype
    dtype = result_type(*operands)
    return tuple(as_operand(x, dtype) for x in operands), dtype


__all__ = ["promote_types", "result_type", "can_cast", "promote_operands", "promote_pair", "promote_for_compute",
           "is_low"]
