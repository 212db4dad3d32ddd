"""layer_norm: one fused Op; forward keeps the normalised input and 1/std for an analytic backward."""
from __future__ import annotations

from .function import Op, op_error


class LayerNorm(Op):
    def __init__(self, normalized_shape, eps=1e-5):
        self.normalized_shape = normalized_shape
        self.eps = eps

    def forward(self, x, weight=None, bias=None):
        ns = self.normalized_shape
        if x.shape[x.ndim - len(ns):] != ns or len(ns) > x.ndim:
            raise op_error("layer_norm", f"input whose trailing dims are {ns}", f"input of shape {x.shape}")
        for name, p in (("weight", weight), ("bias", bias)):
            if p is not None and p.shape != ns:
                raise op_error("layer_norm", f"{name} of shape {ns}", f"{name} of shape {p.shape}")
        xp = self.xp
        axes = tuple(range(x.ndim - len(ns), x.ndim))
        self.axes = axes
        xc = x - x.mean(axis=axes, keepdims=True)
        var = xp.asarray((xc * xc).mean(axis=axes, keepdims=True))
        var += self.eps
        rstd = xp.sqrt(var, out=var)
        xp.reciprocal(rstd, out=rstd)
        xc *= rstd  # xc is now x-hat
        self.stash(xc, rstd)
        if weight is None and bias is None:
            return xc.copy()
        out = xc * weight if weight is not None else xc.copy()
        if bias is not None:
            out += bias
        return out

    def setup_context(self, inputs, output):
        self.save_for_backward(inputs[1] if len(inputs) > 1 else None)

    def backward(self, g):
        (weight,) = self.saved_arrays
        xhat, rstd = self.stashed
        need = self.needs_input_grad + (False,) * (3 - len(self.needs_input_grad))
        lead = tuple(range(g.ndim - len(self.axes)))
        gw = (g * xhat).sum(axis=lead) if need[1] else None
        gb = g.sum(axis=lead) if need[2] else None
        gx = None
        if need[0]:
            dxhat = g * weight if weight is not None else g.copy()
            proj = (dxhat * xhat).mean(axis=self.axes, keepdims=True)
            gx = dxhat
            gx -= dxhat.mean(axis=self.axes, keepdims=True)
            gx -= xhat * proj
            gx *= rstd
        return (gx, gw, gb)[:len(self.next_functions)]


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Normalise over the trailing ``normalized_shape`` dims, then scale by weight and shift by bias."""
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    return LayerNorm(tuple(int(n) for n in normalized_shape), eps).apply(x, weight, bias)


__all__ = ["layer_norm"]
