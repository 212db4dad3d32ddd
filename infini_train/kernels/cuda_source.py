"""Compiling the fused kernels: dtype preludes, a module cache per (kernel family, dtypes), and the switch.

A kernel family's source uses, for each role R it declares (X, W, G, ...), ``R_t`` (the element type),
``LOAD_R(v)`` (to float), ``STORE_R(f)`` (from float) and ``R_IS_<DTYPE>`` (R_IS_BFLOAT16, ...: for instructions that
name the type, as tensor-core products); ``function(family, name, R=dtype, ...)`` prepends those
definitions for the dtypes given (every declared role) and compiles the family once per combination. Options:
``--fmad=false``, so that a kernel rounds each operation as the array code's separate kernels do (the Adam update
is then bit for bit the array code's).
"""
from __future__ import annotations

import os
import warnings

import numpy as np

SOURCES = {}  # family -> source, for the compile check (every dtype combination of a family compiles alike)
ROLES = {}  # family -> the roles its source uses
OPTIONS = ("--std=c++14", "--fmad=false")
_ENABLED = [os.environ.get("INFINI_TRAIN_FUSED_KERNELS", "1") not in ("0", "false", "False", "")]
_MODULES = {}
_FAILED = set()

CONVERSIONS = r"""
#define FOR_EACH(i, n) \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (n); \
         i += (long long)blockDim.x * gridDim.x)
__device__ __forceinline__ float bf16_to_float(unsigned short h) { return __uint_as_float(((unsigned int)h) << 16); }
__device__ __forceinline__ unsigned short float_to_bf16(float f) {  // round to nearest even, NaN stays NaN
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}
__device__ __forceinline__ float f16_to_float(unsigned short h) {
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ unsigned short float_to_f16(float f) {
    unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
__device__ __forceinline__ float block_reduce(float v, float* shared, bool take_max) {
    // over the block (blockDim.x a multiple of 32, at most 1024), in a fixed order: every thread gets the result
    for (int o = 16; o > 0; o >>= 1) {
        float other = __shfl_xor_sync(0xffffffffu, v, o);
        v = take_max ? fmaxf(v, other) : v + other;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < warps ? shared[lane] : (take_max ? __int_as_float(0xff800000) : 0.0f);
        for (int o = 16; o > 0; o >>= 1) {
            float other = __shfl_xor_sync(0xffffffffu, v, o);
            v = take_max ? fmaxf(v, other) : v + other;
        }
        if (lane == 0) shared[32] = v;
    }
    __syncthreads();
    v = shared[32];
    __syncthreads();  // the next reduction may reuse shared
    return v;
}
"""

_TYPES = {  # dtype name -> (C type, load, store)
    "float32": ("float", "({})", "({})"),
    "bfloat16": ("unsigned short", "bf16_to_float({})", "float_to_bf16({})"),
    "float16": ("unsigned short", "f16_to_float({})", "float_to_f16({})"),
}


def enabled():
    return _ENABLED[0]


def set_enabled(on):
    """Turn the fused kernels on or off (the array code runs instead); returns the previous setting."""
    previous, _ENABLED[0] = _ENABLED[0], bool(on)
    return previous


def kernel_dtype(dtype):
    """The name a kernel knows ``dtype`` by, or None for dtypes the kernels leave to the array code."""
    name = np.dtype(dtype).name
    return name if name in _TYPES else None


def prelude(**roles):
    """The definitions of R_t, LOAD_R and STORE_R for each role R = dtype name."""
    lines = [CONVERSIONS]
    for role, dtype in roles.items():
        ctype, load, store = _TYPES[dtype]
        lines.append(f"typedef {ctype} {role}_t;\n#define LOAD_{role}(v) {load.format('(v)')}\n"
                     f"#define STORE_{role}(f) {store.format('(f)')}\n#define {role}_IS_{dtype.upper()} 1")
    return "\n".join(lines) + "\n"


def register(family, roles, source):
    SOURCES[family], ROLES[family] = source, tuple(roles)
    return source


def function(family, name, **roles):
    """The compiled kernel ``name`` of ``family`` for these dtypes, or None (after one warning) where it does not
    compile here: the caller then runs its array code."""
    key = (family, tuple(sorted(roles.items())))
    module = _MODULES.get(key)
    if module is None:
        if key in _FAILED:
            return None
        if sorted(roles) != sorted(ROLES[family]):  # (a cached module's roles were checked when it compiled)
            raise ValueError(f"fused kernel {family}: expected dtypes for the roles {ROLES[family]}, got "
                             f"{sorted(roles)}")
        import cupy

        try:
            module = cupy.RawModule(code=prelude(**roles) + SOURCES[family], options=OPTIONS)
            module.compile()
        except Exception as exc:  # an old GPU or toolkit: the array code still runs
            _FAILED.add(key)
            warnings.warn(f"fused kernel {family} ({roles}) did not compile, the array code runs instead: {exc}",
                          RuntimeWarning, stacklevel=3)
            return None
        _MODULES[key] = module
    return module.get_function(name)


def launch_1d(n, threads=256, most_blocks=8192):
    """(grid, block) of a grid-stride loop over n elements."""
    return (max(1, min(most_blocks, -(-n // threads))),), (threads,)
