"""conv2d as im2col + GEMM, one code path for numpy and cupy.

The columns are gathered with one strided slice copy per kernel position (kh * kw copies, no ``as_strided`` and
no index arrays), laid out (C, kh, kw, N, Ho, Wo) so that each group's product is a single GEMM over the whole
batch: (O/g, C/g*kh*kw) @ (C/g*kh*kw, N*Ho*Wo). Backward is the same two GEMMs transposed, and col2im is again
one strided add per kernel position (never ``add.at``, which is slow on both backends).

float16/bfloat16 inputs accumulate in float32 and are rounded once, as in linear (see low_precision.py).
"""
from __future__ import annotations

from . import low_precision as lp
from ..double_backward import recomputed_grads
from ..function import Op, op_error


def pair(op, name, value):
    """An int or a pair of ints as a pair (torch's _pair), refusing anything else with a clear error."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, value)
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return (int(value[0]), int(value[1]))
    raise op_error(op, f"{name} as an int or a pair of ints", repr(value), f"e.g. {name}=1 or {name}=(1, 2)")


def window(xpad, i, j, dilation, stride, out_hw):
    """The (..., Ho, Wo) view of ``xpad`` that kernel position (i, j) sees across every output position."""
    (dh, dw), (sh, sw), (ho, wo) = dilation, stride, out_hw
    top, left = i * dh, j * dw
    return xpad[..., top:top + sh * (ho - 1) + 1:sh, left:left + sw * (wo - 1) + 1:sw]


def pad_hw(xp, x, pads, value=0):
    """x padded on its last two dims by (top, bottom, left, right) with ``value``."""
    top, bottom, left, right = pads
    if not (top or bottom or left or right):
        return x
    out = xp.full(x.shape[:-2] + (x.shape[-2] + top + bottom, x.shape[-1] + left + right), value, dtype=x.dtype)
    out[..., top:top + x.shape[-2], left:left + x.shape[-1]] = x
    return out


def same_padding(kernel, dilation):
    """torch's padding="same" amounts (top, bottom, left, right): the extra one, if any, goes after."""
    pads = []
    for k, d in zip(kernel, dilation):
        total = d * (k - 1)
        pads += [total // 2, total - total // 2]
    return pads[0], pads[1], pads[2], pads[3]


class Conv2d(Op):
    def __init__(self, stride, padding, dilation, groups):
        self.stride, self.dilation, self.groups = stride, dilation, groups
        self.padding = padding  # (top, bottom, left, right)

    def _check(self, x, weight, bias):
        if x.ndim != 4:
            raise op_error("conv2d", "a 4-D input (N, C, H, W)", f"input of shape {tuple(x.shape)}",
                           "add a batch dim with x.unsqueeze(0) for a single (C, H, W) image")
        if weight.ndim != 4:
            raise op_error("conv2d", "a 4-D weight (out_channels, in_channels / groups, kH, kW)",
                           f"weight of shape {tuple(weight.shape)}")
        out_ch, in_per_group = weight.shape[0], weight.shape[1]
        g = self.groups
        if out_ch % g:
            raise op_error("conv2d", f"out_channels divisible by groups={g}", f"weight of shape {tuple(weight.shape)}",
                           "choose groups that divide both in_channels and out_channels")
        if x.shape[1] != in_per_group * g:
            raise op_error("conv2d", f"input with {in_per_group * g} channels (weight {tuple(weight.shape)} x "
                           f"groups={g})", f"input of shape {tuple(x.shape)} ({x.shape[1]} channels)",
                           "weight is (out_channels, in_channels / groups, kH, kW): check in_channels and groups")
        if bias is not None and tuple(bias.shape) != (out_ch,):
            raise op_error("conv2d", f"bias of shape ({out_ch},) (out_channels)", f"bias of shape {tuple(bias.shape)}")
        if x.dtype != weight.dtype or (bias is not None and bias.dtype != weight.dtype):
            got = f"input {x.dtype}, weight {weight.dtype}" + (f", bias {bias.dtype}" if bias is not None else "")
            raise op_error("conv2d", "input, weight and bias of one dtype", got, "cast with .to(dtype)")
        top, bottom, left, right = self.padding
        (dh, dw), (sh, sw) = self.dilation, self.stride
        span_h, span_w = dh * (weight.shape[2] - 1) + 1, dw * (weight.shape[3] - 1) + 1
        ph, pw = x.shape[2] + top + bottom, x.shape[3] + left + right
        if span_h > ph or span_w > pw:
            raise op_error("conv2d", f"a kernel no larger than the padded input ({ph} x {pw})",
                           f"a kernel spanning {span_h} x {span_w} (weight {tuple(weight.shape)[2:]}, dilation "
                           f"{self.dilation})", "use a smaller kernel or dilation, or more padding")
        return (ph - span_h) // sh + 1, (pw - span_w) // sw + 1

    def forward(self, x, weight, bias=None):
        ho, wo = self._check(x, weight, bias)
        xp, g = self.xp, self.groups
        dtype = x.dtype
        x, weight, bias = lp.widen(xp, x, weight, bias)
        n, c = x.shape[:2]
        o, _, kh, kw = weight.shape
        xpad = pad_hw(xp, x, self.padding)
        cols = xp.empty((c, kh, kw, n, ho, wo), dtype=x.dtype)
        for i in range(kh):
            for j in range(kw):
                cols[:, i, j] = window(xpad, i, j, self.dilation, self.stride, (ho, wo)).transpose(1, 0, 2, 3)
        cols = cols.reshape(g, (c // g) * kh * kw, n * ho * wo)
        out = lp.matmul(xp, weight.reshape(g, o // g, -1), cols)  # (g, O/g, N*Ho*Wo)
        out = out.reshape(o, n, ho, wo)
        if bias is not None:
            out += bias.reshape(o, 1, 1, 1)
        self.stash(cols)  # kept for the weight gradient; setup_context drops it when none is needed
        return lp.narrow(xp, xp.ascontiguousarray(out.transpose(1, 0, 2, 3)), dtype)

    def setup_context(self, inputs, output):
        if not self.needs_input_grad[1]:
            self.stash(None)
        self.save_for_backward(inputs[0], inputs[1])  # (references: a double backward recomputes the forward)

    def backward(self, grad):
        xp, g = self.xp, self.groups
        _, weight = self.saved_arrays
        (cols,) = self.stashed
        need_x, need_w, need_b = self.needs_input_grad
        (n, c, h, w), wshape = self._input_shapes[0], self._input_shapes[1]
        o, _, kh, kw = wshape
        grad, weight = lp.widen(xp, grad, weight)
        ho, wo = grad.shape[2:]
        g2 = xp.ascontiguousarray(grad.transpose(1, 0, 2, 3)).reshape(g, o // g, n * ho * wo)
        grad_x = grad_w = grad_b = None
        if need_w:
            grad_w = lp.matmul(xp, g2, cols.transpose(0, 2, 1)).reshape(wshape)
            grad_w = lp.narrow(xp, grad_w, self._input_dtypes[1])
        if need_b:
            grad_b = lp.narrow(xp, grad.sum(axis=(0, 2, 3)), self._input_dtypes[2])
        if need_x:
            gcols = lp.matmul(xp, weight.reshape(g, o // g, -1).transpose(0, 2, 1), g2).reshape(c, kh, kw, n, ho, wo)
            top, bottom, left, right = self.padding
            gpad = xp.zeros((n, c, h + top + bottom, w + left + right), dtype=gcols.dtype)
            for i in range(kh):
                for j in range(kw):
                    view = window(gpad, i, j, self.dilation, self.stride, (ho, wo))
                    view += gcols[:, i, j].transpose(1, 0, 2, 3)
            grad_x = lp.narrow(xp, gpad[:, :, top:top + h, left:left + w], self._input_dtypes[0])
        return grad_x, grad_w, grad_b

    def backward_graph(self, grad):
        x, weight = self.saved_tensors
        grad_x, grad_w = recomputed_grads(self, self._composite, (x, weight), grad)[:2]
        grad_b = grad.sum((0, 2, 3)) if self.needs_input_grad[2] else None
        return grad_x, grad_w, grad_b

    def _composite(self, x, weight):
        """The convolution (without bias) in differentiable ops, for double backward: the padded input's strided
        windows, stacked per kernel position, times the weight, group by group."""
        from .padding import pad
        from .joins import stack

        top, bottom, left, right = self.padding
        (dh, dw), (sh, sw) = self.dilation, self.stride
        n, c = x.shape[:2]
        o, _, kh, kw = weight.shape
        g = self.groups
        xpad = pad(x, (left, right, top, bottom)) if any(self.padding) else x
        ho = (xpad.shape[2] - dh * (kh - 1) - 1) // sh + 1
        wo = (xpad.shape[3] - dw * (kw - 1) - 1) // sw + 1
        windows = [xpad[:, :, i * dh:i * dh + sh * (ho - 1) + 1:sh, j * dw:j * dw + sw * (wo - 1) + 1:sw]
                   for i in range(kh) for j in range(kw)]
        cols = stack(windows, 2).reshape(n, g, (c // g) * kh * kw, ho * wo)  # channel-major, then kernel position
        out = weight.reshape(g, o // g, (c // g) * kh * kw) @ cols  # (n, g, o / g, ho * wo)
        return out.reshape(n, o, ho, wo)


def conv_padding(padding, kernel, dilation, stride):
    """(top, bottom, left, right) from torch's padding argument: an int, a pair, "valid" or "same"."""
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0, 0, 0)
        if padding == "same":
            if stride != (1, 1):
                raise op_error("conv2d", 'stride 1 with padding="same"', f"stride={stride}",
                               'pass explicit padding for strided convolutions')
            return same_padding(kernel, dilation)
        raise op_error("conv2d", 'padding as an int, a pair, "valid" or "same"', repr(padding))
    ph, pw = pair("conv2d", "padding", padding)
    if ph < 0 or pw < 0:
        raise op_error("conv2d", "non-negative padding", f"padding={padding!r}")
    return (ph, ph, pw, pw)


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """2-D cross-correlation of x (N, C, H, W) with weight (O, C / groups, kH, kW), plus bias (O,), as
    torch.nn.functional.conv2d (padding: int, pair, "valid" or "same")."""
    stride, dilation = pair("conv2d", "stride", stride), pair("conv2d", "dilation", dilation)
    if min(stride) < 1 or min(dilation) < 1:
        raise op_error("conv2d", "stride and dilation >= 1", f"stride={stride}, dilation={dilation}")
    if not isinstance(groups, int) or groups < 1:
        raise op_error("conv2d", "groups as a positive int", repr(groups))
    kernel = tuple(weight.shape[2:]) if weight.ndim == 4 else (1, 1)
    return Conv2d(stride, conv_padding(padding, kernel, dilation, stride), dilation, groups).apply(x, weight, bias)


__all__ = ["conv2d"]
