"""Elementwise ops: arithmetic with broadcasting and scalars, unary math, comparisons and logic.

Binary ops accept a Tensor or a Python scalar on either side; ``sum_to`` undoes broadcasting in backward.
"""
from __future__ import annotations

import math

from ..tensor import Tensor
from .function import Op, op_error, sum_to, ignore_fp_errors

__all__ = ["add", "sub", "mul", "div", "pow", "neg", "exp", "log", "tanh",
           "sqrt", "rsqrt", "sin", "cos", "abs", "reciprocal", "clamp", "maximum", "minimum",
           "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not", "where"]


# Backward passes route gradients with ``g * mask`` rather than ``xp.where(mask, g, 0)``: on CPU, numpy's where
# is branch-bound on irregular masks (3.2 ms vs 0.15 ms on 256x3072 float32). They differ only where g itself
# is inf/nan at a masked-out position.


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


def _fix_dtype(out, *operands):
    # an integer tensor combined with a Python float gives float64 in numpy; keep the float32 default
    if out.dtype.kind == "f" and out.dtype.itemsize == 8:
        if all(_dtype_of(x) != "float64" for x in operands):
            return out.astype("float32")
    return out


def _as_float(a):
    # float-valued math on integer/bool input gives float32, as in torch (numpy would give float64)
    return a.astype("float32") if a.dtype.kind in "biu" else a


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
                with ignore_fp_errors(xp):
                    ga = xp.where(b == 0, 0, g * b * a ** (b - 1)).astype(g.dtype, copy=False)
        if need_b:
            # d(a^b)/db = a^b log a, taken as 0 where a == 0 and b >= 0 (the limit), as PyTorch does
            if scalar_a:
                gb = g * out * _log_scalar(a)
            else:
                with ignore_fp_errors(xp):
                    gb = xp.where((a == 0) & (b >= 0), 0, g * out * xp.log(a)).astype(g.dtype, copy=False)
        return self.reduce_grads(ga, gb)


def _log_scalar(a):
    return math.log(a) if a > 0 else (float("-inf") if a == 0 else float("nan"))


class Neg(Op):
    def forward(self, a):
        return -a

    def backward(self, g):
        return -g


class Exp(Op):
    def forward(self, a):
        return self.xp.exp(_as_float(a))

    def setup_context(self, inputs, output):
        self.save_for_backward(output)

    def backward(self, g):
        (out,) = self.saved_arrays
        return g * out


class Log(Op):
    def forward(self, a):
        return self.xp.log(_as_float(a))

    def setup_context(self, inputs, output):
        self.save_for_backward(inputs[0])

    def backward(self, g):
        (a,) = self.saved_arrays
        return g / a


class Tanh(Op):
    def forward(self, a):
        return self.xp.tanh(_as_float(a))

    def setup_context(self, inputs, output):
        self.save_for_backward(output)

    def backward(self, g):
        (out,) = self.saved_arrays
        return g * (1 - out * out)


class Sqrt(Op):
    def forward(self, a):
        return self.xp.sqrt(_as_float(a))

    def setup_context(self, inputs, output):
        self.save_for_backward(output)

    def backward(self, g):
        (out,) = self.saved_arrays
        return g / (2 * out)


class Rsqrt(Op):
    def forward(self, a):
        return 1 / self.xp.sqrt(_as_float(a))

    def setup_context(self, inputs, output):
        self.save_for_backward(output)

    def backward(self, g):
        (out,) = self.saved_arrays
        return g * (-0.5 * out * out * out)


class Sin(Op):
    def forward(self, a):
        return self.xp.sin(_as_float(a))

    def setup_context(self, inputs, output):
        self.save_for_backward(inputs[0])

    def backward(self, g):
        (a,) = self.saved_arrays
        return g * self.xp.cos(a)


class Cos(Op):
    def forward(self, a):
        return self.xp.cos(_as_float(a))

    def setup_context(self, inputs, output):
        self.save_for_backward(inputs[0])

    def backward(self, g):
        (a,) = self.saved_arrays
        return -(g * self.xp.sin(a))


class Abs(Op):
    def forward(self, a):
        return self.xp.abs(a)

    def setup_context(self, inputs, output):
        self.save_for_backward(inputs[0])

    def backward(self, g):
        (a,) = self.saved_arrays
        return g * self.xp.sign(a)  # 0 at a == 0, as torch


class Reciprocal(Op):
    def forward(self, a):
        return 1 / _as_float(a)

    def setup_context(self, inputs, output):
        self.save_for_backward(output)

    def backward(self, g):
        (out,) = self.saved_arrays
        return -(g * out * out)


class Clamp(_Binary):
    """Bounds are scalars, tensors or None. Gradients follow torch's clamp backward: x gets the gradient
    where min <= x <= max; a tensor bound gets it where it was the one selected."""

    def forward(self, x, lo, hi):
        if lo is None and hi is None:
            raise op_error("Clamp", "at least one of min and max", "min=None and max=None",
                           "pass min=..., max=... or both")
        out = x
        if lo is not None:
            out = self.xp.maximum(out, lo)
        if hi is not None:
            out = self.xp.minimum(out, hi)  # min > max gives max everywhere, as torch
        return _fix_dtype(out, x, lo, hi)

    def backward(self, g):
        x, lo, hi = self.operands()
        need_x, need_lo, need_hi = self.needs_input_grad
        shapes = self._input_shapes
        gx = glo = ghi = None
        if need_x:
            if lo is None:
                inside = x <= hi
            elif hi is None:
                inside = x >= lo
            else:
                inside = (x >= lo) & (x <= hi)
            gx = sum_to(g * inside, shapes[0])
        if need_lo:
            picked = x < lo if hi is None else (x < lo) & (lo < hi)
            glo = sum_to(g * picked, shapes[1])
        if need_hi:
            picked = x > hi if lo is None else (x > hi) | (hi < lo)
            ghi = sum_to(g * picked, shapes[2])
        return gx, glo, ghi


