"""A run's entries gathered whole onto one rank: the consolidation that makes the whole format. Every rank names the
boxes it holds (as a sharded save does); each box is sent by the lowest rank holding it, so a replicated tensor
comes from rank 0's copy and a tied or overlapping one from the lowest rank's, and the receiving rank assembles
every entry whole in host memory. The other ranks hold nothing more than their own pieces."""
from __future__ import annotations

import numpy as np

from .. import backend
from .. import distributed as dist
from ..distributed.p2p import recv_arrays, send_arrays
from ..safetensors_io import dtype_code
from .entries import entry_dtype


def gather_whole(entries, group, device, to=0, into=None):
    """{entry: whole numpy array} on group rank ``to``, None on the others (collective over ``group``).
    ``entries``: this rank's {entry: LocalPieces}; ``device``: where the ranks' arrays live (transfers land
    there); ``into``: arrays of an earlier gather to fill again where an entry's shape and dtype match."""
    plan = {name: (pieces.global_shape, dtype_code(np.dtype(pieces.dtype)), pieces.boxes())
            for name, pieces in entries.items()}
    plans = [None] * group.size
    dist.all_gather_object(plans, plan, group)
    sender = {}  # (entry, offsets, sizes) -> the lowest rank holding that box
    for rank, held in enumerate(plans):
        for name, (_, _, boxes) in held.items():
            for offsets, sizes in boxes:
                sender.setdefault((name, tuple(offsets), tuple(sizes)), rank)
    sent = [[(name, tuple(offsets)) for name, (_, _, boxes) in held.items() for offsets, sizes in boxes
             if sender[(name, tuple(offsets), tuple(sizes))] == rank] for rank, held in enumerate(plans)]
    views = {(name, tuple(offsets)): view for name, pieces in entries.items() for offsets, view in pieces.pieces}
    if group.rank != to:
        if sent[group.rank]:
            send_arrays({str(k): _sendable(views[key], device) for k, key in enumerate(sent[group.rank])}, to, group)
        return None
    whole = {}
    for held in plans:  # every entry, in the order the ranks hold them
        for name, (shape, code, _) in held.items():
            if name not in whole:
                dtype, reuse = entry_dtype(code), (into or {}).get(name)
                if reuse is not None and reuse.shape == tuple(shape) and reuse.dtype == dtype:
                    reuse[...] = 0
                    whole[name] = reuse
                else:
                    whole[name] = np.zeros(shape, dtype)
    for rank in reversed(range(group.size)):  # the lowest rank's values where boxes of several ranks overlap
        if not sent[rank]:
            continue
        if rank == to:
            parts = [views[key] for key in sent[rank]]
        else:
            received = recv_arrays(rank, group, device)
            parts = [received[str(k)] for k in range(len(sent[rank]))]
        for (name, offsets), part in zip(sent[rank], parts):
            target = whole[name]
            part = backend.to_device_array(part, backend.CPU) if backend.is_array_like(part) else np.asarray(part)
            target[tuple(slice(o, o + n) for o, n in zip(offsets, part.shape))] = part
    return whole


def _sendable(view, device):
    """A box as a transfer carries it: a 0-d array (a step) as its value, an array contiguous on ``device``."""
    if view.ndim == 0:
        return backend.to_device_array(view, backend.CPU).item()
    array = backend.to_device_array(view, device)
    xp = device.array_module()
    with device.context():
        return xp.ascontiguousarray(array)


__all__ = ["gather_whole"]
