"""A rank's piece of a tensor sharded over a process group, with its placement as data (what a DTensor carries as
its placements and mesh): what ``model.state_dict()`` and ``optimizer.state_dict()`` give for fully_shard's
parameters, what it.distributed.checkpoint writes and fills in place.

fully_shard keeps ZeRO's layout: a unit's parameters, each flattened in row-major order, lie one after another
in a flat space cut into equal contiguous shards, one per rank. So the placement (``FlatShard``) is an offset into
that space and the shard size, not a dim: a rank's piece of a tensor is a flat range that may start and end
inside a row (DTensor's ``Shard(0)`` cuts whole rows instead). The checkpoint writes such a range as the few boxes
it covers (``LocalPieces.flat_range``), so any layout loads it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import backend
from ..tensor import Tensor


class ShardedError(RuntimeError):
    """A sharded tensor's values were needed while only this rank's piece of it is here."""


@dataclass(frozen=True)
class FlatShard:
    """The tensor, flattened, sits at element ``offset`` of a flat space of which rank r of the group holds elements
    [r * shard_size, (r + 1) * shard_size)."""

    offset: int
    shard_size: int

    def local_range(self, rank, numel):
        """The elements [start, stop) of the flattened tensor that rank ``rank`` holds (start == stop: none)."""
        start = min(max(rank * self.shard_size - self.offset, 0), numel)
        stop = max(min((rank + 1) * self.shard_size - self.offset, numel), start)
        return start, stop


def _numel(shape):
    return int(np.prod(shape, dtype=np.int64))


class ShardedTensor:
    """``ShardedTensor(local, shape, placement, group)``: this rank's elements (``local``, a 1-D Tensor) of a tensor
    of ``shape`` placed over ``group`` as ``placement`` says. ``shape``, ``dtype`` and ``numel()`` are the whole
    tensor's, as a DTensor's are; ``to_local()`` gives this rank's elements, ``full_tensor()`` the whole tensor
    (collective over the group)."""

    def __init__(self, local, shape, placement, group):
        self._local = local if isinstance(local, Tensor) else Tensor._make(local, backend.device_of_array(local))
        self.shape = tuple(int(n) for n in shape)
        self.placement = placement
        self.group = group
        start, stop = self.local_range
        if self._local.array.ndim != 1 or self._local.array.size != stop - start:
            raise ValueError(f"ShardedTensor: local must be the {stop - start} elements [{start}, {stop}) group rank "
                             f"{group.rank} holds of a tensor of shape {self.shape} placed as {placement}, got an "
                             f"array of shape {tuple(self._local.array.shape)}\nHINT: pass this rank's elements, "
                             "flattened")

    @property
    def placements(self):
        return (self.placement,)

    @property
    def dtype(self):
        return self._local.dtype

    @property
    def device(self):
        return self._local.device

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def rank(self):
        """This process's rank in ``group``."""
        return self.group.rank

    @property
    def local_range(self):
        """The elements [start, stop) of the flattened tensor this rank holds."""
        return self.placement.local_range(self.group.rank, _numel(self.shape))

    def numel(self):
        return _numel(self.shape)

    def size(self, dim=None):
        return self.shape if dim is None else self.shape[dim]

    def to_local(self):
        """This rank's elements, a 1-D Tensor (sharing memory with what the ShardedTensor was made from)."""
        return self._local

    def same_placement(self, other):
        return (isinstance(other, ShardedTensor) and other.shape == self.shape and other.placement == self.placement
                and list(other.group.ranks) == list(self.group.ranks))

    def full_tensor(self):
        """The whole tensor, on every rank of the group (collective: every rank calls it)."""
        n, size = self.numel(), self.group.size
        ranges = [self.placement.local_range(r, n) for r in range(size)]
        width = max(b - a for a, b in ranges)
        device = self.device
        xp = backend.get_xp(device)
        with device.context():
            whole = xp.zeros(n, self._local.array.dtype)
            if width:
                send = xp.zeros(width, whole.dtype)
                send[:self._local.array.size] = self._local.array
                received = xp.empty(width * size, whole.dtype)
                self.group.all_gather_into_tensor(received, send)
                for r, (a, b) in enumerate(ranges):
                    whole[a:b] = received[r * width:r * width + b - a]
        return Tensor._make(whole.reshape(self.shape), device)

    def local_pieces(self):
        """This rank's elements as boxes of the whole tensor (it.distributed.checkpoint's LocalPieces); the views
        share memory with ``to_local()``, so loading a checkpoint fills them in place."""
        from .checkpoint.pieces import LocalPieces

        start, _ = self.local_range
        return LocalPieces.flat_range(self.shape, start, self._local.array)

    def _refuse(self, what):
        start, stop = self.local_range
        return ShardedError(
            f"ShardedTensor.{what}: this rank holds only elements [{start}, {stop}) of a tensor of shape {self.shape} "
            f"sharded over group ranks {list(self.group.ranks)}\nHINT: full_tensor() gathers it (every rank calls "
            "it); get_model_state_dict(model, options=StateDictOptions(full_state_dict=True)) from "
            "it.distributed.checkpoint gathers a whole state dict; it.distributed.checkpoint.save(state, dir) writes "
            "the pieces as they are")

    def numpy(self):
        raise self._refuse("numpy()")

    def __array__(self, *args, **kwargs):
        raise self._refuse("__array__()")

    def __repr__(self):
        start, stop = self.local_range
        return (f"ShardedTensor(shape={self.shape}, dtype={self.dtype}, placement={self.placement}, group ranks="
                f"{list(self.group.ranks)}, rank {self.group.rank} holds [{start}, {stop}))")


