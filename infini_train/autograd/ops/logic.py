"""Comparisons, logical and bitwise ops, and float classification: results that never carry gradients.

As in torch, ``&``, ``|``, ``^``, ``~``, ``<<`` and ``>>`` are bitwise on integer tensors and logical on bool
tensors; on floating tensors they are an error. Comparisons compare in the promoted dtype.
"""
from __future__ import annotations

from ...promotion import category, promote_operands, promote_pair
from ..function import Op, op_error

__all__ = ["eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "logical_not",
           "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "bitwise_left_shift", "bitwise_right_shift",
           "isfinite", "isnan", "isinf"]


class _Predicate(Op):
    """A binary op whose result never carries a gradient; ``ufunc`` names the xp function."""

    differentiable = False
    ufunc = None

    def forward(self, a, b):
        a, b, _ = promote_pair(a, b)  # low precision compares in float32, exactly
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


class LogicalXor(_Predicate):
    ufunc = "logical_xor"


class LogicalNot(Op):
    differentiable = False

    def forward(self, a):
        return self.xp.logical_not(a)


class _Bitwise(_Predicate):
    """Integer and bool operands only; the result has their promoted dtype."""

    op = None
    bool_ok = True

    def forward(self, *operands):
        operands, dtype = promote_operands(*operands)
        if category(dtype) > 1 or (dtype.kind == "b" and not self.bool_ok):
            kinds = "integer" + (" or bool" if self.bool_ok else "")
            raise op_error(self.op, f"{kinds} tensors", f"dtype {dtype}",
                           f"{self.op} is bitwise; for floating tensors compare first, e.g. (x > 0) & (y > 0)")
        return getattr(self.xp, self.ufunc)(*operands)


class BitwiseAnd(_Bitwise):
    op, ufunc = "bitwise_and", "bitwise_and"


class BitwiseOr(_Bitwise):
    op, ufunc = "bitwise_or", "bitwise_or"


class BitwiseXor(_Bitwise):
    op, ufunc = "bitwise_xor", "bitwise_xor"


class BitwiseNot(_Bitwise):
    op, ufunc = "bitwise_not", "invert"


class LeftShift(_Bitwise):
    op, ufunc, bool_ok = "bitwise_left_shift", "left_shift", False


class RightShift(_Bitwise):
    op, ufunc, bool_ok = "bitwise_right_shift", "right_shift", False


class _Classify(Op):
    differentiable = False
    ufunc = None

    def forward(self, a):
        return getattr(self.xp, self.ufunc)(a)


class IsFinite(_Classify):
    ufunc = "isfinite"


class IsNan(_Classify):
    ufunc = "isnan"


class IsInf(_Classify):
    ufunc = "isinf"


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
    """Elementwise AND of the truth values (bool tensor)."""
    return LogicalAnd().apply(a, b)


def logical_or(a, b):
    """Elementwise OR of the truth values (bool tensor)."""
    return LogicalOr().apply(a, b)


def logical_xor(a, b):
    """Elementwise XOR of the truth values (bool tensor)."""
    return LogicalXor().apply(a, b)


def logical_not(a):
    """Elementwise NOT of the truth values (bool tensor)."""
    return LogicalNot().apply(a)


def bitwise_and(a, b):
    """Bitwise AND of integer tensors, logical AND of bool tensors (``a & b``)."""
    return BitwiseAnd().apply(a, b)


def bitwise_or(a, b):
    """Bitwise OR of integer tensors, logical OR of bool tensors (``a | b``)."""
    return BitwiseOr().apply(a, b)


def bitwise_xor(a, b):
    """Bitwise XOR of integer tensors, logical XOR of bool tensors (``a ^ b``)."""
    return BitwiseXor().apply(a, b)


def bitwise_not(a):
    """Bitwise NOT of an integer tensor (``~a``: -a - 1), logical NOT of a bool tensor."""
    return BitwiseNot().apply(a)


def bitwise_left_shift(a, b):
    """``a << b`` on integer tensors."""
    return LeftShift().apply(a, b)


def bitwise_right_shift(a, b):
    """``a >> b`` on integer tensors (arithmetic shift for signed integers)."""
    return RightShift().apply(a, b)


def isfinite(a):
    """True where a is neither inf nor nan (always True for integer tensors)."""
    return IsFinite().apply(a)


def isnan(a):
    """True where a is nan."""
    return IsNan().apply(a)


def isinf(a):
    """True where a is +inf or -inf."""
    return IsInf().apply(a)
