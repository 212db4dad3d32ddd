"""Activations: sigmoid, relu, gelu (exact and tanh approximation), silu, softplus.

Kernels allocate their result once and update it with ``out=`` ufuncs, so each op costs few passes over
memory. Exact GELU needs the normal CDF; numpy has no erf, so ``normal_cdf`` evaluates W. J. Cody's rational
Chebyshev approximations (Math. Comp. 23, 1969; netlib specfun CALERF) with ``xp`` ufuncs: accurate to a few
ulps in float32 and float64, on CPU and GPU alike. float16/bfloat16 inputs of sigmoid, gelu and silu are
computed on in float32 and their results (gradients too) rounded once, as torch does.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from ...kernels import gelu as gelu_kernels
from ...kernels import gelu_forward
from .blocked import elementwise
from ..function import Op, op_error
from .low_precision import narrow
from .softmax import ignore_overflow, upcast

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_CUBIC = 0.044715
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_INV_SQRT_PI = 1.0 / math.sqrt(math.pi)

# Cody's coefficients: erfc(y) = exp(-y^2) R2(y) on (0.46875, 4]; erfc(y) = exp(-y^2) / y (1/sqrt(pi) -
# R3(1/y^2) / y^2) above 4. Numerator, denominator, highest power first.
_R2 = ((2.15311535474403846e-8, 5.64188496988670089e-1, 8.88314979438837594e00, 6.61191906371416295e01,
        2.98635138197400131e02, 8.81952221241769090e02, 1.71204761263407058e03, 2.05107837782607147e03,
        1.23033935479799725e03),
       (1.0, 1.57449261107098347e01, 1.17693950891312499e02, 5.37181101862009858e02, 1.62138957456669019e03,
        3.29079923573345963e03, 4.36261909014324716e03, 3.43936767414372164e03, 1.23033935480374942e03))
_R3 = ((1.63153871373020978e-2, 3.05326634961232344e-1, 3.60344899949804439e-1, 1.25781726111229246e-1,
        1.60837851487422766e-2, 6.58749161529837803e-4),
       (1.0, 2.56852019228982242e00, 1.87295284992346047e00, 5.27905102951428412e-1, 6.05183413124413191e-2,
        2.33520497626869185e-3))


def _rational(xp, coeffs, z):
    """num(z) / den(z) by Horner's rule, in place on two new arrays."""
    result = []
    for poly in coeffs:
        acc = z * poly[0]
        for c in poly[1:-1]:
            acc += c
            acc *= z
        acc += poly[-1]
        result.append(acc)
    num, den = result
    num /= den
    return num


def _exp_minus_square(xp, a, scale_sq):
    # exp(-scale_sq a^2) as exp(-scale_sq s^2) exp(-scale_sq (a-s)(a+s)), s = a rounded down to 1/16: s^2 is
    # exact, so the rounding error of a^2 is not amplified by the steep exponential (Cody's trick). Taking
    # a = |x| (not |x| / sqrt(2)) keeps the rounding of the scaled argument out of the normal CDF's tail.
    s = xp.multiply(a, 16.0)
    xp.floor(s, out=s)
    s *= 0.0625
    d = xp.subtract(a, s)
    d *= a + s
    s *= s
    s *= -scale_sq
    xp.exp(s, out=s)
    d *= -scale_sq
    xp.exp(d, out=d)
    s *= d
    return s


def _erfc_scaled(xp, a, scale, scale_sq):
    """erfc(scale * a) for 1-d a in [0, 40]: small relative error also in the far tail (where 1 - erf fails).

    Cody's erfc rational for (0.46875, 4] stays within 5e-12 (relative) of erfc when extended down to 0 and up
    to 8 (checked against math.erfc), so it serves every element; the rare ones above 4 get the asymptotic
    form, which is what double precision needs out there.
    """
    y = a * scale
    out = _rational(xp, _R2, y)
    out *= _exp_minus_square(xp, a, scale_sq)
    (far,) = xp.nonzero(y > 4.0)
    if far.size:
        v, af = y[far], a[far]
        inv_sq = 1 / (v * v)
        tail = _rational(xp, _R3, inv_sq)
        tail *= inv_sq
        xp.subtract(_INV_SQRT_PI, tail, out=tail)
        tail /= v
        out[far] = _exp_minus_square(xp, af, scale_sq) * tail
    return out


def normal_cdf(xp, x):
    """Phi(x) = 0.5 erfc(-x / sqrt(2)): the standard normal CDF, accurate in both tails."""
    a = xp.abs(x).reshape(-1)
    xp.minimum(a, 40.0, out=a)  # Phi(-40) underflows even float64; keeps inf out of the arithmetic (NaN stays)
    tail = _erfc_scaled(xp, a, _INV_SQRT_2, 0.5).reshape(x.shape)
    tail *= 0.5  # = Phi(-|x|)
    # Phi(x) = tail where x < 0, else 1 - tail; as tail + [x >= 0] (1 - 2 tail), since xp.where with a mask of
    # random signs costs ~20x a multiply on CPU (branch mispredictions: 3.1 ms vs 0.15 ms for 256x3072)
    out = xp.multiply(tail, -2.0)
    out += 1
    out *= x >= 0
    out += tail
    return out