class ShardView(Tensor):
    """The Tensor an optimizer steps for a sharded parameter: this rank's elements of it, 1-D, knowing the whole
    parameter's shape and flat placement (``flat_piece``, a FlatShard), so that the optimizer's state dict places its
    state arrays as the parameter is placed (``placed``). Its own ``placement`` (infini_train.placement) is
    REPLICATED: the view itself is this rank's, whole."""

    __slots__ = ("whole_shape", "flat_piece", "group")

    @classmethod
    def of(cls, array, device, whole_shape, flat_piece, group):
        view = cls._make(array, device)
        view.whole_shape, view.flat_piece, view.group = tuple(whole_shape), flat_piece, group
        return view

    def placed(self, local):
        """``local`` (state of this view's shape) as a ShardedTensor placed as the parameter is."""
        return ShardedTensor(local, self.whole_shape, self.flat_piece, self.group)

    def local_of(self, value, what):
        """This rank's elements of ``value`` (a ShardedTensor placed as this view, or the whole tensor) as an array;
        ``what`` names the value in errors."""
        if isinstance(value, ShardedTensor):
            if not value.same_placement(self.placed(self.array)):
                raise ValueError(f"{what}: expected a piece placed as this rank's ({self.flat_piece}, group ranks "
                                 f"{list(self.group.ranks)}, shape {self.whole_shape}), got {value!r}\nHINT: a sharded "
                                 "state loads only into the layout that made it; reshard it through "
                                 "it.distributed.checkpoint.save / load, or load a full state dict")
            return value.to_local().array
        array = value.array if isinstance(value, Tensor) else value
        if tuple(array.shape) != self.whole_shape:
            raise ValueError(f"{what}: expected the whole tensor of shape {self.whole_shape} (or this rank's piece as "
                             f"a ShardedTensor), got shape {tuple(array.shape)}\nHINT: was it saved from a model "
                             "with the same configuration?")
        start, stop = self.flat_piece.local_range(self.group.rank, _numel(self.whole_shape))
        return array.reshape(-1)[start:stop]


__all__ = ["ShardedTensor", "FlatShard", "ShardView", "ShardedError"]
