"""Unary math: neg, exp, log, tanh, sqrt, rsqrt, sin, cos, abs, reciprocal; float math on integer or bool input
gives the default float dtype, as in torch. Each op's ``backward_graph`` (double backward) is its backward itself
where that is written with operators only, or a tensor version beside it."""
from __future__ import annotations

from ... import backend
from ...tensor import Tensor
from ..function import Op

__all__ = ["neg", "exp", "log", "tanh", "sqrt", "rsqrt", "sin", "cos", "abs", "reciprocal"]


def _constant(like, array):
    """A mask or other array as a gradient-free factor beside ``like`` (a Tensor under create_graph)."""
    return Tensor._make(array, like.device) if isinstance(like, Tensor) else array


def _raw(x):
    return x.array if isinstance(x, Tensor) else x


def _as_float(a):
    # float-valued math on integer/bool input gives the default float dtype, as in torch
    return a.astype(backend.get_default_dtype()) if a.dtype.kind in "biu" else a


class Neg(Op):
    def forward(self, a):
        return -a

    def backward(self, g):
        return -g

    backward_graph = backward


class _SavesOutput(Op):
    def setup_context(self, inputs, output):
        self.save_for_backward(output)


class _SavesInput(Op):
    def setup_context(self, inputs, output):
        self.save_for_backward(inputs[0])


class Exp(_SavesOutput):
    def forward(self, a):
        return self.xp.exp(_as_float(a))

    def backward(self, g):
        (out,) = self.saved_arrays
        return g * out

    backward_graph = backward


class Log(_SavesInput):
    def forward(self, a):
        return self.xp.log(_as_float(a))

    def backward(self, g):
        (a,) = self.saved_arrays
        return g / a

    backward_graph = backward


class Tanh(_SavesOutput):
    def forward(self, a):
        return self.xp.tanh(_as_float(a))

    def backward(self, g):
        (out,) = self.saved_arrays
        return g * (1 - out * out)

    backward_graph = backward


class Sqrt(_SavesOutput):
    def forward(self, a):
        return self.xp.sqrt(_as_float(a))

    def backward(self, g):
        (out,) = self.saved_arrays
        return g / (2 * out)

    backward_graph = backward


class Rsqrt(_SavesOutput):
    def forward(self, a):
        return 1 / self.xp.sqrt(_as_float(a))

    def backward(self, g):
        (out,) = self.saved_arrays
        return g * (-0.5 * out * out * out)

    backward_graph = backward


class Sin(_SavesInput):
    def forward(self, a):
        return self.xp.sin(_as_float(a))

    def backward(self, g):
        (a,) = self.saved_arrays
        return g * self.xp.cos(a)

    def backward_graph(self, g):
        (a,) = self.saved_tensors
        return g * cos(a)


class Cos(_SavesInput):
    def forward(self, a):
        return self.xp.cos(_as_float(a))

    def backward(self, g):
        (a,) = self.saved_arrays
        return -(g * self.xp.sin(a))

    def backward_graph(self, g):
        (a,) = self.saved_tensors
        return -(g * sin(a))


class Abs(_SavesInput):
    def forward(self, a):
        return self.xp.abs(a)

    def backward(self, g):
        (a,) = self.saved_arrays
        return g * self.xp.sign(_raw(a))  # 0 at a == 0, as torch

    def backward_graph(self, g):
        (a,) = self.saved_tensors
        return g * _constant(g, self.xp.sign(a.array))


class Reciprocal(_SavesOutput):
    def forward(self, a):
        return 1 / _as_float(a)

    def backward(self, g):
        (out,) = self.saved_arrays
        return -(g * out * out)

    backward_graph = backward


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
