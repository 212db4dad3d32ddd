"""max_pool2d and avg_pool2d with torch's arguments and output sizes (ceil_mode, count_include_pad,
divisor_override), one code path for numpy and cupy.

Both loop over the kh * kw kernel positions with one strided slice per position (see conv.window): forward
takes the running max / sum, backward adds the gradient back through the same slices. max_pool2d keeps the
winning kernel position per output (the first maximum, NaN wins as in torch) for backward and for the
indices it can return (flat h * W + w in the unpadded input, as torch's).
"""
from __future__ import annotations

import math

from .conv import pad_hw, pair, window
from ..double_backward import LinearAdjoint
from ..function import Op, op_error


def pooled_size(op, size, kernel, stride, pad, dilation, ceil_mode):
    """torch's pooling_output_shape: with ceil_mode the last window may hang over the end, but must start
    inside the input or the left padding."""
    span = dilation * (kernel - 1) + 1
    out = (size + 2 * pad - span + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1
    if out < 1:
        raise op_error(op, f"an input of at least {span - 2 * pad} along each pooled dim (kernel {kernel}, "
                       f"dilation {dilation}, padding {pad})", f"a dim of size {size} (output size {out})",
                       "use a smaller kernel_size, or pad the input")
    return out


def _geometry(op, x, kernel_size, stride, padding, dilation, ceil_mode):
    if x.ndim not in (3, 4):
        raise op_error(op, "a 3-D (C, H, W) or 4-D (N, C, H, W) input", f"input of shape {tuple(x.shape)}")
    kernel = pair(op, "kernel_size", kernel_size)
    stride = kernel if stride is None or stride == [] or stride == () else pair(op, "stride", stride)
    padding, dilation = pair(op, "padding", padding), pair(op, "dilation", dilation)
    if min(kernel) < 1 or min(stride) < 1 or min(dilation) < 1 or min(padding) < 0:
        raise op_error(op, "kernel_size, stride and dilation >= 1 and padding >= 0",
                       f"kernel_size={kernel}, stride={stride}, dilation={dilation}, padding={padding}")
    if padding[0] > kernel[0] // 2 or padding[1] > kernel[1] // 2:
        raise op_error(op, f"padding at most half the kernel size ({kernel[0] // 2}, {kernel[1] // 2})",
                       f"padding={padding} for kernel_size={kernel}", "use a larger kernel_size or less padding")
    out_hw = tuple(pooled_size(op, x.shape[-2 + d], kernel[d], stride[d], padding[d], dilation[d], ceil_mode)
                   for d in range(2))
    # ceil_mode windows may run past the padded input: pad the far side so every window slice is whole
    extra = tuple(max(0, (out_hw[d] - 1) * stride[d] + dilation[d] * (kernel[d] - 1) + 1
                      - (x.shape[-2 + d] + 2 * padding[d])) for d in range(2))
    pads = (padding[0], padding[0] + extra[0], padding[1], padding[1] + extra[1])
    return kernel, stride, padding, dilation, out_hw, pads


class MaxPool2d(Op):
    def __init__(self, kernel_size, stride, padding, dilation, ceil_mode):
        self.args = (kernel_size, stride, padding, dilation, ceil_mode)

    def forward(self, x):
        xp = self.xp
        kernel, stride, padding, dilation, out_hw, pads = _geometry("max_pool2d", x, *self.args)
        if x.dtype.kind not in "fV":
            raise op_error("max_pool2d", "a floating input", f"input of dtype {x.dtype}", "cast with .float()")
        xpad = pad_hw(xp, x, pads, value=-float("inf"))
        out = arg = None
        for i in range(kernel[0]):
            for j in range(kernel[1]):
                view = window(xpad, i, j, dilation, stride, out_hw)
                if out is None:
                    out, arg = view.copy(), xp.zeros(view.shape, dtype=xp.int32)
                    continue
                better = (view > out) | (view != view)  # the first maximum wins; NaN propagates
                xp.copyto(out, view, where=better)
                xp.copyto(arg, i * kernel[1] + j, where=better)
        self.geometry = (kernel, stride, padding, dilation, out_hw, pads)
        self.stash(arg)
        return out, self._indices(arg, x.shape)

    def _indices(self, arg, shape):
        """torch's return_indices: the flat position h * W + w of each maximum in the unpadded input."""
        xp = self.xp
        kernel, stride, padding, dilation, (ho, wo), _ = self.geometry
        rows = (xp.arange(ho) * stride[0] - padding[0]).reshape(ho, 1) + (arg // kernel[1]) * dilation[0]
        cols = (xp.arange(wo) * stride[1] - padding[1]).reshape(1, wo) + (arg % kernel[1]) * dilation[1]
        return (rows * shape[-1] + cols).astype(xp.int64)

    def backward(self, grad, _grad_indices):
        xp = self.xp
        (arg,) = self.stashed
        kernel, stride, _, dilation, out_hw, pads = self.geometry
        shape = self._input_shapes[0]
        top, bottom, left, right = pads
        gpad = xp.zeros(shape[:-2] + (shape[-2] + top + bottom, shape[-1] + left + right), dtype=grad.dtype)
        for i in range(kernel[0]):
            for j in range(kernel[1]):
                view = window(gpad, i, j, dilation, stride, out_hw)
                view += xp.where(arg == i * kernel[1] + j, grad, 0)  # not grad * mask: inf * 0 is nan
        return gpad[..., top:top + shape[-2], left:left + shape[-1]]

    def backward_graph(self, grad, _grad_indices):
        """Linear in the gradient for fixed maxima: as an op, whose own backward reads each window's maximum."""
        (arg,) = self.stashed
        shape = self._input_shapes[0]
        flat = self._indices(arg, shape)  # where each output's maximum sits in its (H * W) plane
        lead = int(math.prod(shape[:-2]))
        planes = self.xp.arange(lead).reshape((lead,) + (1,) * (flat.ndim - len(shape[:-2])))
        index = (planes, flat.reshape((lead,) + flat.shape[-2:]))

        def gather_maxima(gg):
            return gg.reshape(lead, shape[-2] * shape[-1])[index].reshape(tuple(flat.shape))

        return LinearAdjoint(lambda g: self.backward(g, None), gather_maxima).apply(grad)


class AvgPool2d(Op):
    def __init__(self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
        self.args = (kernel_size, stride, padding, 1, ceil_mode)
        self.count_include_pad, self.divisor_override = count_include_pad, divisor_override

    def _divisor(self, shape, dtype):
        """Per output position, what its window's sum is divided by (torch's rule, as an outer product)."""
        xp = self.xp
        kernel, stride, padding, _, out_hw, _ = self.geometry
        if self.divisor_override:
            return dtype.type(self.divisor_override)
        counts = []
        for d in range(2):
            size, start = shape[-2 + d], xp.arange(out_hw[d]) * stride[d] - padding[d]
            end = xp.minimum(start + kernel[d], size + padding[d])
            if not self.count_include_pad:
                start, end = xp.maximum(start, 0), xp.minimum(end, size)
            counts.append(end - start)
        return (counts[0].reshape(-1, 1) * counts[1].reshape(1, -1)).astype(dtype)

    def forward(self, x):
        xp = self.xp
        kernel, stride, padding, dilation, out_hw, pads = _geometry("avg_pool2d", x, *self.args)
        if x.dtype.kind not in "fV":
            raise op_error("avg_pool2d", "a floating input", f"input of dtype {x.dtype}", "cast with .float()")
        self.geometry = (kernel, stride, padding, dilation, out_hw, pads)
        wide = x.astype(xp.float32) if x.dtype.itemsize < 4 else x  # float16/bfloat16 sum in float32, as torch
        xpad = pad_hw(xp, wide, pads)
        out = xp.zeros(x.shape[:-2] + out_hw, dtype=wide.dtype)
        for i in range(kernel[0]):
            for j in range(kernel[1]):
                out += window(xpad, i, j, dilation, stride, out_hw)
        out /= self._divisor(x.shape, wide.dtype)
        return out.astype(x.dtype, copy=False)

    def backward_graph(self, g):
        """Linear in the gradient: as an op, whose own backward pools again."""
        kernel, stride, padding, _, _ = self.args
        again = (kernel, stride, padding, self.args[4], self.count_include_pad, self.divisor_override)
        return LinearAdjoint(self.backward, lambda gg: AvgPool2d(*again).apply(gg)).apply(g)

    def backward(self, grad):
        xp = self.xp
        kernel, stride, _, dilation, out_hw, pads = self.geometry
        shape = self._input_shapes[0]
        top, bottom, left, right = pads
        wide = grad.astype(xp.float32) if grad.dtype.itemsize < 4 else grad
        share = wide / self._divisor(shape, wide.dtype)
        gpad = xp.zeros(shape[:-2] + (shape[-2] + top + bottom, shape[-1] + left + right), dtype=wide.dtype)
        for i in range(kernel[0]):
            for j in range(kernel[1]):
                view = window(gpad, i, j, dilation, stride, out_hw)
                view += share
        return gpad[..., top:top + shape[-2], left:left + shape[-1]]


def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """The maximum over each kernel window of x (N, C, H, W) or (C, H, W), as torch.nn.functional.max_pool2d
    (stride defaults to kernel_size; padding is -inf); with return_indices also the int64 flat positions."""
    out, indices = MaxPool2d(kernel_size, stride, padding, dilation, ceil_mode).apply(x)
    return (out, indices) if return_indices else out


def avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    """The mean over each kernel window of x (N, C, H, W) or (C, H, W), as torch.nn.functional.avg_pool2d."""
    if divisor_override is not None and (not isinstance(divisor_override, int) or divisor_override == 0):
        raise op_error("avg_pool2d", "divisor_override as a non-zero int or None", repr(divisor_override))
    return AvgPool2d(kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override).apply(x)


__all__ = ["max_pool2d", "avg_pool2d"]
