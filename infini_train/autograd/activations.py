"""Activations: sigmoid, relu, gelu (exact and tanh approximation), silu, softplus."""
from __future__ import annotations

import math

from .function import Op, op_error

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _erf(xp, x):
    if xp.__name__ == "numpy":
        from scipy.special import erf
    else:
        from cupyx.scipy.special import erf
    return erf(x)


def _sigmoid(xp, x):
    # 1/(1+exp(-x)) overflows exp for very negative x: use the tanh identity instead
    out = xp.tanh(x * 0.5)
    out += 1
    out *= 0.5
    return out


class Sigmoid(Op):
    def forward(self, x):
        return _sigmoid(self.xp, x)

    def setup_context(self, inputs, output):
        self.save_for_backward(output)

    def backward(self, g):
        (y,) = self.saved_arrays
        return g * y * (1 - y)


class ReLU(Op):
    def forward(self, x):
        out = self.xp.maximum(x, 0)
        self.stash(x > 0)
        return out

    def backward(self, g):
        (positive,) = self.stashed
        return g * positive


class GELU(Op):
    def __init__(self, approximate="none"):
        if approximate not in ("none", "tanh"):
            raise op_error("gelu", "approximate='none' or 'tanh'", repr(approximate))
        self.approximate = approximate

    def forward(self, x):
        xp = self.xp
        if self.approximate == "tanh":
            # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
            t = xp.asarray(x * x)  # asarray: 0-d inputs give numpy scalars, which out= cannot write
            t *= 0.044715
            t += 1
            t *= x
            t *= _SQRT_2_OVER_PI
            xp.tanh(t, out=t)
            self.stash(t)
            out = t + 1
            out *= x
            out *= 0.5
            return out
        cdf = _erf(xp, x * _INV_SQRT_2)
        cdf += 1
        cdf *= 0.5
        self.stash(cdf)
        return x * cdf

    def setup_context(self, inputs, output):
        self.save_for_backward(inputs[0])

    def backward(self, g):
        xp = self.xp
        (x,) = self.saved_arrays
        (aux,) = self.stashed
        if self.approximate == "tanh":
            t = aux
            # d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
            inner = x * x
            inner *= 3 * 0.044715
            inner += 1
            inner *= _SQRT_2_OVER_PI
            inner *= 1 - t * t
            inner *= x
            inner += 1 + t
            inner *= 0.5
            inner *= g
            return inner
        pdf = xp.exp(-0.5 * x * x) * _INV_SQRT_2PI
        return g * (aux + x * pdf)


class SiLU(Op):
    def forward(self, x):
        s = _sigmoid(self.xp, x)
        self.stash(s)
        return x * s

    def setup_context(self, inputs, output):
        self.save_for_backward(inputs[0])

    def backward(self, g):
        (x,) = self.saved_arrays
        (s,) = self.stashed
        return g * s * (1 + x * (1 - s))


class Softplus(Op):
    def __init__(self, beta=1.0, threshold=20.0):
        self.beta = beta
        self.threshold = threshold

    def forward(self, x):
        xp = self.xp
        bx = x * self.beta
        linear = bx > self.threshold
        soft = xp.log1p(xp.exp(xp.where(linear, 0, bx))) / self.beta
        return xp.where(linear, x, soft).astype(x.dtype, copy=False)

    def setup_context(self, inputs, output):
        self.save_for_backward(inputs[0])

    def backward(self, g):
        (x,) = self.saved_arrays
        bx = x * self.beta
        return g * self.xp.where(bx > self.threshold, 1, _sigmoid(self.xp, bx)).astype(g.dtype, copy=False)


def sigmoid(x):
    return Sigmoid().apply(x)


def relu(x):
    return ReLU().apply(x)


def gelu(x, approximate="none"):
    """GELU: exact x * Phi(x), or GPT-2's tanh approximation with approximate='tanh'."""
    return GELU(approximate).apply(x)


def silu(x):
    return SiLU().apply(x)


def softplus(x, beta=1.0, threshold=20.0):
    """log(1 + exp(beta x)) / beta, linear above ``threshold`` (torch semantics)."""
    return Softplus(beta, threshold).apply(x)


__all__ = ["sigmoid", "relu", "gelu", "silu", "softplus"]
