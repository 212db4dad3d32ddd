"""DataParallel: one process, many devices, built from the comm Functions.

forward: Scatter the inputs along ``dim``, replicate the module with Broadcast (so every replica's
gradients flow back, summed by ReduceAddCoalesced, into the original parameters), run the replicas in
threads (each re-applies the caller's grad mode, which is thread-local, and its device), and Gather the
outputs on ``output_device``.
"""
from __future__ import annotations

import copy
import threading

from ... import backend
from ...autograd.ops import comm
from ...autograd import autocast
from ...autograd.grad_mode import is_grad_enabled, set_grad_enabled
from ...tensor import Tensor
from ..module import Module


def _device_list(device_ids):
    if device_ids is None:
        n = backend.device_count("cuda")
        device_ids = list(range(n)) if n else ["cpu"]
    out = []
    for d in device_ids:
        if isinstance(d, int):
            d = f"cuda:{d}" if backend.device_count("cuda") else f"cpu:{d}"
        out.append(backend.Device.parse(d))
    return out


def scatter_inputs(inputs, devices, dim):
    """Per-device argument tuples: tensors are split along ``dim``; other values are passed to every replica."""
    pieces = [comm.scatter(x, devices, dim) if isinstance(x, Tensor) else None for x in inputs]
    count = min((len(p) for p in pieces if p is not None), default=len(devices))
    return [tuple(p[i] if p is not None else x for p, x in zip(pieces, inputs)) for i in range(count)]


def replicate(module, devices):
    """Copies of ``module`` on each device whose parameters are Broadcast outputs (gradients flow back). As in
    torch, the first replica shares the module's own buffers where they live on its device, so in-place updates
    there (BatchNorm's running statistics) are kept; the other replicas' are dropped with them."""
    params = list(module.parameters())
    buffers = list(module.buffers())
    copies = comm.broadcast(params, devices) if params else [[] for _ in devices]
    buffer_copies = [[b if i == 0 and b.device is d else Tensor._make(comm.copy_to(b.array, d), d) for b in buffers]
                     for i, d in enumerate(devices)]
    replicas = []
    for dev_params, dev_buffers in zip(copies, buffer_copies):
        by_id = {id(p): c for p, c in zip(params, dev_params)}
        by_id.update({id(b): c for b, c in zip(buffers, dev_buffers)})
        replicas.append(_clone_structure(module, by_id))
    return replicas


def _clone_structure(module, by_id):
    clone = copy.copy(module)
    d = clone.__dict__
    d["_parameters"] = {k: (by_id[id(v)] if v is not None else None) for k, v in module._parameters.items()}
    d["_buffers"] = {k: (by_id[id(v)] if v is not None else None) for k, v in module._buffers.items()}
    d["_modules"] = {k: (_clone_structure(v, by_id) if v is not None else None) for k, v in module._modules.items()}
    d["_forward_hooks"] = list(module._forward_hooks)
    d["_forward_pre_hooks"] = list(module._forward_pre_hooks)
    return clone


def parallel_apply(replicas, inputs, devices):
    """Run replica i on inputs[i] in its own thread; re-raise the first failure naming its replica/device."""
    grad_mode = is_grad_enabled()
    autocast_settings = autocast.snapshot()  # thread-local, like grad mode: re-applied in each replica's thread
    results = [None] * len(replicas)
    errors = [None] * len(replicas)

    def run(i):
        try:
            autocast.restore(autocast_settings)
            with set_grad_enabled(grad_mode), devices[i].context():
                results[i] = replicas[i](*inputs[i])
        except BaseException as exc:  # re-raised in the caller
            errors[i] = exc

    if len(replicas) == 1:
        run(0)
    else:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(replicas))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for i, exc in enumerate(errors):
        if exc is not None:
            raise RuntimeError(f"DataParallel: replica {i} on device {devices[i]} raised "
                               f"{type(exc).__name__}: {exc}") from exc
    return results


def gather_outputs(outputs, device, dim):
    first = outputs[0]
    if isinstance(first, Tensor):
        return comm.gather(outputs, device, dim)
    if first is None:
        return None
    if isinstance(first, (tuple, list)):
        return type(first)(gather_outputs([o[i] for o in outputs], device, dim) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: gather_outputs([o[k] for o in outputs], device, dim) for k in first}
    return first


class DataParallel(Module):
    """Split each batch across ``device_ids`` (logical CPU devices cpu:N or GPUs) in one process."""

    def __init__(self, module, device_ids=None, output_device=None, dim=0):
        super().__init__()
        self.module = module
        self.device_ids = _device_list(device_ids)
        self.output_device = backend.Device.parse(output_device) if output_device is not None else self.device_ids[0]
        self.dim = dim
        src = self.device_ids[0]
        for name, p in module.named_parameters():
            if p.device is not src:
                raise ValueError(f"DataParallel: parameter {name} is on {p.device}, expected device_ids[0] = {src}\n"
                                 f"HINT: call module.to('{src}') before wrapping it")

    def forward(self, *inputs):
        devices = self.device_ids
        if len(devices) == 1:
            moved = [x.to(devices[0]) if isinstance(x, Tensor) else x for x in inputs]
            return self.module(*moved)
        per_device = scatter_inputs(inputs, devices, self.dim)
        used = devices[:len(per_device)]
        replicas = replicate(self.module, used)
        outputs = parallel_apply(replicas, per_device, used)
        return gather_outputs(outputs, self.output_device, self.dim)
