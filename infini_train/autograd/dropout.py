"""dropout: inverted dropout with a seeded keep mask (stashed for backward)."""
from __future__ import annotations

from .. import backend
from .function import Op, op_error


class Dropout(Op):
    def __init__(self, p):
        self.p = p

    def forward(self, x):
        gen = backend.generator_for(self.device)
        keep = gen.random(x.shape, dtype=self.xp.float32) >= self.p
        scale = self.xp.asarray(1.0 / (1.0 - self.p), dtype=x.dtype)
        mask = keep * scale  # the scaled keep mask, in x's dtype
        self.stash(mask)
        return x * mask

    def backward(self, g):
        (mask,) = self.stashed
        return g * mask


def dropout(x, p=0.5, training=True):
    """Zero each element with probability p and scale the rest by 1/(1-p); identity when not training."""
    if not 0.0 <= p <= 1.0:
        raise op_error("dropout", "p in [0, 1]", p)
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return x * 0.0
    return Dropout(p).apply(x)


__all__ = ["dropout"]
