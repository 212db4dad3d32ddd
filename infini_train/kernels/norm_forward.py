"""Layer norm's forward in one kernel, optionally after a residual add (llm.c's fused residual + layernorm): one warp
per row reads it with 128-bit loads (8 bfloat16/float16 or 4 float32 values per thread and load), sums it, sums the
squared deviations from the mean, then writes (x - mean) * rstd * weight + bias and the float32 mean and 1/std the
backward kernel (layer_norm.py) reads. With a residual r, x + r is rounded to x's dtype, written out, and normalised
(as the array code's x + r then layer_norm). A registry kernel (registry.py); reference/norm_forward.py is the same
arithmetic in NumPy, bit for bit (no transcendental functions: sqrtf and the division are IEEE).

Lane l of a row's warp visits the row's 16-byte vectors l, l + 32, ..., each vector's values in order; the lanes'
sums meet in the warp's butterfly (16, 8, 4, 2, 1). mean = sum / size, var = sum((x - mean)^2) / size,
rstd = 1 / sqrt(var + eps)."""
from __future__ import annotations

import numpy as np

from . import registry
from .cuda_source import function, kernel_dtype, register

NAME = "layer_norm_forward"
WARPS = 4

SOURCE = register("norm_forward", ("X", "W"), r"""
#define VEC (16 / (int)sizeof(X_t))
union Vec { uint4 raw; X_t v[16 / sizeof(X_t)]; };

__device__ __forceinline__ float warp_sum(float s) {
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    return s;
}

// out = layer_norm(x [+ residual]) over rows of `size` values (a multiple of VEC); with a residual, x + residual
// (rounded to X) is written to sum_out and normalised. weight and bias may be null.
extern "C" __global__ void __launch_bounds__(128) layer_norm_forward(
        const X_t* x, const X_t* residual, X_t* sum_out, const W_t* weight, const W_t* bias, X_t* out,
        float* mean_out, float* rstd_out, long long rows, int size, float eps) {
    const int lane = threadIdx.x & 31;
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;  // the warp leaves as a whole
    const int vectors = size / VEC;
    const uint4* xr = (const uint4*)(x + row * size);
    const uint4* rr = residual ? (const uint4*)(residual + row * size) : 0;
    uint4* sr = residual ? (uint4*)(sum_out + row * size) : 0;
    float s = 0.0f;
    for (int i = lane; i < vectors; i += 32) {
        Vec a;
        a.raw = xr[i];
        if (residual) {
            Vec r;
            r.raw = rr[i];
            for (int e = 0; e < VEC; ++e) a.v[e] = STORE_X(LOAD_X(a.v[e]) + LOAD_X(r.v[e]));
            sr[i] = a.raw;
        }
        for (int e = 0; e < VEC; ++e) s += LOAD_X(a.v[e]);
    }
    const float mean = warp_sum(s) / size;
    const uint4* src = residual ? (const uint4*)sr : xr;  // this lane's own writes: visible to it
    float q = 0.0f;
    for (int i = lane; i < vectors; i += 32) {
        Vec a;
        a.raw = src[i];
        for (int e = 0; e < VEC; ++e) {
            const float d = LOAD_X(a.v[e]) - mean;
            q += d * d;
        }
    }
    const float rstd = 1.0f / sqrtf(warp_sum(q) / size + eps);
    uint4* orow = (uint4*)(out + row * size);
    for (int i = lane; i < vectors; i += 32) {
        Vec a, o;
        a.raw = src[i];
        for (int e = 0; e < VEC; ++e) {
            const int j = i * VEC + e;
            float y = (LOAD_X(a.v[e]) - mean) * rstd;
            if (weight) y = y * LOAD_W(weight[j]);
            if (bias) y = y + LOAD_W(bias[j]);
            o.v[e] = STORE_X(y);
        }
        orow[i] = o.raw;
    }
    if (lane == 0) {
        mean_out[row] = mean;
        rstd_out[row] = rstd;
    }
}
""")


def vector(dtype):
    """Values per 16-byte load."""
    return 16 // np.dtype(dtype).itemsize


def why_not(x, weight, bias, size, residual=None):
    """None where the kernel takes these arrays, else why the array path runs."""
    if not registry.use(NAME):
        return "off (INFINI_TRAIN_KERNELS does not name it)"
    if isinstance(x, np.ndarray):
        return "host arrays"
    if kernel_dtype(x.dtype) is None or (residual is not None and residual.dtype != x.dtype):
        return f"dtype {x.dtype}"
    if not x.flags.c_contiguous or x.size == 0 or size % vector(x.dtype) or x.data.ptr % 16:
        return f"a row of {size} values, contiguous {x.flags.c_contiguous} (rows of 16-byte vectors)"
    if residual is not None and (residual.shape != x.shape or not residual.flags.c_contiguous
                                 or residual.data.ptr % 16):
        return "a residual of another shape or layout"
    params = [p for p in (weight, bias) if p is not None]
    if any(p.dtype != params[0].dtype or p.size != size or not p.flags.c_contiguous for p in params):
        return "weight and bias of different dtypes or layouts"
    if params and kernel_dtype(params[0].dtype) is None:
        return f"weight dtype {params[0].dtype}"
    return None


def layer_norm(cp, x, weight, bias, size, eps, residual=None):
    """(out, mean, rstd) (mean and rstd float32 (rows, 1)), or with a residual (x + residual, out, mean, rstd); None
    where the kernel did not compile."""
    params = [p for p in (weight, bias) if p is not None]
    kernel = function("norm_forward", "layer_norm_forward", X=x.dtype.name,
                      W=params[0].dtype.name if params else x.dtype.name)
    if kernel is None:
        return None
    rows = x.size // size
    out = cp.empty_like(x)
    total = cp.empty_like(x) if residual is not None else None
    mean, rstd = cp.empty((rows, 1), cp.float32), cp.empty((rows, 1), cp.float32)
    null = np.uint64(0)
    kernel((-(-rows // WARPS),), (32 * WARPS,),
           (x, null if residual is None else residual, null if total is None else total,
            null if weight is None else weight, null if bias is None else bias, out, mean, rstd, np.int64(rows),
            np.int32(size), np.float32(eps)))
    return (out, mean, rstd) if residual is None else (total, out, mean, rstd)
