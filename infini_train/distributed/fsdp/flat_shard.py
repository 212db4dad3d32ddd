"""ZeRO-3's storage of a group of parameters: one flat space (ZeroRedundancyOptimizer's layout) of which a rank
keeps only its shard, every parameter's values gathered just while a module needs them.

Between uses a parameter holds a ``Placeholder`` (its shape and dtype, no values; touching it says why), so a rank
holds 1/N of the parameters, their gradients and optimizer state. ``unshard`` all-gathers the shards (in
``param_dtype``, as FSDP2's MixedPrecisionPolicy) into one flat buffer and points every parameter at its region;
``reshard`` drops the buffer. ``reduce_grads`` copies the whole gradients into one flat buffer (in
``reduce_dtype``), drops them, and reduce-scatters it; the shard of the sum, divided by ``divide_by`` (the ranks
summed over, HSDP's replicas included: their average), is added to ``grad_shard`` when the reduction completes, so
gradient accumulation sums into the shard as in one process. A space sharded over fewer ranks than the module's
data-parallel group (an expert-parallel layer's experts, over the ranks holding the same experts) divides by the
data-parallel size instead: each replica's gradient already sums the tokens of the ranks it serves.

Outside the module, ``local_shard`` gives a parameter's shard with its placement (a ShardedTensor: what
``model.state_dict()`` holds) and ``load_param`` writes one, or the whole tensor, back into the shard.
"""
from __future__ import annotations

import numpy as np

from ... import backend
from ...placement import place
from ...tensor import Tensor
from ..optim.zero_redundancy_optimizer import FlatSpace
from ..sharded_tensor import FlatShard, ShardedError, ShardedTensor, ShardView

GATHERED = {}  # id(flat buffer) -> the ShardedFlatSpace it belongs to, while gathered (saved tensors point here)


