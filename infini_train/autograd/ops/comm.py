"""Communication Functions across devices of one process, each an autograd Function whose backward is
its dual:

    Scatter(devices, dim)             split a batch across devices         backward: Gather
    Gather(device, dim)               concatenate outputs onto one device  backward: Scatter
    Broadcast(devices)                copy tensors to every device         backward: ReduceAddCoalesced
    ReduceAddCoalesced(device, n)     sum per-device tensor lists          backward: Broadcast

On GPUs the copies are cupy device-to-device transfers; on logical CPU devices (cpu:N) they are host
copies that change the tensor's device tag, so the same logic runs (and is tested) without a GPU.
ReduceAddCoalesced packs each device's tensors into one flat buffer, so each transfer is one copy per
device.
"""
from __future__ import annotations

from ... import backend
from ..function import Op, op_error


def copy_to(array, device):
    """A copy of ``array`` living on ``device`` (always a distinct buffer, also between logical CPU devices)."""
    moved = backend.to_device_array(array, device)
    if moved is array:
        moved = array.copy()
    return moved


def chunk_sizes(n, parts):
    """Split n items into at most ``parts`` non-empty chunks whose sizes differ by at most one."""
    parts = min(parts, n) if n else 1
    base, extra = divmod(n, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def _devices(devices):
    devs = [backend.Device.parse(d) for d in devices]
    if not devs:
        raise op_error("comm", "at least one device", "an empty device list")
    return devs


class Scatter(Op):
    """Split one tensor along ``dim`` into chunks, chunk i on devices[i] (fewer chunks if it is smaller)."""

    cross_device = True

    def __init__(self, devices, dim=0):
        self.devices = _devices(devices)
        self.dim = dim

    def forward(self, x):
        if x.ndim == 0:
            raise op_error("Scatter", "a tensor with at least one dimension", "a 0-d tensor")
        sizes = chunk_sizes(x.shape[self.dim], len(self.devices))
        self.sizes = sizes
        self.output_devices = self.devices[:len(sizes)]
        bounds = [sum(sizes[:i]) for i in range(1, len(sizes))]
        pieces = self.xp.split(x, bounds, axis=self.dim)
        return tuple(copy_to(p, d) for p, d in zip(pieces, self.output_devices))

    def setup_context(self, inputs, outputs):
        self.source = inputs[0].device

    def backward(self, *grads):
        return _concat_on(self.source, grads, self.dim)


def _concat_on(device, arrays, dim):
    xp = device.array_module()
    with device.context():
        return xp.concatenate([backend.to_device_array(a, device) for a in arrays], axis=dim)


class Gather(Op):
    """Concatenate per-device tensors along ``dim`` on ``device``; 0-d inputs are stacked into a vector."""

    cross_device = True

    def __init__(self, device, dim=0):
        self.target = backend.Device.parse(device)
        self.output_devices = self.target
        self.dim = dim

    def forward(self, *xs):
        self.scalars = all(x.ndim == 0 for x in xs)
        if self.scalars:
            xs = tuple(x.reshape(1) for x in xs)
        self.sizes = [x.shape[self.dim] for x in xs]
        return _concat_on(self.target, xs, self.dim)

    def setup_context(self, inputs, output):
        self.sources = [t.device for t in inputs]

    def backward(self, g):
        bounds = [sum(self.sizes[:i]) for i in range(1, len(self.sizes))]
        pieces = self.target.array_module().split(g, bounds, axis=self.dim)
        out = []
        for piece, dev in zip(pieces, self.sources):
            piece = copy_to(piece, dev)
            out.append(piece.reshape(()) if self.scalars else piece)
        return tuple(out)


class Broadcast(Op):
    """Copy every input to every device. Outputs are device-major: [dev0: x0..xn-1, dev1: x0..xn-1, ...]."""

    cross_device = True

    def __init__(self, devices):
        self.devices = _devices(devices)

    def forward(self, *xs):
        self.num_inputs = len(xs)
        self.output_devices = [d for d in self.devices for _ in xs]
        return tuple(copy_to(x, d) for d in self.devices for x in xs)

    def setup_context(self, inputs, outputs):
        self.source = inputs[0].device

    def backward(self, *grads):
        return _reduce_add_coalesced(self.source, grads, self.num_inputs, len(self.devices))


class ReduceAddCoalesced(Op):
    """Sum ``num_inputs`` tensors over devices onto ``device``. Inputs are device-major, as Broadcast
    produces: [dev0: t0..tn-1, dev1: t0..tn-1, ...]."""

    cross_device = True

    def __init__(self, device, num_inputs):
        self.target = backend.Device.parse(device)
        self.output_devices = self.target
        self.num_inputs = num_inputs

    def forward(self, *xs):
        if len(xs) % self.num_inputs:
            raise op_error("ReduceAddCoalesced", f"a multiple of num_inputs={self.num_inputs} tensors",
                           f"{len(xs)} tensors")
        self.num_devices = len(xs) // self.num_inputs
        return _reduce_add_coalesced(self.target, xs, self.num_inputs, self.num_devices)

    def setup_context(self, inputs, outputs):
        self.sources = [inputs[i * self.num_inputs].device for i in range(self.num_devices)]

    def backward(self, *grads):
        return tuple(copy_to(g, d) for d in self.sources for g in grads)


def _reduce_add_coalesced(target, arrays, num_inputs, num_devices):
    """Per device: flatten its tensors into one buffer, move it (one copy), and sum on ``target``."""
    xp = target.array_module()
    shapes = [a.shape for a in arrays[:num_inputs]]
    sizes = [a.size for a in arrays[:num_inputs]]
    total = None
    with target.context():
        for d in range(num_devices):
            group = arrays[d * num_inputs:(d + 1) * num_inputs]
            src_xp = backend.device_of_array(group[0]).array_module()
            flat = src_xp.concatenate([g.reshape(-1) for g in group]) if num_inputs > 1 else group[0].reshape(-1)
            flat = backend.to_device_array(flat, target)
            total = flat.copy() if total is None else xp.add(total, flat, out=total)
        bounds = [sum(sizes[:i]) for i in range(1, len(sizes))]
        return tuple(p.reshape(s) for p, s in zip(xp.split(total, bounds), shapes))


def scatter(x, devices, dim=0):
    """Split ``x`` along ``dim`` across ``devices``; returns a tuple of per-device tensors."""
    out = Scatter(devices, dim).apply(x)
    return out if isinstance(out, tuple) else (out,)


def gather(tensors, device, dim=0):
    """Concatenate per-device tensors along ``dim`` onto ``device``."""
    return Gather(device, dim).apply(*tensors)


def broadcast(tensors, devices):
    """Copies of ``tensors`` on every device, grouped per device: [[t0, t1, ...] on dev0, ...]."""
    n = len(tensors)
    out = Broadcast(devices).apply(*tensors)
    out = out if isinstance(out, tuple) else (out,)
    return [list(out[i * n:(i + 1) * n]) for i in range(len(out) // n)]


def reduce_add_coalesced(per_device_tensors, device):
    """Sum lists of tensors (one list per device, same shapes) onto ``device``."""
    n = len(per_device_tensors[0])
    flat = [t for group in per_device_tensors for t in group]
    out = ReduceAddCoalesced(device, n).apply(*flat)
    return list(out) if isinstance(out, tuple) else [out]


__all__ = []  # device-level helpers are used via infini_train.autograd.comm, not as infini_train.<name>