def _new(xp, like):
    """An uninitialised array shaped like ``like``: the ``out=`` of the first ufunc (0-d inputs stay arrays)."""
    return xp.empty(like.shape, like.dtype)


def sigmoid_array(xp, x):
    """1 / (1 + exp(-x)) in one new array."""
    out = xp.negative(x, out=_new(xp, x))
    with ignore_overflow(xp):  # 1 / (1 + inf) == 0 is the intended result
        xp.exp(out, out=out)
    out += 1
    xp.reciprocal(out, out=out)
    return out


class Sigmoid(Op):
    def forward(self, x):
        return narrow(self.xp, sigmoid_array(self.xp, upcast(x)), x.dtype)

    def setup_context(self, inputs, output):
        self.save_for_backward(output)

    def backward(self, g):
        (y,) = self.saved_arrays
        y = upcast(y)
        grad = self.xp.subtract(1, y, out=_new(self.xp, y))  # dy/dx = y (1 - y)
        grad *= y
        grad *= g
        return narrow(self.xp, grad, g.dtype)

    def backward_graph(self, g):
        (y,) = self.saved_tensors
        return g * y * (1 - y)


class ReLU(Op):
    def forward(self, x):
        return self.xp.maximum(x, 0)

    def setup_context(self, inputs, output):
        self.save_for_backward(output)  # y > 0 exactly where x > 0; the output is kept alive downstream anyway

    def backward(self, g):
        (y,) = self.saved_arrays
        return g * (y > 0)  # not xp.where: on CPU a multiply by the mask is ~20x faster for random signs

    def backward_graph(self, g):
        (y,) = self.saved_arrays
        return g * _constant(g, y.array > 0)


class GELU(Op):
    def __init__(self, approximate="none"):
        if approximate not in ("none", "tanh"):
            raise op_error("gelu", "approximate='none' or 'tanh'", repr(approximate),
                           "'tanh' is GPT-2's approximation; 'none' is the exact x * Phi(x)")
        self.approximate = approximate

    def forward(self, x):
        xp = self.xp
        if gelu_forward.why_not(x) is None:  # a registry kernel (kernels/registry.py)
            out = gelu_forward.forward(xp, x, self.approximate)
            if out is not None:
                self.stash(None)  # the backward recomputes from x
                return out
        xw = upcast(x)
        if self.approximate == "tanh":  # tanh kept for backward
            t, out = _new(xp, xw), _new(xp, xw)
            elementwise(functools.partial(_gelu_tanh_forward, xp), (xw, t, out))
            self.stash(t)
        else:
            cdf = normal_cdf(xp, xw)
            self.stash(cdf)
            out = xp.multiply(xw, cdf, out=_new(xp, xw))
        return narrow(xp, out, x.dtype)

    def setup_context(self, inputs, output):
        self.save_for_backward(inputs[0])

    def backward(self, g):
        xp = self.xp
        (x,) = self.saved_arrays
        (aux,) = self.stashed
        if xp is not np:
            fused = gelu_kernels.backward(xp, x, g, self.approximate)  # one pass on GPUs (kernels/gelu.py)
            if fused is not None:
                return fused
        x = upcast(x)
        if aux is None:  # the forward's kernel kept nothing: what the array forward keeps
            if self.approximate == "tanh":
                aux = _new(xp, x)
                elementwise(functools.partial(_gelu_tanh_forward, xp), (x, aux, _new(xp, x)))
            else:
                aux = normal_cdf(xp, x)
        if self.approximate == "tanh":
            grad = _new(xp, x)
            elementwise(functools.partial(_gelu_tanh_backward, xp), (x, aux, g, grad))
            return narrow(xp, grad, g.dtype)
        # d/dx = Phi(x) + x phi(x)
        grad = xp.multiply(x, x, out=_new(xp, x))
        grad *= -0.5
        xp.exp(grad, out=grad)
        grad *= _INV_SQRT_2PI
        grad *= x
        grad += aux
        grad *= g  # a float16/bfloat16 g is widened inside the ufunc, chunk by chunk
        return narrow(xp, grad, g.dtype)

    def backward_graph(self, g):
        (x,) = self.saved_tensors
        if self.approximate == "tanh":
            t = (_SQRT_2_OVER_PI * (x + _GELU_CUBIC * x * x * x)).tanh()
            slope = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _SQRT_2_OVER_PI * (1 + 3 * _GELU_CUBIC * x * x)
        else:
            slope = NormalCdf().apply(x) + x * (-0.5 * x * x).exp() * _INV_SQRT_2PI
        return g * slope


