"""dropout: inverted dropout with a seeded keep mask (stashed for backward).

The keep mask is stashed as bool: a quarter of the memory of a scaled float mask. Multiplying by a bool
costs a cast inside the ufunc loop (~0.1 ms on 786k elements, ~1 ms on GPT-2's 3.1M attention weights),
small next to drawing the random numbers (~1.8 ms / ~7 ms)."""
from __future__ import annotations

import numbers

from .. import backend
from .function import Op, op_error


def keep_mask(xp, device, shape, p):
    """A bool array, True with probability 1 - p, drawn from the device's seeded generator."""
    return backend.generator_for(device).random(shape, dtype=xp.float32) >= p


class Dropout(Op):
    def __init__(self, p):
        self.p = p

    def forward(self, x):
        keep = keep_mask(self.xp, self.device, x.shape, self.p)
        self.stash(keep)
        out = x * (1.0 / (1.0 - self.p))  # a Python float keeps x's dtype
        out *= keep
        return out

    def backward(self, g):
        (keep,) = self.stashed
        grad = g * (1.0 / (1.0 - self.p))
        grad *= keep
        return grad


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
