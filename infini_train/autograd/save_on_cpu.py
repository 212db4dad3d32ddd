"""``it.autograd.graph.save_on_cpu``, as torch.autograd.graph.save_on_cpu: a ``saved_tensors_hooks`` pair that
keeps the tensors the forward saves for backward in host memory, and moves each back to its device when backward
needs it. GPU memory is traded for two copies per saved tensor; on the CPU nothing is copied (a saved tensor is
kept as it is), and the gradients are those of the same graph without the hooks.
"""
from __future__ import annotations

import numpy as np

from .. import backend
from .saved_hooks import saved_tensors_hooks


def _pinned_host_copy(array):
    """A copy of the GPU ``array`` in pinned (page-locked) host memory; a plain host copy for a dtype cupy keeps
    as raw words (bfloat16)."""
    cp = backend.cupy_module()
    try:
        host = np.frombuffer(cp.cuda.alloc_pinned_memory(max(array.nbytes, 1)), np.dtype(array.dtype),
                             array.size).reshape(array.shape)
        cp.asnumpy(cp.ascontiguousarray(array), out=host)
        return host
    except (TypeError, ValueError):
        return backend.to_device_array(array, backend.CPU).copy()


class save_on_cpu(saved_tensors_hooks):
    """``with save_on_cpu(pin_memory=False):`` tensors saved for backward inside the block live on the host until
    backward moves them back to their device (pinned host memory with ``pin_memory=True``, which makes both copies
    faster). Tensors already on the CPU are saved as they are. ``device_type`` is accepted for torch's signature;
    every GPU device is handled."""

    def __init__(self, pin_memory=False, device_type="cuda"):
        if device_type not in ("cuda", "cpu"):
            raise ValueError(f"save_on_cpu: device_type must be 'cuda' (or 'cpu'), got {device_type!r}\n"
                             "HINT: leave it out; tensors of every GPU are moved")
        pin_memory = bool(pin_memory)

        def pack_to_cpu(tensor):
            device, array = tensor.device, tensor.array
            if device.type == "cpu":
                return device, array
            return device, _pinned_host_copy(array) if pin_memory else backend.to_device_array(array, backend.CPU)

        def unpack_from_cpu(packed):
            device, array = packed
            return array if device.type == "cpu" else backend.to_device_array(array, device)

        super().__init__(pack_to_cpu, unpack_from_cpu)
        self.pin_memory = pin_memory


__all__ = ["save_on_cpu"]
