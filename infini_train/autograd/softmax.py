"""softmax and log_softmax: max-subtracted (stable on rows of ±1e4), computed in at least float32."""
from __future__ import annotations

from .function import Op


def _upcast(x):
    return x.astype("float32") if x.dtype.itemsize < 4 else x


def softmax_array(xp, x, axis):
    """A new array holding softmax(x) along ``axis``, built with in-place ufuncs (one temporary)."""
    out = xp.asarray(_upcast(x) - x.max(axis=axis, keepdims=True))  # asarray: 0-d gives a scalar
    xp.exp(out, out=out)
    out /= out.sum(axis=axis, keepdims=True)
    return out


class Softmax(Op):
    def __init__(self, dim=-1):
        self.dim = dim

    def forward(self, x):
        out = softmax_array(self.xp, x, self.dim).astype(x.dtype, copy=False)
        self.stash(out)
        return out

    def backward(self, g):
        (y,) = self.stashed
        gy = g * y
        gy -= y * gy.sum(axis=self.dim, keepdims=True)
        return gy


class LogSoftmax(Op):
    def __init__(self, dim=-1):
        self.dim = dim

    def forward(self, x):
        xp = self.xp
        shifted = _upcast(x) - x.max(axis=self.dim, keepdims=True)
        lse = xp.log(xp.exp(shifted).sum(axis=self.dim, keepdims=True))
        shifted -= lse
        out = shifted.astype(x.dtype, copy=False)
        self.stash(out)
        return out

    def backward(self, g):
        (y,) = self.stashed
        return g - self.xp.exp(y) * g.sum(axis=self.dim, keepdims=True)


def softmax(x, dim=-1):
    """exp(x) / sum(exp(x)) along ``dim``."""
    return Softmax(dim).apply(x)


def log_softmax(x, dim=-1):
    """x - logsumexp(x) along ``dim``."""
    return LogSoftmax(dim).apply(x)


__all__ = ["softmax", "log_softmax"]
