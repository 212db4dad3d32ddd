"""dropout: inverted dropout with a seeded keep mask (stashed for backward).

The keep mask is stashed as bool: a quarter of the memory of a scaled float mask. Multiplying by a bool
costs a cast inside the ufunc loop (~0.1 ms on 786k elements, ~1 ms on GPT-2's 3.1M attention weights),
small next to drawing the random numbers (~1.8 ms / ~7 ms).

float16/bfloat16 arrays are scaled in float32 and rounded once; the factor 1/(1-p) is first rounded to their
dtype, as torch's scaled mask is, so the results equal torch's bit for bit."""
from __future__ import annotations

import numbers

import numpy as np

from ... import backend
from ..function import Op, op_error
from .low_precision import narrow
from .softmax import upcast


def keep_mask(xp, device, shape, p):
    """A bool array, True with probability 1 - p, drawn from the device's seeded generator."""
    return backend.generator_for(device).random(shape, dtype=xp.float32) >= p


class Dropout(Op):
    def __init__(self, p):
        self.p = p

    def forward(self, x):
        keep = keep_mask(self.xp, self.device, x.shape, self.p)
        self.stash(keep)
        return self._kept_and_scaled(x, keep)

    def backward(self, g):
        (keep,) = self.stashed
        return self._kept_and_scaled(g, keep)

    def _kept_and_scaled(self, a, keep):
        # torch's factor: 1/(1-p) rounded to a's dtype; for 2-byte dtypes its products are exact in float32
        scale = float(np.asarray(1.0 / (1.0 - self.p), a.dtype))
        out = upcast(a) * scale  # a Python float keeps the float32 (float64) array's dtype
        out *= keep
        return narrow(self.xp, out, a.dtype)


def dropout(x, p=0.5, training=True):
    """Zero each element with probability p and scale the rest by 1/(1-p); identity when not training
    or p == 0, zeros when p == 1. The mask comes from the generator seeded by ``manual_seed``."""
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 <= p <= 1.0:
        raise op_error("dropout", "p in [0, 1]", repr(p), "p is the probability of zeroing an element")
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return x * 0.0
    return Dropout(float(p)).apply(x)


__all__ = ["dropout"]
