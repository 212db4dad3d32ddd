"""linear: y = x @ W.T + b, fused, with 2-D reshapes so every product is one sgemm call."""
from __future__ import annotations

from .function import Op, op_error


class Linear(Op):
    def forward(self, x, weight, bias=None):
        if weight.ndim != 2 or x.ndim == 0 or x.shape[-1] != weight.shape[1]:
            raise op_error("linear", f"x (..., {weight.shape[-1] if weight.ndim else '?'}) and weight (out, in)",
                           f"x {x.shape}, weight {weight.shape}",
                           "weight is (out_features, in_features); x's last dim must equal in_features")
        if bias is not None and bias.shape != (weight.shape[0],):
            raise op_error("linear", f"bias of shape ({weight.shape[0]},)", f"bias {bias.shape}")
        if x.dtype != weight.dtype:
            raise op_error("linear", "x and weight of one dtype", f"{x.dtype} and {weight.dtype}",
                           "cast with .to(dtype)")
        x2 = x.reshape(-1, x.shape[-1])
        out = self.xp.matmul(x2, weight.T)
        if bias is not None:
            out += bias
        return out.reshape(x.shape[:-1] + (weight.shape[0],))

    def setup_context(self, inputs, output):
        x, weight, bias = inputs
        need_x, need_w = self.needs_input_grad[0], self.needs_input_grad[1]
        self.save_for_backward(x if need_w else None, weight if need_x else None)

    def backward(self, g):
        x, weight = self.saved_arrays
        need_x, need_w, need_b = self.needs_input_grad
        g2 = g.reshape(-1, g.shape[-1])
        gx = gw = gb = None
        if need_x:
            gx = self.xp.matmul(g2, weight).reshape(self._input_shapes[0])
        if need_w:
            gw = self.xp.matmul(g2.T, x.reshape(-1, x.shape[-1]))
        if need_b:
            gb = g2.sum(axis=0)
        return gx, gw, gb


def linear(x, weight, bias=None):
    """x @ weight.T + bias, with weight (out_features, in_features)."""
    return Linear().apply(x, weight, bias)


__all__ = ["linear"]
