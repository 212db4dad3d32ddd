"""What the kernels' references share: tensor-core products as float32 sums per k-tile, rounding to a kernel's
element type, a warp's butterfly sum and zero-padded tiles.

A tensor-core product (mma.sync m16n8k16, float32 accumulator) adds 16 products of bfloat16/float16 pairs to the
accumulator. Each product is exact in float32 (8 x 8 or 11 x 11 significant bits), but the order and width of the
additions inside one instruction are not specified by NVIDIA (they are not an IEEE float32 sum: the hardware aligns
to the largest exponent and truncates). ``products`` adds each k-tile's 16 products and the accumulator exactly
(float64: exact unless the terms span more than about 2^24 in magnitude) and rounds once to float32, k-tiles in the
kernel's order; the GPU checks allow a few float32 ulps of the accumulated values for that.
"""
from __future__ import annotations

import numpy as np

F32, F64 = np.float32, np.float64
K_TILE = 16


def products(acc, a, b):
    """acc + a @ b as the kernel's tensor-core loop adds it: a (..., M, K), b (..., K, N) hold values of the kernel's
    element type (as float64), acc is float32 (..., M, N); K-tiles of 16 in order, each rounded once."""
    acc = acc.astype(F32, copy=True)
    for k0 in range(0, a.shape[-1], K_TILE):
        acc = (acc.astype(F64) + np.matmul(a[..., k0:k0 + K_TILE], b[..., k0:k0 + K_TILE, :])).astype(F32)
    return acc


def round_to(x, dtype):
    """float32 ``x`` rounded to the kernel's element type (round to nearest even, as its STORE_X), as float64."""
    return np.asarray(x, F32).astype(dtype).astype(F64)


def butterfly_sum(lanes):
    """The sum a warp's __shfl_xor_sync butterfly (16, 8, 4, 2, 1) gives every lane: float32, over the last axis
    (32 lanes)."""
    lanes = np.asarray(lanes, F32)
    index = np.arange(32)
    for mask in (16, 8, 4, 2, 1):
        lanes = lanes + lanes[..., index ^ mask]
    return lanes[..., 0]


def padded_rows(x, start, count, fill=0.0):
    """Rows [start, start + count) of x along axis -2 (a tile), ``fill`` past the end (the kernels' zero-filled
    copies)."""
    rows = x[..., start:start + count, :]
    if rows.shape[-2] == count:
        return rows
    pad = np.full(x.shape[:-2] + (count - rows.shape[-2], x.shape[-1]), fill, x.dtype)
    return np.concatenate([rows, pad], axis=-2)


def padded(x, start, count, fill):
    """Entries [start, start + count) of x along its last axis, ``fill`` past the end."""
    part = x[..., start:start + count]
    if part.shape[-1] == count:
        return part
    return np.concatenate([part, np.full(x.shape[:-1] + (count - part.shape[-1],), fill, x.dtype)], axis=-1)
