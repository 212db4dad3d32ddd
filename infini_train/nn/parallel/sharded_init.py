"""Sharded initialisation: every rank fills only its part of each parameter with exactly the values the model built
whole, in one process, would hold there, so no rank ever materialises the whole model.

A model built under ``recording_inits()`` on the meta device records, in order, every init its constructor asked
for (``normal_``, ``uniform_``, a constant fill) without drawing anything. ``replay_inits`` then runs the same calls
against the same seeded generator, drawing each parameter's values in chunks of ``CHUNK`` elements (numpy's
generator gives the same sequence whether drawn at once or in chunks) and keeping, of each chunk, only the elements
of the boxes this rank holds (tensor-parallel shards by their ShardSpec; the zero padding of a split vocabulary is
left zero). Memory is this rank's part plus one chunk; every rank draws the whole model's values, which keeps the
stream aligned with one process's, bitwise.
"""
from __future__ import annotations

import numpy as np

from ... import backend
from ...backend import record_init, recording_inits  # noqa: F401  (part of this module's interface)
from .sharded_pieces import param_pieces

CHUNK = 1 << 20


class InitError(ValueError):
    """A model built on the meta device whose init cannot be replayed."""


def derived_from(param, source):
    """``param`` (a shard or copy of the meta parameter ``source``) takes ``source``'s values."""
    param.init_source = _source_of(source)


def _source_of(param):
    source = getattr(param, "init_source", None)  # (buffers are plain Tensors)
    return param if source is None else source


def replay_inits(calls, model, rank=0, size=1):
    """Fill ``model``'s parameters and nn.init-initialised buffers (given storage by ``to_empty``) by replaying
    ``calls`` (``recording_inits``) against the host generator, seeded as the whole model's build was. ``rank`` /
    ``size``: this rank's place in the tensor-parallel group its shards were split over."""
    holders = {}  # id of a recorded meta tensor -> [(parameter here, its pieces of the whole tensor)]
    recorded = {id(t) for t, _, _ in calls}
    # the parameters, and the buffers whose constructor initialised them with nn.init (a router's correction bias)
    initialised = list(model.parameters()) + [b for b in model.buffers() if id(_source_of(b)) in recorded]
    for p in initialised:
        source = _source_of(p)
        if p.placement.flat_shard is None:  # (fully_shard's shards start zero-filled)
            p.array[...] = 0
        pieces = param_pieces(p, rank, size)
        holders.setdefault(id(source), []).append((p, pieces))
    for p in model.parameters():
        if id(_source_of(p)) not in recorded:
            raise InitError(f"sharded init: a parameter of shape {tuple(p.shape)} was never initialised while built "
                            "on the meta device\nHINT: initialise every parameter with nn.init functions or "
                            "Tensor.normal_ / uniform_ / fill_ in the constructor")
    generator = backend.host_generator()
    for tensor, kind, args in calls:
        mine = holders.get(id(tensor), ())
        shape = tuple(tensor.shape)
        total = int(np.prod(shape, dtype=np.int64))
        if kind == "copied":
            raise InitError(f"sharded init: a parameter of shape {shape} was filled from another tensor while built "
                            "on the meta device\nHINT: build the model eagerly")
        for start in range(0, total, CHUNK) if total else ():
            count = min(CHUNK, total - start)
            if kind == "normal":
                values = generator.standard_normal(count) * args[1] + args[0]
            elif kind == "uniform":
                values = generator.uniform(args[0], args[1], count)
            else:
                values = None
            if values is not None:  # rounded to the dtype it was built in, as the eager build stores it
                values = values.astype(tensor.dtype)
            for param, pieces in mine:
                _write(pieces, shape, start, count, values, args[0] if kind == "constant" else None,
                       param.device.array_module())
    for p in model.parameters():
        p._version[0] += 1
    return model


def _write(pieces, shape, start, count, values, constant, xp):
    """Write the elements [start, start + count) of the flattened whole tensor that ``pieces`` hold: ``values``
    (drawn for those positions, in the dtype the tensor was built in), or ``constant``."""
    stop = start + count
    for offsets, view in pieces.pieces:
        for lead, run_start, run_length in _runs(offsets, view, shape):
            a, b = max(start, run_start), min(stop, run_start + run_length)
            if a >= b:
                continue
            flat = view.reshape(-1) if lead is None else view[lead]  # a view: contiguous, or one row
            flat[a - run_start:b - run_start] = (constant if values is None
                                                 else xp.asarray(values[a - start:b - start], view.dtype))


def _runs(offsets, view, shape):
    """The runs of consecutive flat positions the box held by ``view`` covers: (index of the run's row in the box,
    or None for the whole box, first flat position, length)."""
    sizes = view.shape
    if not shape:
        return [(None, 0, 1)]
    if tuple(sizes[1:]) == tuple(shape[1:]) and view.flags.c_contiguous:  # whole rows: one run
        return [(None, int(np.ravel_multi_index(offsets, shape)), int(np.prod(sizes, dtype=np.int64)))]
    runs = []
    for lead in np.ndindex(*sizes[:-1]):
        where = tuple(o + i for o, i in zip(offsets, lead)) + (offsets[-1],)
        runs.append((lead, int(np.ravel_multi_index(where, shape)), sizes[-1]))
    return runs


__all__ = ["recording_inits", "record_init", "replay_inits", "derived_from", "InitError", "CHUNK"]
