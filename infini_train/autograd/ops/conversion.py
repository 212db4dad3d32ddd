"""Conversions: dtype casts, device moves, clones and copies, each differentiable."""
from __future__ import annotations

from ... import backend
from ...tensor import Tensor
from ..function import Op, op_error, sum_to
from .low_precision import narrow

__all__ = ["cast", "to_device", "clone"]


class Cast(Op):
    def __init__(self, dtype):
        self.dtype = dtype

    def forward(self, a):
        return narrow(self.xp, a, self.dtype) if a.dtype != self.dtype else a.copy()  # a cast never aliases

    def setup_context(self, inputs, output):
        self.in_dtype = inputs[0].dtype

    def backward(self, g):
        return narrow(self.xp, g, self.in_dtype)

    def backward_graph(self, g):
        return g.to(self.in_dtype)


class ToDevice(Op):
    cross_device = True

    def __init__(self, device):
        self.target = device
        self.output_devices = device

    def forward(self, a):
        return backend.to_device_array(a, self.target)

    def setup_context(self, inputs, output):
        self.source = inputs[0].device

    def backward(self, g):
        return backend.to_device_array(g, self.source)

    def backward_graph(self, g):
        return g.to(self.source)


class Clone(Op):
    def forward(self, a):
        return a.copy()

    def backward(self, g):
        return g

    backward_graph = backward


class Copy(Op):
    """The value of ``dst.copy_(src)``: ``src`` (any device) broadcast to dst's shape and cast to its dtype.
    The old value of dst gets no gradient; src gets the gradient summed back to its shape, on its device."""

    cross_device = True

    def __init__(self, device):
        self.output_devices = device

    def forward(self, dst, src):
        if backend.is_array_like(src) and not isinstance(src, self.xp.ndarray):  # an array of another device
            src = backend.to_device_array(src, self.output_devices)
        out = self.xp.empty_like(dst)
        try:
            self.xp.copyto(out, src, casting="unsafe")
        except ValueError as exc:
            raise op_error("copy_", f"a source broadcastable to the destination's shape {dst.shape}",
                           f"a source of shape {getattr(src, 'shape', ())}",
                           "copy_ writes every element of the destination; reshape or index the source") from exc
        return out

    def setup_context(self, inputs, output):
        self.source = inputs[1].device if isinstance(inputs[1], Tensor) else None

    def backward(self, g):
        need_dst, need_src = self.needs_input_grad
        grad_dst = self.xp.zeros(g.shape, g.dtype) if need_dst else None  # overwritten: zero, as torch
        grad_src = backend.to_device_array(sum_to(g, self._input_shapes[1]), self.source) if need_src else None
        return grad_dst, grad_src

    def backward_graph(self, g):
        need_dst, need_src = self.needs_input_grad
        return (g * 0 if need_dst else None), (sum_to(g, self._input_shapes[1]).to(self.source) if need_src else None)


def cast(x, dtype):
    return Cast(backend.as_dtype(dtype)).apply(x)


def to_device(x, device):
    """A copy of ``x`` on ``device``; gradients flow back to ``x``'s device."""
    if x.device is backend.META:
        raise meta_copy_error("Tensor.to")
    return ToDevice(backend.Device.parse(device)).apply(x)


def meta_copy_error(what):
    return RuntimeError(f"{what}: a tensor on the meta device has no data to copy\nHINT: give the module storage with "
                        "module.to_empty(device=...) and then fill it (load a checkpoint or initialise)")


def clone(x):
    """A copy with its own memory; gradients flow back to ``x``."""
    return Clone().apply(x)
