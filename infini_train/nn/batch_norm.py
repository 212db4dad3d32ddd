"""BatchNorm1d / 2d / 3d with torch 2.13's signature: (num_features, eps, momentum, affine, track_running_stats,
device, dtype, *, bias). Training normalises with the batch statistics and updates ``running_mean`` /
``running_var`` (buffers, in the state dict with ``num_batches_tracked``, as torch's); eval normalises with them.
``momentum=None`` keeps a cumulative average instead; ``bias=False`` (with ``affine``) learns a scale only."""
from __future__ import annotations

from .. import backend
from ..autograd.function import op_error
from . import functional as F
from . import init
from .conv import _buffer
from .layers import _param
from .module import Module


class _BatchNorm(Module):
    _version = 2  # torch's: the layout with num_batches_tracked (its state_dict metadata says so)
    DIMS = ()  # the input ranks this layer takes
    SHAPES = ""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True, device=None,
                 dtype=None, *, bias=True):
        super().__init__()
        self.num_features, self.eps, self.momentum = int(num_features), eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        self.register_parameter("weight", _param(num_features, device=device, dtype=dtype) if affine else None)
        self.register_parameter("bias", _param(num_features, device=device, dtype=dtype) if affine and bias
                                else None)
        if track_running_stats:
            self.register_buffer("running_mean", _buffer((num_features,), 0.0, dtype, device))
            self.register_buffer("running_var", _buffer((num_features,), 1.0, dtype, device))
            self.register_buffer("num_batches_tracked", _buffer((), 0, backend.int64, device))
        else:
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                self.register_buffer(name, None)
        self.reset_parameters()

    def reset_running_stats(self):
        if self.track_running_stats:
            self.running_mean.array[...] = 0
            self.running_var.array[...] = 1
            self.num_batches_tracked.array[...] = 0

    def reset_parameters(self):
        self.reset_running_stats()
        if self.affine:
            init.ones_(self.weight)
            if self.bias is not None:
                init.zeros_(self.bias)

    def forward(self, x):
        name = type(self).__name__
        if x.ndim not in self.DIMS:
            raise op_error(name, f"a {' or '.join(f'{d}-D' for d in self.DIMS)} input {self.SHAPES}",
                           f"input of shape {tuple(x.shape)}", "pick the batch norm of the input's rank "
                           "(BatchNorm1d, 2d or 3d), or LayerNorm")
        self._check_dtype(name, x)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.array[...] += 1
            factor = 1.0 / float(self.num_batches_tracked.array) if self.momentum is None else self.momentum
        if x.numel() == 0:
            return self._empty(name, x)
        use_batch_stats = self.training or self.running_mean is None
        # eval without running statistics normalises with the batch's, and then must not update anything
        stats = (self.running_mean, self.running_var) if self.training or not use_batch_stats else (None, None)
        return F.batch_norm(x, *stats, self.weight, self.bias, use_batch_stats, factor, self.eps)

    def _empty(self, name, x):
        """An empty batch, as torch: an empty output, running statistics untouched (the batch count still
        advances), and zero gradients for the affine parameters."""
        if x.shape[1] != self.num_features:
            raise op_error(name, f"{self.num_features} channels (dim 1)", f"input of shape {tuple(x.shape)}",
                           "num_features must equal the input's channel dim")
        shape = (1, self.num_features) + (1,) * (x.ndim - 2)
        out = x * self.weight.reshape(shape) if self.weight is not None else x.clone()
        if self.bias is not None:
            out = out + self.bias.reshape(shape)
        return out.to(x.dtype)

    def _check_dtype(self, name, x):
        """torch's rule (CPU): the input has the parameters' dtype, or is bfloat16/float16 beside float32 ones."""
        state = next((t for t in (self.weight, self.bias, self.running_mean) if t is not None), None)
        if state is None or x.dtype == state.dtype:
            return
        if state.dtype == backend.float32 and x.dtype in (backend.bfloat16, backend.float16):
            return
        raise op_error(name, f"an input of the layer's dtype {state.dtype} (or bfloat16/float16 beside float32 "
                       "parameters)", f"input of dtype {x.dtype}",
                       "cast the input with x.to(dtype), or the layer with layer.to(dtype)")

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}" + ("" if self.bias is not None or not self.affine
                                                                     else ", bias=False"))


class BatchNorm1d(_BatchNorm):
    DIMS, SHAPES = (2, 3), "(N, C) or (N, C, L)"


class BatchNorm2d(_BatchNorm):
    DIMS, SHAPES = (4,), "(N, C, H, W)"


class BatchNorm3d(_BatchNorm):
    DIMS, SHAPES = (5,), "(N, C, D, H, W)"


__all__ = ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d"]
