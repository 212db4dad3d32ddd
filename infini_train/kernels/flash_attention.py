"""Launching the tensor-core attention kernels (flash_attention_source.py) on cupy arrays: ``why_not`` says whether
they take a call (the registry's switch, dtypes, layout, GPU), ``forward`` gives (out, lse), ``backward``
(dq, dk, dv). q is (B, H, Tq, D), k and v (B, Hkv, Tk, D) with H a multiple of Hkv (grouped-query attention, or
one shared head) and D 64 or 128; rows may be strided (as after a transpose of (B, T, H, D)) if each row is
contiguous and 16-byte aligned. out, lse, dq, dk and dv are new contiguous arrays."""
from __future__ import annotations

import numpy as np

from . import registry
from .cuda_source import function
from .flash_attention_source import HEAD_DIMS, ROWS, THREADS, WARPS

NAME = "flash_attention"
DTYPES = ("bfloat16", "float16")
_GOLDEN = 0x9E3779B97F4A7C15  # attention_dropout.py's


def _layout_problem(name, a):
    if a.strides[-1] != a.itemsize:
        return f"{name}'s rows are not contiguous"
    if any(s % 16 for s in a.strides[:-1]) or a.data.ptr % 16:
        return f"{name}'s rows are not 16-byte aligned"
    return None


def why_not(q, k, v, dropout_p=0.0, window=0, causal=False):
    """None where the kernels take these arrays, else the reason the array path runs."""
    if not registry.use(NAME):
        return "off (INFINI_TRAIN_KERNELS does not name it)"
    if isinstance(q, np.ndarray):
        return "host arrays"
    if q.dtype.name not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"dtypes {q.dtype}, {k.dtype}, {v.dtype} (the kernels take one of {DTYPES})"
    if q.ndim != 4 or k.ndim != 4 or k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[-1] != q.shape[-1]:
        return f"shapes q {q.shape}, k {k.shape}, v {v.shape} (the kernels take (B, H, T, D), no broadcast batch)"
    if q.shape[-1] not in HEAD_DIMS:
        return f"head dim {q.shape[-1]} (the kernels take {HEAD_DIMS})"
    if k.shape[1] == 0 or q.shape[1] % k.shape[1] or 0 in q.shape or 0 in k.shape:
        return f"heads q {q.shape[1]}, k {k.shape[1]}, or an empty dim"
    if max(q.shape[2], k.shape[2]) >= 2 ** 31 or q.shape[1] > 65535 or q.shape[0] > 65535:
        return "more than 2^31 - 1 positions or 65535 heads or batches"
    if window and not causal:
        return "a sliding window without causal masking"
    for name, a in (("q", q), ("k", k), ("v", v)):
        problem = _layout_problem(name, a)
        if problem:
            return problem
    import cupy

    if int(cupy.cuda.Device().compute_capability) < 80:
        return "a GPU before sm_80 (no bfloat16 tensor-core products)"
    return None


def ready(dtype, dim):
    """Whether the kernels for this dtype and head dim compile here (they are compiled once, on first use)."""
    return _kernel(dtype, f"attention_forward_d{dim}") is not None


def _kernel(dtype, name):
    return function("flash_attention", name, X=np.dtype(dtype).name)


def _dropout_args(seed, dropout_p):
    """(seed_mix, threshold, rescale): attention_dropout.py's hash constants; threshold 0 is no dropout."""
    if seed is None or dropout_p <= 0.0:
        return np.uint64(0), np.uint64(0), np.float32(1.0)
    return (np.uint64((seed * _GOLDEN) % 2 ** 64), np.uint64(int(dropout_p * 2 ** 53)),
            np.float32(1.0 / (1.0 - dropout_p)))


def _strides(a):
    return tuple(np.int64(s // a.itemsize) for s in a.strides[:3])


def _common_args(q, k, v, scale, causal, window, seed, dropout_p):
    heads, kv_heads = q.shape[1], k.shape[1]
    return ((q, k, v) + _strides(q) + _strides(k) + _strides(v)
            + (np.int32(heads), np.int32(heads // kv_heads), np.int32(q.shape[2]), np.int32(k.shape[2]),
               np.float32(scale), np.int32(bool(causal)), np.int32(window)) + _dropout_args(seed, dropout_p))


def forward(cp, q, k, v, scale, causal=False, window=0, seed=None, dropout_p=0.0):
    """(out (B, H, Tq, D) in q's dtype, lse float32 (B, H, Tq)), or None where the kernel did not compile."""
    batch, heads, tq, dim = q.shape
    kernel = _kernel(q.dtype, f"attention_forward_d{dim}")
    if kernel is None:
        return None
    out = cp.empty(q.shape, q.dtype)
    lse = cp.empty((batch, heads, tq), cp.float32)
    kernel((-(-tq // ROWS), heads, batch), (THREADS,),
           _common_args(q, k, v, scale, causal, window, seed, dropout_p) + (out, lse))
    return out, lse


def backward(cp, q, k, v, out, lse, dout, scale, causal=False, window=0, seed=None, dropout_p=0.0):
    """(dq, dk, dv) shaped as q, k, v in their dtype, from the forward's out and lse; None where the kernels did not
    compile."""
    batch, heads, tq, dim = q.shape
    kernels = [_kernel(q.dtype, name) for name in ("attention_backward_dot", f"attention_backward_dq_d{dim}",
                                                   f"attention_backward_dkdv_d{dim}")]
    if any(kern is None for kern in kernels):
        return None
    dot_kernel, dq_kernel, dkdv_kernel = kernels
    if dout.dtype != q.dtype or _layout_problem("dout", dout):
        dout = cp.ascontiguousarray(dout, dtype=q.dtype)
    rows = batch * heads * tq
    dot = cp.empty((batch, heads, tq), cp.float32)
    dot_kernel((-(-rows // WARPS),), (THREADS,), (dout, *_strides(dout), out, dot, np.int32(heads), np.int32(tq),
                                                  np.int64(rows), np.int32(dim)))
    common = _common_args(q, k, v, scale, causal, window, seed, dropout_p)
    dq = cp.empty(q.shape, q.dtype)
    dk, dv = cp.empty(k.shape, k.dtype), cp.empty(v.shape, v.dtype)
    dq_kernel((-(-tq // ROWS), heads, batch), (THREADS,), common + (dout, *_strides(dout), lse, dot, dq))
    dkdv_kernel((-(-k.shape[2] // ROWS), k.shape[1], batch), (THREADS,),
                common + (dout, *_strides(dout), lse, dot, dk, dv))
    return dq, dk, dv
