"""Communication counters: what each collective and point-to-point send of this rank moved, by collective and by
group, while ``count_communication()`` is open (the run's own figures for benchmarks: bytes per step and per rank).

    with dist.count_communication() as counts:
        train_step(...)
    counts.by_collective()   # {"all_reduce": bytes, "all_gather_into_tensor": bytes, ...}
    counts.by_group()        # {(0, 2): bytes, (0, 1, 2, 3): bytes, ...}  (world ranks of the group)
    counts.rows()            # [(collective, group ranks, calls, bytes)], largest first

The bytes of a call are those this rank hands to it: an all-reduce's or broadcast's tensor, an all-gather's input
(this rank's part), a reduce-scatter's whole input, an all-to-all's input, a send's tensor (a receive counts nothing:
its sender counted it). With no counter open a collective pays one list test.
"""
from __future__ import annotations

import contextlib

ACTIVE = []  # the open counters


class CommCounters:
    """Calls and bytes by (collective, group ranks)."""

    def __init__(self):
        self.table = {}

    def add(self, collective, ranks, nbytes):
        entry = self.table.setdefault((collective, tuple(ranks)), [0, 0])
        entry[0] += 1
        entry[1] += int(nbytes)

    def rows(self):
        return sorted(((name, ranks, calls, nbytes) for (name, ranks), (calls, nbytes) in self.table.items()),
                      key=lambda row: -row[3])

    def by_collective(self):
        out = {}
        for name, _, _, nbytes in self.rows():
            out[name] = out.get(name, 0) + nbytes
        return out

    def by_group(self):
        out = {}
        for _, ranks, _, nbytes in self.rows():
            out[ranks] = out.get(ranks, 0) + nbytes
        return out

    @property
    def total_bytes(self):
        return sum(nbytes for _, _, _, nbytes in self.rows())


@contextlib.contextmanager
def count_communication():
    """Count what this rank's collectives and sends move inside the block; yields the CommCounters."""
    counters = CommCounters()
    ACTIVE.append(counters)
    try:
        yield counters
    finally:
        ACTIVE.remove(counters)


def record(collective, ranks, sent):
    """Add one call of ``collective`` over the group of world ranks ``ranks`` handing over ``sent`` (arrays, tensors
    or lists of them) to every open counter."""
    add(collective, ranks, nbytes(sent))


def add(collective, ranks, count):
    """Add one call of ``collective`` over the group of world ranks ``ranks`` handing over ``count`` bytes."""
    for counters in ACTIVE:
        counters.add(collective, ranks, count)


def nbytes(sent):
    """The bytes of ``sent``: an array, a tensor, or a list of them (None: 0)."""
    if sent is None:
        return 0
    if isinstance(sent, (list, tuple)):
        return sum(nbytes(s) for s in sent)
    array = getattr(sent, "array", sent)
    return int(getattr(array, "nbytes", 0))


__all__ = ["CommCounters", "count_communication", "ACTIVE"]
