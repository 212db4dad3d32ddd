"""Matrix multiplication with numpy semantics: 1-D, 2-D, batched and broadcast batch dimensions."""
from __future__ import annotations

from .function import Op, op_error, sum_to

__all__ = ["matmul"]


class Matmul(Op):
    def forward(self, a, b):
        if a.ndim == 0 or b.ndim == 0:
            raise op_error("matmul", "tensors with at least 1 dimension", f"shapes {a.shape} and {b.shape}",
                           "use * for multiplication by a scalar")
        if a.shape[-1] != b.shape[-2 if b.ndim > 1 else 0]:
            raise op_error("matmul", "a.shape[-1] == b.shape[-2]", f"shapes {a.shape} and {b.shape}",
                           "transpose one operand, e.g. a @ b.transpose(-2, -1)")
        if a.dtype != b.dtype:
            raise op_error("matmul", "operands of one dtype", f"{a.dtype} and {b.dtype}",
                           "cast one side with .to(dtype)")
        return self.xp.matmul(a, b)

    def setup_context(self, inputs, output):
        a, b = inputs
        need_a, need_b = self.needs_input_grad
        self.save_for_backward(a if need_b else None, b if need_a else None)

    def backward(self, g):
        a, b = self.saved_arrays
        shape_a, shape_b = self._input_shapes
        need_a, need_b = self.needs_input_grad
        xp = self.xp
        # promote 1-D operands to matrices, as forward did implicitly
        a_vec, b_vec = len(shape_a) == 1, len(shape_b) == 1
        if a_vec and b_vec:
            g = g.reshape(1, 1)
        elif a_vec:
            g = xp.expand_dims(g, -2)
        elif b_vec:
            g = xp.expand_dims(g, -1)
        ga = gb = None
        if need_a:
            b2 = b[:, None] if b_vec else b
            ga = xp.matmul(g, xp.swapaxes(b2, -1, -2))
            ga = sum_to(ga, (1,) + shape_a if a_vec else shape_a).reshape(shape_a)
        if need_b:
            a2 = a[None, :] if a_vec else a
            gb = xp.matmul(xp.swapaxes(a2, -1, -2), g)
            gb = sum_to(gb, shape_b + (1,) if b_vec else shape_b).reshape(shape_b)
        return ga, gb


def matmul(a, b):
    """a @ b. 1-D operands are treated as vectors; leading (batch) dimensions broadcast."""
    return Matmul().apply(a, b)
