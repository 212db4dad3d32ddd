"""Whole state of a tensor-parallel model and its optimizer: checkpoints hold the whole tensors, in the same
files and under the same names as a one-process run, so they load at any tensor-parallel size.

A parameter split over the tensor group carries ``tp_spec`` (a ShardSpec); unsharding all-gathers it over the
group and puts the shards back in order (vocabulary padding dropped); sharding slices the whole tensor. Optimizer
state follows its parameter: every array entry shaped like the parameter (AdamW's moments) uses the parameter's
spec, scalars (``step``) are kept. Every rank of ``group`` calls the gathers (they are collectives).
"""
from __future__ import annotations

from ...tensor import Tensor
from .tensor_parallel import whole_from_shards, shard_from_whole


def _spec(t):
    return getattr(t, "tp_spec", None)


def _as_array(value):
    return value.array if isinstance(value, Tensor) else value


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


def params_by_index(state_dict, optimizer):
    """{state index: parameter of ``optimizer``}: the saved param groups' indices paired, group by group and in
    order, with the optimizer's parameters (as ``load_state_dict`` pairs them)."""
    groups = optimizer.whole_param_groups
    saved = state_dict["param_groups"]
    sizes = ([len(g["params"]) for g in saved], [len(g["params"]) for g in groups])
    if sizes[0] != sizes[1]:
        raise ValueError(f"optimizer state: the saved param groups hold {sizes[0]} parameters, this optimizer's hold "
                         f"{sizes[1]}\nHINT: the checkpoint was written for another model; resume with its own config")
    return {int(i): p for s, g in zip(saved, groups) for i, p in zip(s["params"], g["params"])}


def whole_optimizer_state(state_dict, optimizer, group, to=None):
    """``state_dict`` (torch's layout, of ``optimizer`` over a sharded model) with the state of every sharded
    parameter gathered whole. Every rank of ``group`` calls it, with the same layout; with ``to`` only that group
    rank keeps the result (the others get None)."""
    if group.size == 1:
        return state_dict
    keep = to is None or group.rank == to

    def gather(value, p, spec, where):
        whole = whole_from_shards(_as_array(value), spec, group)
        return Tensor._make(whole, p.device) if keep else None

    state = _map_state(state_dict, optimizer, gather)
    return state if keep else None


def shard_optimizer_state(state_dict, optimizer, group):
    """This rank's part of a whole optimizer state dict, for ``optimizer`` over the sharded model."""
    if group.size == 1:
        return state_dict
    return _map_state(state_dict, optimizer,
                      lambda value, p, spec, where: _shard_value(value, p, spec, group, where))


def _map_state(state_dict, optimizer, convert):
    params = params_by_index(state_dict, optimizer)
    state = {}
    for index, entry in state_dict["state"].items():
        p = params.get(int(index))
        if p is None:
            raise ValueError(f"optimizer state: entry {index} names no parameter of the param groups\nHINT: the "
                             "checkpoint was written for another model; resume with its own config")
        spec = _spec(p)
        state[index] = {key: (convert(value, p, spec, f"optimizer state {key!r} of parameter {index}")
                              if spec is not None and getattr(_as_array(value), "ndim", 0) else value)
                        for key, value in entry.items()}
    return {**state_dict, "state": state}


def _shard_value(value, param, spec, group, where):
    array = _as_array(value)
    if hasattr(array, "get") and param.device.type == "cpu":
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


__all__ = ["whole_state_dict", "shard_state_dict", "load_whole_state_dict", "params_by_index",
           "whole_optimizer_state", "shard_optimizer_state"]
