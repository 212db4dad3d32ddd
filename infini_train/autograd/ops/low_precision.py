"""float16/bfloat16 kernels as torch computes them: float32 arithmetic, one rounding to the inputs' dtype.

NumPy has no BLAS kernel for 2-byte floats: ``np.matmul`` on float16 runs an element-wise loop ~300x slower than
sgemm (ml_dtypes' bfloat16 matmul ~2x slower than widening), and ufuncs on either convert element by element.
On the host the operands are widened to float32 (exact for both dtypes), computed on with sgemm and float32
ufuncs, and the result is rounded once. cuBLAS multiplies float16/bfloat16 with float32 accumulation itself,
so on GPUs the arrays go to ``xp.matmul`` as they are, except stacks of bfloat16 matrices, which cupy's batched
matmul has no loop for: those go to cuBLAS's strided batched GEMM directly (``matmul``).

Kernels follow one pattern: ``a, b = widen(xp, a, b)``, compute, then ``narrow(xp, result, dtype)`` back to the
inputs' dtype (a no-op wherever nothing was widened).
"""
from __future__ import annotations

import numpy as np

from .cublas_gemm import batched_matmul

__all__ = ["is_low_precision", "has_low_precision_gemm", "widen", "narrow", "matmul"]

_F16_MIN_NORMAL = np.float32(2.0 ** -14)
_F16_INV_SUBNORMAL_STEP = np.float32(2.0 ** 24)  # float16 subnormals are the multiples of 2^-24 below 2^-14
_SAMPLE_STRIDE = 67


def is_low_precision(dtype):
    """float16 or bfloat16 (kind "V" is how numpy sees ml_dtypes' bfloat16)."""
    return dtype.itemsize == 2 and dtype.kind in "fV"


def has_low_precision_gemm(xp):
    """Whether ``xp.matmul`` multiplies float16/bfloat16 with a fast float32-accumulating kernel (cuBLAS)."""
    return xp is not np


def widen(xp, *arrays):
    """The arrays as a kernel should compute on them: float16/bfloat16 as float32 where ``xp`` has no fast
    low-precision GEMM, everything else (and None) unchanged. Returns a tuple, one entry per array."""
    if has_low_precision_gemm(xp):
        return arrays
    return tuple(a.astype(np.float32) if a is not None and is_low_precision(a.dtype) else a for a in arrays)


def narrow(xp, array, dtype):
    """``array`` rounded to ``dtype`` (returned as is when it already has it)."""
    if array.dtype == dtype:
        return array
    if xp is np and dtype == np.float16 and array.dtype == np.float32 and _mostly_subnormal(array):
        return _float16_via_bits(array)
    if xp is np:
        with np.errstate(over="ignore"):  # beyond float16's range is inf, as in torch (a GradScaler expects it)
            return array.astype(dtype)
    return array.astype(dtype)


def matmul(xp, a, b):
    """``xp.matmul(a, b)``; float16/bfloat16 operands of one dtype accumulate in float32 and the product is
    rounded once to their dtype. Operands of other dtypes (or mixed ones) go to ``xp.matmul`` unchanged."""
    if a.dtype != b.dtype or not is_low_precision(a.dtype):
        return xp.matmul(a, b)
    if xp is not np and a.dtype.kind == "V" and (a.ndim > 2 or b.ndim > 2) and a.ndim > 1 and b.ndim > 1:
        return batched_matmul(xp, a, b)
    wide_a, wide_b = widen(xp, a, b)
    return narrow(xp, xp.matmul(wide_a, wide_b), a.dtype)


# numpy's float32 -> float16 cast takes ~45 ns for each element whose result is subnormal (0 < |x| < 2^-14),
# against ~2 ns otherwise: unscaled float16 gradients and small probabilities are mostly subnormal (a 2.4M-element
# weight gradient: 159 ms instead of 4 ms). Where a sample finds more than 1 in 64 of them, the rounding is done
# with float32 and integer ufuncs instead (14 ms there), bit for bit the same as the cast.
def _mostly_subnormal(array):
    magnitude = np.abs(array.flat[::_SAMPLE_STRIDE])
    subnormal = np.count_nonzero((magnitude < _F16_MIN_NORMAL) & (magnitude > 0))  # zeros cast fast
    return subnormal * 64 > magnitude.size


def _float16_via_bits(x):
    """x (float32) rounded to float16 without numpy's slow subnormal cast. Every element gets two candidates:
    the cast of x clamped to the normal range (right for |x| >= 2^-14, inf and nan included), and the subnormal
    pattern round(|x| * 2^24) (rint rounds half to even, as the cast; 1024 is the pattern of 2^-14) with x's
    sign. They are blended by integer arithmetic rather than a mask (xp.where on random masks is slow)."""
    magnitude = np.abs(x)
    tiny = np.less(magnitude, _F16_MIN_NORMAL).view(np.uint8).astype(np.uint16)
    normal = np.copysign(np.maximum(magnitude, _F16_MIN_NORMAL), x).astype(np.float16).view(np.uint16)
    magnitude *= _F16_INV_SUBNORMAL_STEP  # exact: a power of two
    np.rint(magnitude, out=magnitude)
    np.fmin(magnitude, 1024, out=magnitude)  # fmin: NaN gives 1024 too (not a cast of NaN to uint16)
    subnormal = magnitude.astype(np.uint16)
    subnormal |= normal & 0x8000  # the sign bit
    subnormal -= normal  # uint16 arithmetic wraps: normal + tiny * (subnormal - normal) picks one of the two
    subnormal *= tiny
    normal += subnormal
    return normal.view(np.float16)
