"""``train.log_communication``: each step's record in metrics.jsonl gets ``comm_bytes``, what this rank's collectives
and sends handed over during the step (the run's own counters, distributed/comm_counters.py), keyed
``"<collective>@<group>"`` with the group named by its role in the layout (data, shard, replicate, tensor, context,
pipeline, embedding, world; other groups by their world ranks)."""
from __future__ import annotations

import contextlib

from ..distributed import count_communication


def counting(enabled):
    """The counters of one step (a CommCounters), or a null context yielding None."""
    return count_communication() if enabled else contextlib.nullcontext()


def comm_record(counts, dims):
    """{"<collective>@<group>": bytes} of one step's ``counts``."""
    names = dims.group_names()
    out = {}
    for collective, ranks, _, nbytes in counts.rows():
        key = f"{collective}@{names.get(ranks, 'ranks ' + ','.join(map(str, ranks)))}"
        out[key] = out.get(key, 0) + nbytes
    return out


__all__ = ["counting", "comm_record"]