def _gelu_tanh_forward(xp, x, t, out):
    """t = tanh(sqrt(2/pi) (x + 0.044715 x^3)), out = 0.5 x (1 + t)."""
    xp.multiply(x, x, out=t)
    t *= _SQRT_2_OVER_PI * _GELU_CUBIC
    t += _SQRT_2_OVER_PI
    t *= x
    xp.tanh(t, out=t)
    xp.multiply(x, t, out=out)
    out += x
    out *= 0.5


def _gelu_tanh_backward(xp, x, t, g, grad):
    """grad = g * d/dx, d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
                             = (1 + t) (0.5 + x (1 - t) (0.5 sqrt(2/pi) + 1.5 sqrt(2/pi) 0.044715 x^2))
    (a float16/bfloat16 g is widened inside the last ufunc)."""
    xp.multiply(x, x, out=grad)
    grad *= 1.5 * _SQRT_2_OVER_PI * _GELU_CUBIC
    grad += 0.5 * _SQRT_2_OVER_PI
    grad *= x
    one_pm_t = xp.subtract(1, t, out=xp.empty_like(t))
    grad *= one_pm_t
    grad += 0.5
    xp.add(t, 1, out=one_pm_t)
    grad *= one_pm_t
    grad *= g


class NormalCdf(Op):
    """Phi(x), the standard normal CDF, as a graph node (GELU's double backward needs its derivative)."""

    def forward(self, x):
        return narrow(self.xp, normal_cdf(self.xp, upcast(x)), x.dtype)

    def setup_context(self, inputs, output):
        self.save_for_backward(inputs[0])

    def backward(self, g):
        (x,) = self.saved_arrays
        x = upcast(x)
        return narrow(self.xp, g * self.xp.exp(-0.5 * x * x) * _INV_SQRT_2PI, g.dtype)

    def backward_graph(self, g):
        (x,) = self.saved_tensors
        return g * (-0.5 * x * x).exp() * _INV_SQRT_2PI


def _constant(like, array):
    from ...tensor import Tensor
    return Tensor._make(array, like.device)


class SiLU(Op):
    def forward(self, x):
        xw = upcast(x)
        s = sigmoid_array(self.xp, xw)
        self.stash(s)
        return narrow(self.xp, xw * s, x.dtype)

    def setup_context(self, inputs, output):
        self.save_for_backward(inputs[0])

    def backward(self, g):
        (x,) = self.saved_arrays
        (s,) = self.stashed
        grad = self.xp.subtract(1, s, out=_new(self.xp, s))  # d/dx = s (1 + x (1 - s))
        grad *= x
        grad += 1
        grad *= s
        grad *= g
        return narrow(self.xp, grad, g.dtype)

    def backward_graph(self, g):
        (x,) = self.saved_tensors
        s = Sigmoid().apply(x)
        return g * s * (1 + x * (1 - s))


class Softplus(Op):
    def __init__(self, beta=1.0, threshold=20.0):
        self.beta = beta
        self.threshold = threshold

    def forward(self, x):
        xp = self.xp
        out = xp.multiply(x, self.beta, out=_new(xp, x))
        linear = out > self.threshold  # torch: above the threshold the function is the identity
        xp.minimum(out, self.threshold, out=out)  # no overflow in exp where the result is replaced anyway
        xp.exp(out, out=out)
        xp.log1p(out, out=out)
        out /= self.beta
        out[linear] = x[linear]
        return out

    def setup_context(self, inputs, output):
        self.save_for_backward(inputs[0])

    def backward(self, g):
        xp = self.xp
        (x,) = self.saved_arrays
        bx = xp.multiply(x, self.beta, out=_new(xp, x))
        slope = sigmoid_array(xp, bx)
        slope[bx > self.threshold] = 1
        slope *= g
        return slope

    def backward_graph(self, g):
        (x,) = self.saved_tensors
        bx = x * self.beta
        linear = _constant(g, (bx.array > self.threshold).astype(g.dtype))
        return g * (Sigmoid().apply(bx) * (1 - linear) + linear)


def sigmoid(x):
    """1 / (1 + exp(-x))."""
    return Sigmoid().apply(x)


def relu(x):
    """max(x, 0)."""
    return ReLU().apply(x)


def gelu(x, approximate="none"):
    """GELU: exact x * Phi(x), or GPT-2's tanh approximation with approximate='tanh'."""
    return GELU(approximate).apply(x)


def silu(x):
    """x * sigmoid(x) (a.k.a. swish)."""
    return SiLU().apply(x)


def softplus(x, beta=1.0, threshold=20.0):
    """log(1 + exp(beta x)) / beta, linear above ``threshold`` (torch semantics)."""
    return Softplus(beta, threshold).apply(x)


__all__ = ["sigmoid", "relu", "gelu", "silu", "softplus"]
