"""GELU's backward in one pass (exact erf form or GPT-2's tanh approximation): the slope is recomputed from the
input, times the incoming gradient, instead of the array code's eight passes."""
from __future__ import annotations

import numpy as np

from .cuda_source import enabled, function, kernel_dtype, launch_1d, register

SOURCE = register("gelu", ("X", "G"), r"""
#define SQRT_2_OVER_PI 0.7978845608028654f
#define GELU_CUBIC 0.044715f
#define INV_SQRT_2 0.7071067811865476f
#define INV_SQRT_2PI 0.3989422804014327f

extern "C" __global__ void gelu_backward(const X_t* x, const G_t* g, G_t* dx, long long n, int tanh_form) {
    FOR_EACH(i, n) {
        const float v = LOAD_X(x[i]);
        float d;
        if (tanh_form) {
            // (1 + t) (0.5 + x (1 - t) (0.5 sqrt(2/pi) + 1.5 sqrt(2/pi) 0.044715 x^2))
            const float t = tanhf(v * (SQRT_2_OVER_PI + SQRT_2_OVER_PI * GELU_CUBIC * v * v));
            const float slope = 0.5f * SQRT_2_OVER_PI + 1.5f * SQRT_2_OVER_PI * GELU_CUBIC * v * v;
            d = (1.0f + t) * (0.5f + v * (1.0f - t) * slope);
        } else {
            d = 0.5f * (1.0f + erff(v * INV_SQRT_2)) + v * (expf(-0.5f * v * v) * INV_SQRT_2PI);
        }
        dx[i] = STORE_G(LOAD_G(g[i]) * d);
    }
}
""")


def _ready(*arrays):
    return enabled() and all(kernel_dtype(a.dtype) and a.flags.c_contiguous for a in arrays)


def backward(cp, x, g, approximate):
    """The gradient (g's dtype) of GELU at x, or None where the array code should run."""
    if not _ready(x, g) or x.shape != g.shape:
        return None
    kernel = function("gelu", "gelu_backward", X=x.dtype.name, G=g.dtype.name)
    if kernel is None:
        return None
    dx = cp.empty_like(g)
    grid, block = launch_1d(x.size)
    kernel(grid, block, (x, g, dx, np.int64(x.size), np.int32(approximate == "tanh")))
    return dx
