"""NumPy reference of the GELU forward kernel (kernels/gelu_forward.py): the kernel's float32 operations in its
order. What it cannot pin down: tanhf and erfcf (CUDA's are within 2 ulps of the exact values; here numpy's float32
tanh, and the exact erfc rounded to float32)."""
from __future__ import annotations

import math

import numpy as np

from ..gelu_forward import MINUS_INV_SQRT_2, TANH_A, TANH_B
from .common import F32

_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def forward(x, approximate):
    v = x.astype(F32)
    if approximate == "tanh":
        t = np.tanh(((v * v) * TANH_A + TANH_B) * v)
        out = (v * t + v) * F32(0.5)
    else:
        out = v * (F32(0.5) * _erfc((v * MINUS_INV_SQRT_2).astype(np.float64)).astype(F32))
    return out.astype(x.dtype)
