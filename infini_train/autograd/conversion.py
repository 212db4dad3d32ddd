"""Conversions: dtype casts, device moves and clones, each differentiable."""
from __future__ import annotations

from .. import backend
from .function import Op

__all__ = ["cast", "to_device", "clone"]


class Cast(Op):
    def __init__(self, dtype):
        self.dtype = dtype

    def forward(self, a):
        return a.astype(self.dtype)

    def setup_context(self, inputs, output):
        self.in_dtype = inputs[0].dtype

    def backward(self, g):
        return g.astype(self.in_dtype)


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


class Clone(Op):
    def forward(self, a):
        return a.copy()

    def backward(self, g):
        return g


def cast(x, dtype):
    return Cast(backend.as_dtype(dtype)).apply(x)


def to_device(x, device):
    """A copy of ``x`` on ``device``; gradients flow back to ``x``'s device."""
    return ToDevice(backend.Device.parse(device)).apply(x)


def clone(x):
    """A copy with its own memory; gradients flow back to ``x``."""
    return Clone().apply(x)
