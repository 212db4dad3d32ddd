"""Per-rank inputs shared by the collective worker scripts (MPI and NCCL)."""
import numpy as np


def inputs(r, shape, dtype, op="sum"):
    """Rank r's input: small integers for integer dtypes, values near 1 for PRODUCT (no overflow)."""
    rng = np.random.default_rng(1000 + r)
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        return rng.integers(1 if op == "product" else -5, 4 if op == "product" else 6, shape).astype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if op == "product":
        return rng.uniform(0.5, 1.5, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)
