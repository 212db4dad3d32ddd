"""Collectives of picklable Python objects (torch.distributed's ``all_gather_object``): each object is pickled into a
uint8 tensor, the lengths are gathered first, and the bytes are padded to the longest."""
from __future__ import annotations

import pickle

import numpy as np


def all_gather_object(object_list, obj, group):
    """Fill ``object_list`` (of the group's size) with every rank's ``obj``, in rank order, on every rank."""
    from ..tensor import Tensor

    if len(object_list) != group.size:
        raise ValueError(f"all_gather_object: expected an object_list of {group.size} entries (the group's size), "
                         f"got {len(object_list)}\nHINT: pass [None] * dist.get_world_size(group)")
    if group.size == 1:
        object_list[0] = obj
        return
    data = np.frombuffer(pickle.dumps(obj), np.uint8)
    sizes = [Tensor(np.zeros(1, np.int64)) for _ in range(group.size)]
    group.all_gather(sizes, Tensor(np.array([data.size], np.int64)))
    lengths = [int(s.numpy()[0]) for s in sizes]
    padded = np.zeros(max(lengths), np.uint8)
    padded[:data.size] = data
    parts = [Tensor(np.zeros(max(lengths), np.uint8)) for _ in range(group.size)]
    group.all_gather(parts, Tensor(padded))
    for r, (part, length) in enumerate(zip(parts, lengths)):
        object_list[r] = pickle.loads(part.numpy()[:length].tobytes())
