"""Elementwise ops: arithmetic with broadcasting and scalars, unary math, comparisons and logic.

Binary ops accept a Tensor or a Python scalar on either side; ``sum_to`` undoes broadcasting in backward.
"""
from __future__ import annotations

import math

from ..tensor import Tensor
from .function import Op, sum_to

__all__ = ["add", "sub", "mul", "div", "pow", "neg", "exp", "log", "tanh"]


class _Binary(Op):
    """Saves its tensor operands (scalars are kept as constants); ``operands()`` returns both as arrays."""

    def setup_context(self, inputs, output):
        self.save_for_backward(*[x if isinstance(x, Tensor) else None for x in inputs])
        self.consts = tuple(None if isinstance(x, Tensor) else x for x in inputs)

    def operands(self):
        saved = self.saved_arrays
        return tuple(s if s is not None else c for s, c in zip(saved, self.consts))

    def reduce_grads(self, ga, gb):
        sa, sb = self._input_shapes
        need_a, need_b = self.needs_input_grad
        return (sum_to(ga, sa) if need_a else None), (sum_to(gb, sb) if need_b else None)


def _fix_dtype(out, a, b):
    # an integer tensor combined with a Python float gives float64 in numpy; keep the float32 default
    if out.dtype.kind == "f" and out.dtype.itemsize == 8:
        if _dtype_of(a) != "float64" and _dtype_of(b) != "float64":
            return out.astype("float32")
    return out


def _dtype_of(x):
    dtype = getattr(x, "dtype", None)
    return None if dtype is None else dtype.name


class Add(Op):
    def forward(self, a, b):
        return _fix_dtype(a + b, a, b)

    def backward(self, g):
        sa, sb = self._input_shapes
        need_a, need_b = self.needs_input_grad
        return (sum_to(g, sa) if need_a else None), (sum_to(g, sb) if need_b else None)


class Sub(Op):
    def forward(self, a, b):
        return _fix_dtype(a - b, a, b)

    def backward(self, g):
        sa, sb = self._input_shapes
        need_a, need_b = self.needs_input_grad
        return (sum_to(g, sa) if need_a else None), (sum_to(-g, sb) if need_b else None)


class Mul(_Binary):
    def forward(self, a, b):
        return _fix_dtype(a * b, a, b)

    def backward(self, g):
        a, b = self.operands()
        need_a, need_b = self.needs_input_grad
        return self.reduce_grads(g * b if need_a else None, g * a if need_b else None)


class Div(_Binary):
    def forward(self, a, b):
        return _fix_dtype(a / b, a, b)

    def backward(self, g):
        a, b = self.operands()
        need_a, need_b = self.needs_input_grad
        ga = g / b if need_a else None
        gb = -g * a / (b * b) if need_b else None
        return self.reduce_grads(ga, gb)


class Pow(_Binary):
    """a ** b with a scalar exponent, a scalar base, or two tensors."""

    def forward(self, a, b):
        out = _fix_dtype(a ** b, a, b)
        self.stash(out)
        return out

    def backward(self, g):
        a, b = self.operands()
        (out,) = self.stashed
        need_a, need_b = self.needs_input_grad
        xp = self.xp
        ga = gb = None
        scalar_a, scalar_b = isinstance(a, (int, float)), isinstance(b, (int, float))
        if need_a:
            if scalar_b:
                ga = xp.zeros_like(g) if b == 0 else g * b * a ** (b - 1)
            else:
                with _errstate(xp):
                    ga = xp.where(b == 0, 0, g * b * a ** (b - 1)).astype(g.dtype, copy=False)
        if need_b:
            # d(a^b)/db = a^b log a, taken as 0 where a == 0 and b >= 0 (the limit), as PyTorch does
            if scalar_a:
                gb = g * out * _log_scalar(a)
            else:
                with _errstate(xp):
                    gb = xp.where((a == 0) & (b >= 0), 0, g * out * xp.log(a)).astype(g.dtype, copy=False)
        return self.reduce_grads(ga, gb)


def _log_scalar(a):
    return math.log(a) if a > 0 else (float("-inf") if a == 0 else float("nan"))


class _errstate:
    def __init__(self, xp):
        self.ctx = xp.errstate(divide="ignore", invalid="ignore") if hasattr(xp, "errstate") else None

    def __enter__(self):
        if self.ctx is not None:
            self.ctx.__enter__()

    def __exit__(self, *exc):
        if self.ctx is not None:
            self.ctx.__exit__(*exc)
        return False


class Neg(Op):
    def forward(self, a):
        return -a

    def backward(self, g):
        return -g


class Exp(Op):
    def forward(self, a):
        return self.xp.exp(a)

    def setup_context(self, inputs, output):
        self.save_for_backward(output)

    def backward(self, g):
        (out,) = self.saved_arrays
        return g * out


class Log(Op):
    def forward(self, a):
        return self.xp.log(a)

    def setup_context(self, inputs, output):
        self.save_for_backward(inputs[0])

    def backward(self, g):
        (a,) = self.saved_arrays
        return g / a


class Tanh(Op):
    def forward(self, a):
        return self.xp.tanh(a)

    def setup_context(self, inputs, output):
        self.save_for_backward(output)

    def backward(self, g):
        (out,) = self.saved_arrays
        return g * (1 - out * out)


def add(a, b):
    """a + b with broadcasting; either side may be a Python scalar."""
    return Add().apply(a, b)


def sub(a, b):
    """a - b with broadcasting."""
    return Sub().apply(a, b)


def mul(a, b):
    """a * b with broadcasting."""
    return Mul().apply(a, b)


def div(a, b):
    """a / b with broadcasting (true division)."""
    return Div().apply(a, b)


def pow(a, b):  # noqa: A001 - mirrors the operator's name
    """a ** b: tensor base with scalar or tensor exponent, or scalar base with tensor exponent."""
    return Pow().apply(a, b)


def neg(a):
    return Neg().apply(a)


def exp(a):
    return Exp().apply(a)


def log(a):
    """Natural logarithm."""
    return Log().apply(a)


def tanh(a):
    return Tanh().apply(a)
