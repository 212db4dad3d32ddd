"""Random attention inputs shared by the attention kernels' tests."""
import numpy as np


def attention_inputs(dtype, b, h, hkv, tq, tk, d, seed=0):
    """(q, k, v, output gradient) host arrays of ``dtype``: q and the gradient (b, h, tq, d), k, v (b, hkv, tk, d)."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, h, tq, d)).astype(dtype)
    k, v = (rng.standard_normal((b, hkv, tk, d)).astype(dtype) for _ in range(2))
    return q, k, v, rng.standard_normal(q.shape).astype(dtype)
