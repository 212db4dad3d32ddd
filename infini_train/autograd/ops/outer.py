"""Outer product of two vectors."""
from __future__ import annotations

from ...backend import is_array_like
from ...tensor import Tensor
from ..function import Op, op_error

__all__ = ["outer"]


class Outer(Op):
    """out[i, j] = a[i] * b[j] for 1-D a and b."""

    def forward(self, a, b):
        for which, v in (("a", a), ("b", b)):
            if not (is_array_like(v) and v.ndim == 1):
                got = f"{v.ndim}-D {which} of shape {tuple(v.shape)}" if is_array_like(v) else type(v).__name__
                raise op_error("Outer", "1-D tensors for a and b", got,
                               "flatten the input with .reshape(-1), or use matmul / broadcasting "
                               "(a[:, None] * b) for batched outer products")
        return a[:, None] * b[None, :]

    def setup_context(self, inputs, output):
        a, b = inputs
        need_a, need_b = self.needs_input_grad
        self.save_for_backward(b if need_a else None, a if need_b else None)

    def backward(self, g):
        b, a = self.saved_arrays
        need_a, need_b = self.needs_input_grad
        return (g @ b if need_a else None), (a @ g if need_b else None)


def outer(a, b):
    """Outer product of 1-D tensors a (n,) and b (m,): an (n, m) tensor, as torch.outer."""
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise op_error("Outer", "two 1-D Tensors", f"{type(a).__name__} and {type(b).__name__}",
                       "wrap the inputs with infini_train.tensor(...)")
    return Outer().apply(a, b)
