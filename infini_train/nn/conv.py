"""Convolutional layers: Conv2d, MaxPool2d, AvgPool2d, BatchNorm2d and Flatten, with torch.nn's arguments,
parameter and buffer names, default initialisation and ``repr``."""
from __future__ import annotations

import math

from .. import backend
from ..autograd.ops.conv import pair, same_padding
from ..tensor import Tensor
from . import functional as F
from . import init
from .layers import _param
from .module import Module

_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


def _buffer(shape, fill, dtype, device):
    dev = backend.Device.parse(device)
    xp = dev.array_module()
    with dev.context():
        array = xp.full(shape, fill, dtype=backend.as_dtype(dtype) or backend.get_default_dtype())
    return Tensor._make(array, dev)


class Conv2d(Module):
    """2-D convolution: weight (out_channels, in_channels / groups, kH, kW) and bias (out_channels,), both
    initialised as torch's (kaiming_uniform with a=sqrt(5); bias uniform in +-1/sqrt(fan_in)). ``padding`` is an
    int, a pair, "valid" or "same"; ``padding_mode`` zeros, reflect, replicate or circular."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True,
                 padding_mode="zeros", device=None, dtype=None):
        super().__init__()
        if groups < 1 or in_channels % groups or out_channels % groups:
            raise ValueError(f"Conv2d: expected groups dividing in_channels and out_channels, got in_channels="
                             f"{in_channels}, out_channels={out_channels}, groups={groups}\n"
                             "HINT: choose groups among the common divisors of the two channel counts")
        if padding_mode not in _PADDING_MODES:
            raise ValueError(f"Conv2d: expected padding_mode in {_PADDING_MODES}, got {padding_mode!r}")
        self.in_channels, self.out_channels, self.groups = int(in_channels), int(out_channels), int(groups)
        self.kernel_size = pair("Conv2d", "kernel_size", kernel_size)
        self.stride, self.dilation = pair("Conv2d", "stride", stride), pair("Conv2d", "dilation", dilation)
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ValueError(f"Conv2d: expected padding as an int, a pair, 'same' or 'valid', got {padding!r}")
            if padding == "same" and self.stride != (1, 1):
                raise ValueError("Conv2d: padding='same' is not supported for strided convolutions\n"
                                 "HINT: pass explicit padding, e.g. padding=kernel_size // 2")
            self.padding = padding
        else:
            self.padding = pair("Conv2d", "padding", padding)
        self.padding_mode = padding_mode
        self.weight = _param(out_channels, in_channels // groups, *self.kernel_size, device=device, dtype=dtype)
        if bias:
            self.bias = _param(out_channels, device=device, dtype=dtype)
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in = (self.in_channels // self.groups) * self.kernel_size[0] * self.kernel_size[1]
            bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
            init.uniform_(self.bias, -bound, bound)

    def _explicit_padding(self):
        """(top, bottom, left, right) for padding modes other than zeros, which pad before the convolution."""
        if self.padding == "valid":
            return (0, 0, 0, 0)
        if self.padding == "same":
            return same_padding(self.kernel_size, self.dilation)
        return (self.padding[0], self.padding[0], self.padding[1], self.padding[1])

    def forward(self, x):
        if self.padding_mode == "zeros":
            return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)
        top, bottom, left, right = self._explicit_padding()
        x = F.pad(x, (left, right, top, bottom), mode=self.padding_mode)
        return F.conv2d(x, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)

    def extra_repr(self):
        text = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0, 0):
            text += f", padding={self.padding}"
        if self.dilation != (1, 1):
            text += f", dilation={self.dilation}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        if self.bias is None:
            text += ", bias=False"
        if self.padding_mode != "zeros":
            text += f", padding_mode={self.padding_mode}"
        return text


class MaxPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False):
        super().__init__()
        self.kernel_size, self.stride = kernel_size, stride if stride is not None else kernel_size
        self.padding, self.dilation = padding, dilation
        self.return_indices, self.ceil_mode = return_indices, ceil_mode

    def forward(self, x):
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode,
                            self.return_indices)

    def extra_repr(self):
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class AvgPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                 divisor_override=None):
        super().__init__()
        self.kernel_size, self.stride = kernel_size, stride if stride is not None else kernel_size
        self.padding, self.ceil_mode = padding, ceil_mode
        self.count_include_pad, self.divisor_override = count_include_pad, divisor_override

    def forward(self, x):
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad,
                            self.divisor_override)

    def extra_repr(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class Flatten(Module):
    """Merge dims ``start_dim``..``end_dim`` (by default every dim but the batch dim) into one."""

    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        return x.flatten(self.start_dim, self.end_dim)

    def extra_repr(self):
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Unflatten(Module):
    """Split dim ``dim`` into ``unflattened_size`` (one size may be -1), as torch.nn.Unflatten."""

    def __init__(self, dim, unflattened_size):
        super().__init__()
        if isinstance(unflattened_size, list):
            unflattened_size = tuple(unflattened_size)
        if not isinstance(unflattened_size, tuple):
            raise TypeError(f"Unflatten: expected unflattened_size as a tuple or list of ints, got "
                            f"{type(unflattened_size).__name__}\nHINT: nn.Unflatten(1, (2, 3))")
        self.dim, self.unflattened_size = dim, unflattened_size

    def forward(self, x):
        return x.unflatten(self.dim, self.unflattened_size)

    def extra_repr(self):
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"


__all__ = ["Conv2d", "MaxPool2d", "AvgPool2d", "Flatten", "Unflatten"]
