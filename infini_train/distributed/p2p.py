"""Batched point-to-point, torch's ``P2POp`` / ``batch_isend_irecv``: the sends and receives a rank exchanges with
its neighbours at one moment (a pipeline stage passing activations forward and gradients back) start together, so
no ordering of blocking transfers between two ranks can deadlock. Peers are ranks inside ``group`` (as in
``send`` / ``recv``); the group's timeout applies when the Works are waited on."""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from .. import backend
from ..tensor import array_of


@dataclass
class P2POp:
    """One transfer: ``op`` is ``dist.isend`` or ``dist.irecv`` (or "send" / "recv"), ``peer`` a group rank."""

    op: object
    tensor: object
    peer: int
    group: object = None
    tag: int = 0

    @property
    def kind(self):
        name = self.op if isinstance(self.op, str) else getattr(self.op, "__name__", "")
        kind = {"isend": "send", "send": "send", "irecv": "recv", "recv": "recv"}.get(name)
        if kind is None:
            raise ValueError(f"P2POp: expected op dist.isend or dist.irecv, got {self.op!r}")
        return kind


def batch_isend_irecv(p2p_op_list):
    """Start every op of the list (all on one group) together; returns their Works in order."""
    from . import default_group

    if not p2p_op_list:
        return []
    groups = {id(op.group or default_group()) for op in p2p_op_list}
    if len(groups) != 1:
        raise ValueError("batch_isend_irecv: expected every P2POp on the same group, got ops on "
                         f"{len(groups)} groups\nHINT: batch the ops of each group separately")
    group = p2p_op_list[0].group or default_group()
    return group.batch_isend_irecv([(op.kind, op.tensor, op.peer, op.tag) for op in p2p_op_list])


def send_arrays(named, dst, group, tag=0):
    """Send a dict {name: array or Tensor, or a JSON value} to group rank ``dst`` (which calls ``recv_arrays``):
    a header with the names, shapes and dtypes, then each array. Checkpoints gather pipeline stages' state so."""
    header, arrays = [], []
    for name, value in named.items():
        array = array_of(value)
        if backend.is_array_like(array):
            header.append([name, list(array.shape), array.dtype.name])
            arrays.append(array)
        else:
            header.append([name, None, value])
    text = np.frombuffer(json.dumps(header).encode(), np.uint8).copy()
    group.send(np.array([text.size], np.int64), dst, tag)
    group.send(text, dst, tag)
    for array in arrays:
        group.send(array, dst, tag)


def recv_arrays(src, group, device, tag=0):
    """The dict ``send_arrays`` sent from group rank ``src``, its arrays on ``device``."""
    from .. import backend

    size = np.zeros(1, np.int64)
    group.recv(size, src, tag)
    text = np.zeros(int(size[0]), np.uint8)
    group.recv(text, src, tag)
    out = {}
    xp = device.array_module()
    for name, shape, dtype in json.loads(text.tobytes().decode()):
        if shape is None:
            out[name] = dtype  # a JSON value
            continue
        with device.context():
            array = xp.empty(tuple(shape), backend.as_dtype(dtype))
        group.recv(array, src, tag)
        out[name] = array
    return out


__all__ = ["P2POp", "batch_isend_irecv", "send_arrays", "recv_arrays"]
