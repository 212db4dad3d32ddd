"""linear: y = x @ W.T + b, fused, with 2-D reshapes so every product is one sgemm call.

Transposed operands are passed as views (BLAS takes them with a transpose flag), so no copy of W.T is
ever made; the bias is added in place to the freshly computed output.

float16/bfloat16 inputs accumulate in float32, get the bias added in float32 and are rounded once, as torch
does; their gradients are computed the same way (see low_precision.py). On GPUs cuBLAS hands back the product
already rounded, so there the bias add rounds a second time (at most 1 ulp from a fused bias epilogue)."""
from __future__ import annotations

from . import low_precision as lp
from ..function import Op, op_error


class Linear(Op):
    def forward(self, x, weight, bias=None):
        if weight.ndim != 2:
            raise op_error("linear", "a 2-D weight (out_features, in_features)", f"weight of shape {weight.shape}")
        out_features, in_features = weight.shape
        if x.ndim == 0 or x.shape[-1] != in_features:
            raise op_error("linear", f"x of shape (..., {in_features}) for weight {weight.shape}",
                           f"x of shape {x.shape}",
                           "weight is (out_features, in_features); x's last dim must equal in_features")
        if bias is not None and bias.shape != (out_features,):
            raise op_error("linear", f"bias of shape ({out_features},) (out_features)", f"bias of shape {bias.shape}")
        if x.dtype != weight.dtype or (bias is not None and bias.dtype != weight.dtype):
            got = f"x {x.dtype}, weight {weight.dtype}" + (f", bias {bias.dtype}" if bias is not None else "")
            raise op_error("linear", "x, weight and bias of one dtype", got, "cast with .to(dtype)")
        dtype = x.dtype
        x, weight, bias = lp.widen(self.xp, x, weight, bias)
        out = self.xp.matmul(x.reshape(-1, in_features), weight.T)
        if bias is not None:
            out += bias
        return lp.narrow(self.xp, out.reshape(x.shape[:-1] + (out_features,)), dtype)

    def setup_context(self, inputs, output):
        x, weight = inputs[0], inputs[1]
        need_x, need_w = self.needs_input_grad[0], self.needs_input_grad[1]
        self.save_for_backward(x if need_w else None, weight if need_x else None)

    def backward(self, g):
        x, weight = self.saved_arrays
        need_x, need_w, need_b = self.needs_input_grad
        dtype_x, dtype_w, dtype_b = self._input_dtypes
        xp = self.xp
        g, x, weight = lp.widen(xp, g, x, weight)
        g2d = g.reshape(-1, g.shape[-1])
        grad_x = grad_w = grad_b = None
        if need_x:
            grad_x = lp.narrow(xp, xp.matmul(g2d, weight).reshape(self._input_shapes[0]), dtype_x)
        if need_w:
            grad_w = lp.narrow(xp, xp.matmul(g2d.T, x.reshape(-1, x.shape[-1])), dtype_w)
        if need_b:
            grad_b = lp.narrow(xp, g2d.sum(axis=0), dtype_b)
        return grad_x, grad_w, grad_b

    def backward_graph(self, g):
        x, weight = self.saved_tensors
        need_x, need_w, need_b = self.needs_input_grad
        g2d = g.reshape(-1, g.shape[-1])
        grad_x = linear(g, weight.t()) if need_x else None  # g @ W
        grad_w = linear(g2d.t(), x.reshape(-1, x.shape[-1]).t()) if need_w else None  # g^T @ x
        grad_b = g2d.sum(dim=0) if need_b else None
        return grad_x, grad_w, grad_b


def linear(x, weight, bias=None):
    """x @ weight.T + bias for x (..., in_features), weight (out_features, in_features), bias (out_features,)."""
    return Linear().apply(x, weight, bias)


__all__ = ["linear"]
