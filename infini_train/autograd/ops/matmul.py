"""Matrix products: matmul (numpy semantics: 1-D, 2-D, batched, broadcast batch dims), mm (2-D only),
bmm (3-D, equal batches) and baddbmm (beta * input + alpha * batch1 @ batch2).

float16/bfloat16 operands accumulate in float32 and every result (gradients included) is rounded once to the
operands' dtype, as torch does; see low_precision.py."""
from __future__ import annotations

from . import low_precision as lp
from ..function import Op, op_error, sum_to

__all__ = ["matmul", "mm", "bmm", "baddbmm"]


def _check_dtypes(op, a, b):
    if a.dtype != b.dtype:
        raise op_error(op, "m1 and m2 to have the same dtype", f"{a.dtype} != {b.dtype}",
                       "cast one operand to the other's dtype first, e.g. b.to(a.dtype)")


def _check_inner(op, a, b):
    if a.shape[-1] != b.shape[-2 if b.ndim > 1 else 0]:
        raise op_error(op, "a.shape[-1] == b.shape[-2]", f"shapes {a.shape} and {b.shape}",
                       "transpose one operand, e.g. a @ b.transpose(-2, -1)")


def _check_batch_broadcast(op, a, b):
    batch_a, batch_b = a.shape[:-2], b.shape[:-2]
    for n_a, n_b in zip(reversed(batch_a), reversed(batch_b)):
        if n_a != n_b and 1 not in (n_a, n_b):
            raise op_error(op, "batch dims (all but the last two) that broadcast",
                           f"shapes {a.shape} and {b.shape}, batch dims {batch_a} and {batch_b}",
                           "batch sizes must be equal or 1 in each dim (aligned from the right); "
                           "reshape or unsqueeze one operand")


class Matmul(Op):
    def forward(self, a, b):
        if a.ndim == 0 or b.ndim == 0:
            raise op_error("matmul", "tensors with at least 1 dimension", f"shapes {a.shape} and {b.shape}",
                           "use * for multiplication by a scalar")
        _check_inner("matmul", a, b)
        _check_batch_broadcast("matmul", a, b)
        _check_dtypes("matmul", a, b)
        return lp.matmul(self.xp, a, b)

    def setup_context(self, inputs, output):
        a, b = inputs
        need_a, need_b = self.needs_input_grad
        self.save_for_backward(a if need_b else None, b if need_a else None)

    def backward(self, g):
        a, b = self.saved_arrays
        shape_a, shape_b = self._input_shapes
        need_a, need_b = self.needs_input_grad
        dtype_a, dtype_b = self._input_dtypes
        xp = self.xp
        g, a, b = lp.widen(xp, g, a, b)  # summing over broadcast batch dims happens before the one rounding too
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
            ga = lp.matmul(xp, g, xp.swapaxes(b2, -1, -2))
            ga = lp.narrow(xp, sum_to(ga, (1,) + shape_a if a_vec else shape_a).reshape(shape_a), dtype_a)
        if need_b:
            a2 = a[None, :] if a_vec else a
            gb = lp.matmul(xp, xp.swapaxes(a2, -1, -2), g)
            gb = lp.narrow(xp, sum_to(gb, shape_b + (1,) if b_vec else shape_b).reshape(shape_b), dtype_b)
        return ga, gb

    def backward_graph(self, g):
        """backward on Tensors, recorded (create_graph=True): the same steps with Tensor ops."""
        a, b = self.saved_tensors
        shape_a, shape_b = self._input_shapes
        need_a, need_b = self.needs_input_grad
        a_vec, b_vec = len(shape_a) == 1, len(shape_b) == 1
        if a_vec and b_vec:
            g = g.reshape(1, 1)
        elif a_vec:
            g = g.unsqueeze(-2)
        elif b_vec:
            g = g.unsqueeze(-1)
        ga = gb = None
        if need_a:
            ga = matmul(g, (b.unsqueeze(-1) if b_vec else b).transpose(-1, -2))
            ga = sum_to(ga, (1,) + shape_a if a_vec else shape_a).reshape(shape_a)
        if need_b:
            gb = matmul((a.unsqueeze(0) if a_vec else a).transpose(-1, -2), g)
            gb = sum_to(gb, shape_b + (1,) if b_vec else shape_b).reshape(shape_b)
        return ga, gb


class Mm(Matmul):
    def forward(self, a, b):
        if a.ndim != 2 or b.ndim != 2:
            raise op_error("mm", "2-D matrices", f"shapes {a.shape} and {b.shape}",
                           "use matmul for 1-D, batched or broadcast operands")
        _check_inner("mm", a, b)
        _check_dtypes("mm", a, b)
        return lp.matmul(self.xp, a, b)


