"""fmod: the C remainder (the result takes the dividend's sign), as torch.fmod; beside ``remainder`` (Python's
modulo, the divisor's sign) in elementwise.py."""
from __future__ import annotations

from ...backend import is_array_like
from .elementwise import Remainder, _constant, _raw, _rounded, check_integer_divisor, promote_pair

__all__ = ["fmod"]


class Fmod(Remainder):
    def forward(self, a, b):
        a, b, low = promote_pair(a, b)
        check_integer_divisor("fmod", a, b)
        return _rounded(self.xp.fmod(a, b), low)

    def backward(self, g):
        a, b = self.operands()
        need_a, need_b = self.needs_input_grad
        gb = None
        if need_b:  # d/db (a - trunc(a / b) * b) = -trunc(a / b), as torch
            xp = self.xp
            with_sign = xp.trunc(xp.true_divide(_raw(a), _raw(b)))
            gb = -g * _constant(g, with_sign.astype(g.dtype if is_array_like(g) else with_sign.dtype))
        return self.reduce_grads(g if need_a else None, gb)

    backward_graph = backward


def fmod(a, b):
    """a - trunc(a / b) * b (the sign of a), elementwise with broadcasting; integer division by zero raises."""
    return Fmod().apply(a, b)