class Placeholder:
    """The array of a parameter whose values live sharded across ranks: shape and dtype only."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self):
        return 0

    def _error(self, what="read the values of"):
        return ShardedError(
            f"fully_shard: cannot {what} a parameter of shape {self.shape} that is sharded across the data-parallel "
            "ranks: this rank holds only its shard, and the whole parameter exists only while its module runs"
            "\nHINT: model.state_dict() gives each rank's shard with its placement; get_model_state_dict(model, "
            "options=StateDictOptions(full_state_dict=True)) from it.distributed.checkpoint gathers whole tensors; "
            "`with model.unsharded():` gathers the parameters in place")

    def __array__(self, *args, **kwargs):
        raise self._error()

    def __getitem__(self, key):
        raise self._error()

    def __setitem__(self, key, value):
        raise self._error("write into")

    def __getattr__(self, name):  # (what np.asarray and cupy's .get look up to read an array's values)
        reads = name in ("get", "__array_interface__", "__array_struct__")
        raise self._error("read the values of" if reads else f"use the array attribute .{name} of")

    def __len__(self):
        return self.shape[0] if self.shape else 0

    def __repr__(self):
        return f"Placeholder(shape={self.shape}, dtype={self.dtype})"


class ShardedFlatSpace(FlatSpace):
    """``ShardedFlatSpace(params, group, param_dtype=None, reduce_dtype=None, replicate_group=None, divide_by=None)``:
    ``params`` (of one device, dtype and requires_grad) keep only this rank's shard of their flat space over ``group``.
    With a ``replicate_group`` (HSDP) the same shards live on every rank of it: their reduced gradients are all-reduced
    over it too. The reduced gradients are the sum divided by ``divide_by`` (default: the ranks it sums over)."""

    resident = False

    def __init__(self, params, group, param_dtype=None, reduce_dtype=None, replicate_group=None, divide_by=None):
        self.lay_out(params, group.rank, group.size)
        self.group = group
        self.replicate_group = replicate_group if replicate_group is not None and replicate_group.size > 1 else None
        replicas = self.replicate_group.size if self.replicate_group is not None else 1
        self.divide_by = divide_by or group.size * replicas
        self.param_dtype = np.dtype(param_dtype or self.dtype)
        self.reduce_dtype = np.dtype(reduce_dtype or self.param_dtype)
        self.flat = self.flat_grad = None
        self._gathering = None  # (work, buffer, what was sent) of an all-gather in flight
        self.pending = []  # (work, reduced shard) of reduce-scatters in flight
        self.shard = self._allocate(self.shard_size, self.dtype)
        if self.device is not backend.META:
            for p, flat_start, a, b in self.owned_pieces():
                self.shard[flat_start - self.lo:flat_start - self.lo + (b - a)] = p.array.reshape(-1)[a:b]
        self._make_views()
        for p in params:
            p.array = Placeholder(p.shape, self.param_dtype)
            place(p, flat_shard=self)
            p.grad = None

    def _allocate(self, n, dtype, zero=True):
        xp = backend.get_xp(self.device)
        with self.device.context():
            return xp.zeros(n, dtype) if zero else xp.empty(n, dtype)

    def _make_views(self):
        """``shard_views``: each parameter's piece of the shard as a 1-D tensor (empty where this rank holds none
        of it), what an optimizer steps."""
        self.shard_views = {}
        for k, p in enumerate(self.params):
            a, b = self.held(k)
            view = ShardView.of(self.shard[a - self.lo:b - self.lo] if a < b else self.shard[:0], self.device,
                                p.shape, self.placement(k), self.group)
            view._requires_grad = p.requires_grad
            self.shard_views[id(p)] = view

    def placement(self, k):
        return FlatShard(self.offsets[k], self.shard_size)

    def local_shard(self, p):
        """This rank's shard of ``p`` with its placement (sharing memory with the shard): a state-dict entry."""
        return ShardedTensor(self.shard_views[id(p)].detach(), p.shape, self.placement(self.position[id(p)]),
                             self.group)

    def load_param(self, p, value):
        """Write ``value`` into this rank's shard of ``p``: a ShardedTensor placed as ``p`` (its local elements) or
        the whole tensor (this rank's elements of it); while gathered, into the gathered copy as well (so that
        ``unsharded()``'s write-back writes the same)."""
        view = self.shard_views[id(p)]
        local = view.local_of(value, "load_state_dict")
        view.array[...] = backend.to_device_array(local, self.device)
        if self.flat is not None:
            if isinstance(value, ShardedTensor):
                start, stop = view.flat_piece.local_range(self.rank, p.numel())
                p.array.reshape(-1)[start:stop] = view.array
            else:
                p.array[...] = backend.to_device_array(value.array if isinstance(value, Tensor) else value,
                                                       self.device)

    @property
    def whole_gathered(self):
        """Gathered in the shards' own dtype (``unsharded()``): the parameters hold their exact whole values."""
        return self.flat is not None and self.flat.dtype == self.dtype

    def to_empty(self, device):
        """Give the shard storage on ``device`` (a space built from meta parameters has none): zeros."""
        if self.device is device and self.device is not backend.META:
            return
        self.device = device
        self.shard = self._allocate(self.shard_size, self.dtype)
        self.grad_shard = None
        self._make_views()

    def local_piece(self, p):
        """(first element of ``p`` this rank holds, those elements as a 1-D array), or None if it holds none."""
        k = self.position[id(p)]
        a, b = self.held(k)
        return (a - self.offsets[k], self.shard[a - self.lo:b - self.lo]) if a < b else None

    # ------------------------------------------------------------------------------------------ gathering
    @property
    def gathered(self):
        return self.flat is not None

    def unshard(self, async_op=False, full_precision=False):
        """All-gather the parameters (``async_op``: only start it; the next ``unshard`` completes it) in
        ``param_dtype``, or in the shards' own dtype with ``full_precision``."""
        dtype = self.dtype if full_precision else self.param_dtype
        if self.flat is not None and self.flat.dtype != dtype:
            self.reshard()
        if self.flat is not None:
            return
        if self._gathering is None:
            send = self.shard if dtype == self.dtype else self.shard.astype(dtype)
            buffer = self._allocate(self.shard_size * self.world, dtype, zero=False)  # (all overwritten)
            work = self.group.all_gather_into_tensor(buffer, send, async_op=True)
            self._gathering = (work, buffer, send)
        if async_op:
            return
        work, buffer, _ = self._gathering
        self._gathering = None
        work.wait()
        self.flat = buffer
        GATHERED[id(buffer)] = self
        for p, offset in zip(self.params, self.offsets):
            p.array = buffer[offset:offset + p.numel()].reshape(p.shape)

    def reshard(self):
        """Drop the gathered parameters (each goes back to its placeholder)."""
        if self._gathering is not None:
            self._gathering[0].wait()
            self._gathering = None
        if self.flat is None:
            return
        GATHERED.pop(id(self.flat), None)
        self.flat = None
        for p in self.params:
            p.array = Placeholder(p.shape, self.param_dtype)

    def saved_view(self, array):
        """What a saved tensor viewing the gathered buffer keeps: its place in the buffer, so the buffer can be
        freed and gathered again before backward reads it."""
        offset = (backend.data_pointer(array) - backend.data_pointer(self.flat)) // array.itemsize
        return (self, offset, tuple(array.shape), tuple(array.strides))

    def require_gathered(self):
        if self.flat is None:
            raise ShardedError("fully_shard: backward needs the parameters of a module that was resharded and not "
                               "gathered again\nHINT: run backward through the module's outputs (its pre-backward "
                               "gathers them), or use reshard_after_forward=False")

    def view_at(self, offset, shape, strides):
        self.require_gathered()
        xp = backend.get_xp(self.device)
        return xp.lib.stride_tricks.as_strided(self.flat[offset:], shape, strides)

    # ------------------------------------------------------------------------------------------ gradients
    def reduce_grads(self):
        """Start reduce-scattering the parameters' whole gradients (missing ones count as zero) and drop them."""
        flat_grad = self._allocate(self.shard_size * self.world, self.reduce_dtype, zero=False)
        flat_grad[self.numel:] = 0  # the padding of the last shard
        for p, offset in zip(self.params, self.offsets):
            region = flat_grad[offset:offset + p.numel()]
            if p.grad is not None:
                region[...] = p.grad.array.reshape(-1)
                p.grad = None
            else:
                region[...] = 0
        out = self._allocate(self.shard_size, self.reduce_dtype, zero=False)
        self.pending.append((self.group.reduce_scatter_tensor(out, flat_grad, async_op=True), out))

    def fold_reduced(self):
        """Wait for the reductions in flight and add their shards, divided by ``divide_by``, to ``grad_shard``."""
        while self.pending:
            work, out = self.pending.pop(0)
            work.wait()
            if self.replicate_group is not None:  # HSDP: the shard's sum over the replicas too
                self.replicate_group.all_reduce(out)
            views = [v for v in self.shard_views.values() if v.array.size]
            grad = self.sharded_grad()
            if any(v.grad is None for v in views):  # zeroed with set_to_none by an optimizer
                grad[...] = 0
            out /= self.divide_by
            grad += out if out.dtype == grad.dtype else out.astype(grad.dtype)
            for k, p in enumerate(self.params):  # (an empty piece gets an empty gradient: an optimizer then counts
                view = self.shard_views[id(p)]      # its steps on every rank alike, as FSDP2's empty shards do)
                if view.grad is None:
                    a, b = self.held(k)
                    view.grad = Tensor._make(grad[a - self.lo:b - self.lo] if a < b else grad[:0], self.device)
