"""Stacks of bfloat16 matrices multiplied on a GPU by cuBLAS's strided batched GEMM (cupy's batched matmul has no
bfloat16 loop): float32 accumulation and one rounding of each product to bfloat16, as cuBLAS does for torch.

cuBLAS is column-major. A row-major matrix X (r x c) is, read column-major, X^T with leading dimension c, so the
row-major product C = A B is computed as C^T = B^T A^T: cuBLAS's first operand is ``b``'s memory, its second
``a``'s. An operand that is the transpose of a contiguous stack (``swapaxes(x, -1, -2)``, as attention's k^T) is
passed with cuBLAS's transpose flag instead of being copied.
"""
from __future__ import annotations

import numpy as np

_OP_N, _OP_T = 0, 1  # cublasOperation_t
_CUDA_R_16BF = 14  # cudaDataType
_COMPUTE_32F = 68  # cublasComputeType_t: CUBLAS_COMPUTE_32F
_GEMM_DEFAULT = -1  # cublasGemmAlgo_t
_ONE = np.ones(1, np.float32)  # alpha and beta, read from the host (cuBLAS's default pointer mode)
_ZERO = np.zeros(1, np.float32)


def _stack(cp, x, batch):
    """(array, transposed): ``x`` broadcast to ``batch`` as one contiguous stack, or, where ``x`` is the transpose
    of such a stack, that stack with transposed=True."""
    if x.shape[:-2] == batch:
        if x.flags.c_contiguous:
            return x, False
        flipped = cp.swapaxes(x, -1, -2)
        if flipped.flags.c_contiguous:
            return flipped, True
    return cp.ascontiguousarray(cp.broadcast_to(x, batch + x.shape[-2:])), False


def batched_matmul(cp, a, b):
    """``a @ b`` for bfloat16 ``a`` (..., m, k) and ``b`` (..., k, n), batch dimensions broadcast."""
    from cupy.cuda import device
    from cupy_backends.cuda.libs import cublas

    (m, k), (k_b, n) = a.shape[-2:], b.shape[-2:]
    if k != k_b:
        raise ValueError(f"matmul: the operands' inner dimensions differ: {a.shape} @ {b.shape}")
    batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    out = cp.empty(batch + (m, n), a.dtype)
    if out.size == 0:
        return out
    if k == 0:
        out.fill(0)
        return out
    a_mem, a_t = _stack(cp, a, batch)
    b_mem, b_t = _stack(cp, b, batch)
    count = out.size // (m * n)
    with a_mem.device:
        cublas.gemmStridedBatchedEx(
            device.get_cublas_handle(), _OP_T if b_t else _OP_N, _OP_T if a_t else _OP_N, n, m, k,
            _ONE.ctypes.data, b_mem.data.ptr, _CUDA_R_16BF, k if b_t else n, k * n,
            a_mem.data.ptr, _CUDA_R_16BF, m if a_t else k, m * k,
            _ZERO.ctypes.data, out.data.ptr, _CUDA_R_16BF, n, m * n,
            count, _COMPUTE_32F, _GEMM_DEFAULT)
    return out
