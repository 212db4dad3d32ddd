"""Whole state dicts of a tensor-parallel model: the whole tensors under the same names as the one-process
model's, and back (a run's checkpoints are infini_train.run_state's).

A parameter split over the tensor group is placed by a ShardSpec (its placement's ``tensor_shard``); unsharding
all-gathers it over the group and puts the shards back in order (vocabulary padding dropped); sharding slices the
whole tensor. Every rank of ``group`` calls the gathers (they are collectives).
"""
from __future__ import annotations

from ... import backend
from ...tensor import Tensor, array_of
from .tensor_parallel import whole_from_shards, shard_from_whole


def _spec(t):
    return t.placement.tensor_shard


def whole_state_dict(model, group, to=None):
    """``model.state_dict()`` with every sharded parameter replaced by the whole tensor (a new Tensor); tied
    parameters are gathered once. In a group of one it is the plain state dict. With ``to`` (a group rank) only
    that rank keeps the result and the others get None: each whole tensor lives on them only while it is
    gathered, so a checkpoint costs the other ranks no more than the largest tensor."""
    own = model.state_dict(keep_vars=True)
    if group.size == 1:
        return type(own)((name, t.detach()) for name, t in own.items())
    keep = to is None or group.rank == to
    gathered = {}
    out = type(own)()
    for name, t in own.items():
        spec = _spec(t)
        if spec is None:
            out[name] = t.detach()
            continue
        if id(t) not in gathered:
            whole = whole_from_shards(t.array, spec, group)
            gathered[id(t)] = Tensor._make(whole, t.device) if keep else None
        out[name] = gathered[id(t)]
    return out if keep else None


def shard_state_dict(model, whole_state, group):
    """This rank's part of ``whole_state`` (a whole state dict, e.g. a checkpoint's) for the sharded
    ``model``: entries of sharded parameters are sliced by their spec, the rest are passed through."""
    own = model.state_dict(keep_vars=True)
    out = dict(whole_state)
    for name, t in own.items():
        spec = _spec(t)
        if spec is None or name not in whole_state or group.size == 1:
            continue
        out[name] = _shard_value(whole_state[name], t, spec, group, f"model state {name!r}")
    return out


def load_whole_state_dict(model, whole_state, group, strict=True):
    """Load a whole state dict into the sharded ``model`` (each rank keeps its shards)."""
    return model.load_state_dict(shard_state_dict(model, whole_state, group), strict=strict)


def _shard_value(value, param, spec, group, where):
    array = array_of(value)
    if backend.is_cupy_array(array) and param.device.type == "cpu":
        array = array.get()
    xp = param.device.array_module()
    with param.device.context():
        array = xp.asarray(array)
        shard = shard_from_whole(array, spec, group.rank, group.size, xp)
    if tuple(shard.shape) != tuple(param.shape):
        raise ValueError(f"{where}: the whole tensor of shape {tuple(array.shape)} gives a shard of shape "
                         f"{tuple(shard.shape)}, the parameter's is {tuple(param.shape)}\nHINT: the checkpoint "
                         "was written for another model shape; resume with its own config")
    return Tensor._make(shard, param.device)


__all__ = ["whole_state_dict", "shard_state_dict", "load_whole_state_dict"]
