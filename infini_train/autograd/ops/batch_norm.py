"""batch_norm as one fused Op, as torch.nn.functional.batch_norm: statistics over every dim but the channel
dim (1), accumulated in float32 at least (float16/bfloat16 inputs are normalised in float32 and rounded once;
weight and bias may be float32 next to them).

In training the batch statistics normalise, and the running statistics (when given) are updated in place:
running_mean <- (1 - momentum) * running_mean + momentum * mean, and running_var likewise with the unbiased
variance (n / (n - 1) times the biased one that normalises). In eval the running statistics normalise and
receive no gradient. Backward keeps only the per-channel mean and 1/std next to the saved input.
"""
from __future__ import annotations

from ..function import Op, op_error
from .low_precision import narrow


def _wide(xp, a):
    return a.astype(xp.float32) if a is not None and a.dtype.itemsize < 4 else a


class BatchNorm(Op):
    def __init__(self, running_mean, running_var, training, momentum, eps):
        self.running_mean, self.running_var = running_mean, running_var  # Tensors or None, updated in place
        self.training, self.momentum, self.eps = training, momentum, eps

    def _check(self, x, weight, bias):
        if x.ndim < 2:
            raise op_error("batch_norm", "an input (N, C, ...) with at least 2 dims", f"input of shape {x.shape}")
        c = x.shape[1]
        named = (("weight", weight), ("bias", bias), ("running_mean", self.running_mean),
                 ("running_var", self.running_var))
        for name, t in named:
            if t is not None and tuple(t.shape) != (c,):
                raise op_error("batch_norm", f"{name} of shape ({c},) (the input's channel dim 1)",
                               f"{name} of shape {tuple(t.shape)} for input {tuple(x.shape)}",
                               "num_features of BatchNorm2d must equal the channels of its input")
        if self.training and x.size // c <= 1:
            raise op_error("batch_norm", "more than 1 value per channel when training",
                           f"input of shape {tuple(x.shape)}", "use a batch larger than 1, or eval mode")
        if not self.training and (self.running_mean is None or self.running_var is None):
            raise op_error("batch_norm", "running_mean and running_var in eval mode (training=False)", "None",
                           "pass training=True to normalise with the batch statistics")

    def forward(self, x, weight=None, bias=None):
        self._check(x, weight, bias)
        xp = self.xp
        axes = (0,) + tuple(range(2, x.ndim))
        per_channel = (1, -1) + (1,) * (x.ndim - 2)
        xw = _wide(xp, x)
        if self.training:
            mean = xw.mean(axis=axes)
            centered = xw - mean.reshape(per_channel)
            var = (centered * centered).mean(axis=axes)
            self._update_running(mean, var, x.size // x.shape[1])
        else:
            mean, var = _wide(xp, self.running_mean.array), _wide(xp, self.running_var.array)
            centered = xw - mean.reshape(per_channel).astype(xw.dtype)
        rstd = 1.0 / xp.sqrt(var + self.eps)
        out = centered * rstd.reshape(per_channel).astype(xw.dtype)
        if weight is not None:
            out *= _wide(xp, weight).reshape(per_channel)
        if bias is not None:
            out += _wide(xp, bias).reshape(per_channel)
        self.stash(mean, rstd)
        return narrow(xp, out, x.dtype)

    def _update_running(self, mean, var, count):
        m = self.momentum
        for t, stat in ((self.running_mean, mean), (self.running_var, var * (count / (count - 1)))):
            if t is not None:
                t.array[...] = ((1 - m) * t.array + m * stat).astype(t.array.dtype)
                t._version[0] += 1

    def setup_context(self, inputs, output):
        weight = inputs[1] if inputs[1] is not None and self.needs_input_grad[0] else None
        self.save_for_backward(inputs[0], weight)

    def backward(self, g):
        xp = self.xp
        x, weight = self.saved_arrays
        mean, rstd = self.stashed
        need_x, need_w, need_b = self.needs_input_grad
        axes = (0,) + tuple(range(2, x.ndim))
        per_channel = (1, -1) + (1,) * (x.ndim - 2)
        gw_ = _wide(xp, g)
        xhat = _wide(xp, x) - mean.reshape(per_channel).astype(gw_.dtype)
        xhat *= rstd.reshape(per_channel).astype(gw_.dtype)
        grad_x = grad_w = grad_b = None
        sum_g = gw_.sum(axis=axes)
        sum_gx = (gw_ * xhat).sum(axis=axes)
        if need_w:
            grad_w = narrow(xp, sum_gx, self._input_dtypes[1])
        if need_b:
            grad_b = narrow(xp, sum_g, self._input_dtypes[2])
        if need_x:
            scale = rstd if weight is None else rstd * _wide(xp, weight)
            scale = scale.astype(gw_.dtype)
            if self.training:
                count = x.size // x.shape[1]
                # dx = w * rstd * (g - mean(g) - xhat * mean(g * xhat)) over each channel
                dx = gw_ - (sum_g / count).reshape(per_channel) - xhat * (sum_gx / count).reshape(per_channel)
                dx *= scale.reshape(per_channel)
            else:
                dx = gw_ * scale.reshape(per_channel)
            grad_x = narrow(xp, dx, self._input_dtypes[0])
        return grad_x, grad_w, grad_b


def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    """Normalise x (N, C, ...) per channel, then scale by weight and shift by bias (both (C,) or None), as
    torch.nn.functional.batch_norm. ``training`` uses the batch statistics and updates the running ones (when
    not None) in place with ``momentum``; otherwise the running statistics normalise."""
    return BatchNorm(running_mean, running_var, bool(training), float(momentum), float(eps)).apply(x, weight, bias)


__all__ = ["batch_norm"]
