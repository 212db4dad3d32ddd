"""GELU's forward in one pass with 128-bit loads (8 bfloat16/float16 or 4 float32 values per load): the tanh form
in the array code's order of float32 operations (t = ((x x) a + b) x, tanh t, (x t + x) 0.5, with a = sqrt(2/pi)
0.044715 and b = sqrt(2/pi) rounded to float32 as numpy rounds them), the exact form as x * 0.5 erfc(-x / sqrt(2)).
A registry kernel (registry.py); reference/gelu_forward.py is the same arithmetic in NumPy but for tanhf / erfcf
(CUDA's within 2 ulps of the exact values). The backward stays kernels/gelu.py's, which recomputes from x."""
from __future__ import annotations

import math

import numpy as np

from . import registry
from .cuda_source import function, kernel_dtype, launch_1d, register

NAME = "gelu_forward"
TANH_A = np.float32(math.sqrt(2.0 / math.pi) * 0.044715)
TANH_B = np.float32(math.sqrt(2.0 / math.pi))
MINUS_INV_SQRT_2 = np.float32(-1.0 / math.sqrt(2.0))

SOURCE = register("gelu_forward", ("X",), r"""
#define VEC (16 / (int)sizeof(X_t))
union Vec { uint4 raw; X_t v[16 / sizeof(X_t)]; };

__device__ __forceinline__ float gelu(float v, int tanh_form, float a, float b, float minus_inv_sqrt2) {
    if (tanh_form) {
        float t = v * v;
        t = t * a;
        t = t + b;
        t = t * v;
        t = tanhf(t);
        float out = v * t;
        out = out + v;
        return out * 0.5f;
    }
    return v * (0.5f * erfcf(v * minus_inv_sqrt2));
}

// out[i] = gelu(x[i]) for n values: whole 16-byte vectors first, then the n % VEC values after them
extern "C" __global__ void gelu_forward(const X_t* x, X_t* out, long long n, int tanh_form, float a, float b,
                                        float minus_inv_sqrt2) {
    const long long vectors = n / VEC;
    FOR_EACH(i, vectors) {
        Vec in, res;
        in.raw = ((const uint4*)x)[i];
        for (int e = 0; e < VEC; ++e) res.v[e] = STORE_X(gelu(LOAD_X(in.v[e]), tanh_form, a, b, minus_inv_sqrt2));
        ((uint4*)out)[i] = res.raw;
    }
    const long long tail = vectors * VEC + blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (tail < n) out[tail] = STORE_X(gelu(LOAD_X(x[tail]), tanh_form, a, b, minus_inv_sqrt2));
}
""")


def why_not(x):
    if not registry.use(NAME):
        return "off (INFINI_TRAIN_KERNELS does not name it)"
    if isinstance(x, np.ndarray):
        return "host arrays"
    if kernel_dtype(x.dtype) is None or not x.flags.c_contiguous or x.size == 0 or x.data.ptr % 16:
        return f"dtype {x.dtype}, contiguous {x.flags.c_contiguous} (16-byte aligned rows)"
    return None


def forward(cp, x, approximate):
    """gelu(x) in x's dtype, or None where the kernel did not compile."""
    kernel = function("gelu_forward", "gelu_forward", X=x.dtype.name)
    if kernel is None:
        return None
    out = cp.empty_like(x)
    grid, block = launch_1d(max(1, x.size // (16 // x.itemsize)))
    kernel(grid, block, (x, out, np.int64(x.size), np.int32(approximate == "tanh"), TANH_A, TANH_B,
                         MINUS_INV_SQRT_2))
    return out
