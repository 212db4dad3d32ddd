"""Rotary position embeddings in the LLaMA (Hugging Face) layout, as one fused Op:

    rotary_embedding(x, cos, sin) = x * cos + rotate_half(x) * sin,  rotate_half(x) = cat(-x2, x1)

with x1, x2 the first and second halves of the last dim (head_dim). ``cos`` and ``sin`` broadcast against x
(typically (T, head_dim) or (B, 1, T, head_dim) against (B, n_heads, T, head_dim)) and are constants: only x
gets a gradient. The backward is the adjoint, dx = g * cos + rotate_half^T(g * sin) with
rotate_half^T(y) = cat(y2, -y1).

The dtype is torch's promotion of the three. In float16/bfloat16 the result is rounded as torch's eager
``q * cos + rotate_half(q) * sin`` rounds it, op by op: each product rounded to the low dtype, then their sum
(each computed in float32). The backward rounds as torch's autograd through those ops does.
"""
from __future__ import annotations

import numpy as np

from ... import backend
from ...promotion import result_type
from ...tensor import Tensor
from ..function import Op, op_error, sum_to
from ..grad_mode import is_grad_enabled
from .low_precision import narrow
from .softmax import upcast

_OP = "rotary_embedding"


def _wide(a, dtype):
    """``a`` in ``dtype``'s opmath dtype (float32 for float16/bfloat16)."""
    return upcast(a.astype(dtype, copy=False))


class RotaryEmbedding(Op):
    def _check(self, x, cos, sin):
        for name, a in (("x", x), ("cos", cos), ("sin", sin)):
            if not backend.is_floating(a.dtype):
                raise op_error(_OP, f"a floating-point {name}", f"{name} of dtype {a.dtype}",
                               "cos and sin are usually computed in float32 and cast to x's dtype")
        if x.ndim == 0 or x.shape[-1] % 2:
            raise op_error(_OP, "x of shape (..., T, head_dim) with an even head_dim",
                           f"x of shape {tuple(x.shape)}",
                           "rotate_half pairs element i with element i + head_dim / 2 of the last dim")
        head_dim = x.shape[-1]
        for name, a in (("cos", cos), ("sin", sin)):
            if a.ndim == 0 or a.shape[-1] != head_dim:
                raise op_error(_OP, f"{name} with last dim {head_dim} (= x's head_dim)",
                               f"{name} of shape {tuple(a.shape)}",
                               "build cos/sin as (T, head_dim), the frequencies repeated twice: "
                               "cat((freqs, freqs), dim=-1)")
        try:
            return np.broadcast_shapes(x.shape, cos.shape, sin.shape)
        except ValueError:
            raise op_error(_OP, "x, cos and sin of broadcastable shapes",
                           f"x {tuple(x.shape)}, cos {tuple(cos.shape)}, sin {tuple(sin.shape)}",
                           "for x (B, n_heads, T, head_dim) pass cos/sin as (T, head_dim) or (B, 1, T, head_dim)"
                           ) from None

    def forward(self, x, cos, sin):
        shape = self._check(x, cos, sin)
        xp = self.xp
        dtype = result_type(x, cos, sin)
        h = x.shape[-1] // 2
        xw, cw, sw = (_wide(a, dtype) for a in (x, cos, sin))
        out = upcast(narrow(xp, xw * cw, dtype))
        if out.shape != shape:  # sin broadcasts x further than cos does
            out = xp.broadcast_to(out, shape).copy()
        out[..., :h] -= upcast(narrow(xp, xw[..., h:] * sw[..., :h], dtype))  # + (-x2) * s1: negation is exact
        out[..., h:] += upcast(narrow(xp, xw[..., :h] * sw[..., h:], dtype))
        return narrow(xp, out, dtype)

    def setup_context(self, inputs, output):
        self.save_for_backward(inputs[1], inputs[2])

    def backward(self, g):
        xp = self.xp
        cos, sin = self.saved_arrays
        shape, x_dtype = self._input_shapes[0], self._input_dtypes[0]
        dtype = g.dtype
        h = shape[-1] // 2
        gw, cw, sw = (_wide(a, dtype) for a in (g, cos, sin))

        def to_x(product, like):
            # autograd through x * cos (or rotate_half(x) * sin): the product rounded to the output's dtype,
            # summed over the dims broadcasting added, rounded to x's dtype
            return upcast(narrow(xp, sum_to(upcast(narrow(xp, product, dtype)), like), x_dtype))

        half = shape[:-1] + (h,)
        gx = to_x(gw * cw, shape)
        gx[..., :h] += to_x(gw[..., h:] * sw[..., h:], half)
        gx[..., h:] -= to_x(gw[..., :h] * sw[..., :h], half)
        return narrow(xp, gx, x_dtype), None, None

    def backward_graph(self, g):
        cos, sin = self.saved_tensors
        h = sin.shape[-1] // 2
        s = sin.array
        # dx = g * cos + rotate_half^T(g * sin) = g * cos + rotate_half(g) * cat(-s2, -s1): the op itself
        flipped = Tensor._make(self.xp.concatenate((-s[..., h:], -s[..., :h]), axis=-1), self.device)
        return sum_to(RotaryEmbedding().apply(g, cos, flipped), self._input_shapes[0]), None, None


def rotary_embedding(x, cos, sin):
    """x * cos + rotate_half(x) * sin over the last dim of x (..., T, head_dim), rotate_half(x) = cat(-x2, x1):
    LLaMA's rotary position embedding, as Hugging Face's apply_rotary_pos_emb. ``cos`` and ``sin`` broadcast
    against x and are treated as constants (no gradient reaches them)."""
    for name, t in (("x", x), ("cos", cos), ("sin", sin)):
        if not isinstance(t, Tensor):
            raise op_error(_OP, f"{name} as a Tensor", f"{name} of type {type(t).__name__}",
                           f"wrap it first: infini_train.tensor({name})")
    if is_grad_enabled():
        for name, t in (("cos", cos), ("sin", sin)):
            if t.requires_grad:
                raise op_error(_OP, f"{name} that does not require grad (cos and sin are constants here)",
                               f"{name} with requires_grad=True",
                               f"compute cos/sin under no_grad(), or pass {name}.detach()")
    return RotaryEmbedding().apply(x, cos, sin)


__all__ = ["rotary_embedding"]
