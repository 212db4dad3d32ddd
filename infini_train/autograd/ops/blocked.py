"""Element-wise kernels over cache-sized blocks of host arrays.

A kernel written as several ``out=`` ufunc passes over whole arrays streams every array through memory once per
pass; run over blocks of ``BLOCK`` elements, a block's arrays stay in cache across the passes (GPT-2's tanh GELU
at 256 x 3072, forward: 2.4 -> 1.3 ms alone, 2.5 -> 2.1 ms inside the model). Device arrays, small ones and
strided ones run the kernel once over the whole arrays: one ``xp`` code path, and the same bits either way, as
each element's formula is unchanged.
"""
from __future__ import annotations

import numpy as np

BLOCK = 1 << 15  # elements: four float32 arrays of a block take 512 kB


def elementwise(kernel, arrays):
    """Call ``kernel(*pieces)`` over matching flat blocks of the same-shaped ``arrays`` (inputs and ``out=``
    results alike)."""
    first = arrays[0]
    if (not isinstance(first, np.ndarray) or first.size < 2 * BLOCK or len({a.shape for a in arrays}) != 1
            or not all(a.flags.c_contiguous for a in arrays)):
        kernel(*arrays)
        return
    flat = [a.reshape(-1) for a in arrays]
    for start in range(0, first.size, BLOCK):
        kernel(*(a[start:start + BLOCK] for a in flat))