def _check_batches(op, b1, b2):
    """bmm and baddbmm take two 3-D tensors (b, n, m) and (b, m, p): equal batches, no broadcasting."""
    if b1.ndim != 3 or b2.ndim != 3:
        raise op_error(op, "3-D batch1 and batch2 (batch, n, m) and (batch, m, p)", f"shapes {b1.shape} and {b2.shape}",
                       "use matmul for other ranks")
    if b1.shape[0] != b2.shape[0]:
        raise op_error(op, "equal batch sizes", f"shapes {b1.shape} and {b2.shape}",
                       "bmm does not broadcast; use matmul to broadcast batch dims")
    _check_inner(op, b1, b2)
    _check_dtypes(op, b1, b2)


class Bmm(Matmul):
    def forward(self, a, b):
        _check_batches("bmm", a, b)
        return lp.matmul(self.xp, a, b)


class Baddbmm(Op):
    def __init__(self, beta, alpha):
        self.beta, self.alpha = beta, alpha

    def forward(self, c, b1, b2):
        _check_batches("baddbmm", b1, b2)
        if c.dtype != b1.dtype:
            raise op_error("baddbmm", "input of the same dtype as batch1 and batch2", f"{c.dtype} and {b1.dtype}",
                           "cast the input first, e.g. input.to(batch1.dtype)")
        shape = (b1.shape[0], b1.shape[1], b2.shape[2])
        if c.ndim > 3 or any(n != m and n != 1 for n, m in zip(reversed(c.shape), reversed(shape))):
            raise op_error("baddbmm", f"an input that broadcasts to the output shape {shape}", f"shape {c.shape}",
                           "the input is expanded to (batch, n, p), never the other way round")
        dtype = b1.dtype
        c, b1, b2 = lp.widen(self.xp, c, b1, b2)  # float16/bfloat16: scaled and added in float32, rounded once
        out = lp.matmul(self.xp, b1, b2)
        if self.alpha != 1:
            out = out * self.alpha
        if self.beta != 0:  # beta = 0 ignores the input, nan and inf included
            out = out + (c if self.beta == 1 else self.beta * c)
        return lp.narrow(self.xp, out, dtype)

    def setup_context(self, inputs, output):
        _, b1, b2 = inputs
        _, need_b1, need_b2 = self.needs_input_grad
        self.save_for_backward(b1 if need_b2 else None, b2 if need_b1 else None)

    def backward(self, g):
        b1, b2 = self.saved_arrays
        need_c, need_b1, need_b2 = self.needs_input_grad
        dtype_c, dtype_b1, dtype_b2 = self._input_dtypes
        xp = self.xp
        g, b1, b2 = lp.widen(xp, g, b1, b2)
        gc = g1 = g2 = None
        if need_c:
            shape = self._input_shapes[0]
            gc = xp.zeros(shape, dtype_c) if self.beta == 0 else lp.narrow(xp, sum_to(g * self.beta, shape), dtype_c)
        if self.alpha != 1:
            g = g * self.alpha
        if need_b1:
            g1 = lp.narrow(xp, lp.matmul(xp, g, xp.swapaxes(b2, -1, -2)), dtype_b1)
        if need_b2:
            g2 = lp.narrow(xp, lp.matmul(xp, xp.swapaxes(b1, -1, -2), g), dtype_b2)
        return gc, g1, g2

    def backward_graph(self, g):
        """backward on Tensors, recorded (create_graph=True)."""
        b1, b2 = self.saved_tensors
        need_c, need_b1, need_b2 = self.needs_input_grad
        gc = g1 = g2 = None
        if need_c:
            gc = sum_to(g * self.beta, self._input_shapes[0])
        if self.alpha != 1:
            g = g * self.alpha
        if need_b1:
            g1 = matmul(g, b2.transpose(-1, -2))
        if need_b2:
            g2 = matmul(b1.transpose(-1, -2), g)
        return gc, g1, g2


def matmul(a, b):
    """a @ b. 1-D operands are treated as vectors; leading (batch) dimensions broadcast."""
    return Matmul().apply(a, b)


def mm(a, b):
    """The product of two 2-D matrices (n, m) @ (m, p), as torch.mm (no broadcasting)."""
    return Mm().apply(a, b)


def bmm(a, b):
    """Batched product (b, n, m) @ (b, m, p) -> (b, n, p), as torch.bmm (equal batches, no broadcasting)."""
    return Bmm().apply(a, b)


def baddbmm(input, batch1, batch2, beta=1, alpha=1):  # noqa: A002 - mirrors torch.baddbmm
    """beta * input + alpha * bmm(batch1, batch2), as torch.baddbmm. ``input`` broadcasts to (b, n, p);
    with beta = 0 it is ignored, so nan or inf in it do not reach the result."""
    return Baddbmm(beta, alpha).apply(input, batch1, batch2)