def _share_ties(xp, g, a, b, a_loses, b_loses, needs):
    # torch's maximum/minimum backward: the winner gets the gradient, ties split it half/half
    share = xp.where(a == b, g * 0.5, g)  # ties are rare: a predictable branch, unlike the masks below
    return (share * ~a_loses if needs[0] else None), (share * ~b_loses if needs[1] else None)


class Maximum(_Binary):
    def forward(self, a, b):
        return _fix_dtype(self.xp.maximum(a, b), a, b)

    def backward(self, g):
        a, b = self.operands()
        return self.reduce_grads(*_share_ties(self.xp, g, a, b, a < b, a > b, self.needs_input_grad))


class Minimum(_Binary):
    def forward(self, a, b):
        return _fix_dtype(self.xp.minimum(a, b), a, b)

    def backward(self, g):
        a, b = self.operands()
        return self.reduce_grads(*_share_ties(self.xp, g, a, b, a > b, a < b, self.needs_input_grad))


class _Predicate(Op):
    """Comparisons and logic: a bool result that never carries a gradient."""

    differentiable = False
    ufunc = None

    def forward(self, a, b):
        return getattr(self.xp, self.ufunc)(a, b)


class Eq(_Predicate):
    ufunc = "equal"


class Ne(_Predicate):
    ufunc = "not_equal"


class Lt(_Predicate):
    ufunc = "less"


class Le(_Predicate):
    ufunc = "less_equal"


class Gt(_Predicate):
    ufunc = "greater"


class Ge(_Predicate):
    ufunc = "greater_equal"


class LogicalAnd(_Predicate):
    ufunc = "logical_and"


class LogicalOr(_Predicate):
    ufunc = "logical_or"


class LogicalNot(Op):
    differentiable = False

    def forward(self, a):
        return self.xp.logical_not(a)


class Where(Op):
    """cond ? a : b with broadcasting; a and b may be tensors or Python scalars."""

    def forward(self, cond, a, b):
        if cond.dtype != bool:
            raise op_error("Where", "a bool condition tensor", f"a condition of dtype {cond.dtype}",
                           "build the condition with a comparison (x > 0) or convert it with .bool()")
        return _fix_dtype(self.xp.where(cond, a, b), a, b)

    def setup_context(self, inputs, output):
        self.save_for_backward(inputs[0])

    def backward(self, g):
        (cond,) = self.saved_arrays
        _, need_a, need_b = self.needs_input_grad
        _, shape_a, shape_b = self._input_shapes
        ga = sum_to(g * cond, shape_a) if need_a else None
        gb = sum_to(g * ~cond, shape_b) if need_b else None
        return None, ga, gb


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


def sqrt(a):
    return Sqrt().apply(a)


def rsqrt(a):
    """1 / sqrt(a)."""
    return Rsqrt().apply(a)


def sin(a):
    return Sin().apply(a)


def cos(a):
    return Cos().apply(a)


def abs(a):  # noqa: A001 - mirrors torch.abs
    """|a|; the gradient at 0 is 0, as in torch."""
    return Abs().apply(a)


def reciprocal(a):
    """1 / a."""
    return Reciprocal().apply(a)


def clamp(x, min=None, max=None):  # noqa: A002 - torch's argument names
    """Limit x to [min, max]; either bound may be None, a Python scalar or a tensor (broadcasting).
    The gradient reaches x where min <= x <= max."""
    return Clamp().apply(x, min, max)


def maximum(a, b):
    """Elementwise maximum with broadcasting; on ties both sides get half the gradient (as torch)."""
    return Maximum().apply(a, b)


def minimum(a, b):
    """Elementwise minimum with broadcasting; on ties both sides get half the gradient (as torch)."""
    return Minimum().apply(a, b)


def eq(a, b):
    """a == b elementwise (bool tensor); either side may be a Python scalar."""
    return Eq().apply(a, b)


def ne(a, b):
    """a != b elementwise (bool tensor)."""
    return Ne().apply(a, b)


def lt(a, b):
    """a < b elementwise (bool tensor)."""
    return Lt().apply(a, b)


def le(a, b):
    """a <= b elementwise (bool tensor)."""
    return Le().apply(a, b)


def gt(a, b):
    """a > b elementwise (bool tensor)."""
    return Gt().apply(a, b)


def ge(a, b):
    """a >= b elementwise (bool tensor)."""
    return Ge().apply(a, b)


def logical_and(a, b):
    """Elementwise AND of the truth values (bool tensor); also ``a & b``."""
    return LogicalAnd().apply(a, b)


def logical_or(a, b):
    """Elementwise OR of the truth values (bool tensor); also ``a | b``."""
    return LogicalOr().apply(a, b)


def logical_not(a):
    """Elementwise NOT of the truth values (bool tensor); also ``~a``."""
    return LogicalNot().apply(a)


def where(cond, a, b):
    """Pick a where cond is True, else b (broadcasting). cond is a bool tensor; a and b are tensors or
    Python scalars. Gradients flow to a where cond holds and to b elsewhere."""
    if not isinstance(cond, Tensor):
        raise op_error("Where", "the condition as a bool Tensor", type(cond).__name__,
                       "wrap it with infini_train.tensor(...) or build it with a comparison")
    return Where().apply(cond, a, b)
