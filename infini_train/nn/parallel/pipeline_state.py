"""The whole model's state from the stages of a pipeline (and the tensor-parallel shards within each), and back:
checkpoints of a pipeline run are the files of a one-process run.

Each stage names its entries as the whole model does. Saving: a stage's tensor group first gathers its shards on
tensor rank 0 (whole_state.py), then those ranks send their entries to stage 0 over the pipeline group, which puts
them in the whole model's order. Optimizer state travels by parameter name and is laid out as the whole model's
optimizer numbers its parameters (``whole_groups``: the names of each param group, in order). Loading: every rank
reads the whole file and keeps its entries.
"""
from __future__ import annotations

from ...distributed.p2p import recv_arrays, send_arrays
from ...tensor import Tensor
from .whole_state import (params_by_index, shard_optimizer_state, whole_optimizer_state,
                            whole_state_dict)

_SEP = "\x00"  # between a parameter's name and its state key in a transfer


def _gather(named, pipeline_group, device):
    """Every stage's dict merged on stage 0 (None on the others)."""
    if pipeline_group.rank != 0:
        send_arrays(named, 0, pipeline_group)
        return None
    merged = dict(named)
    for stage in range(1, pipeline_group.size):
        merged.update(recv_arrays(stage, pipeline_group, device))
    return merged


def _as_tensor(value, device):
    return value if isinstance(value, Tensor) or not hasattr(value, "shape") else Tensor._make(value, device)


def gather_model_state(model, whole_names, pipeline_group, tensor_group=None):
    """The whole model's state dict (in ``whole_names`` order) on stage 0 / tensor rank 0; None on other ranks.
    Collective over ``tensor_group`` and then over ``pipeline_group`` (of the tensor rank 0 ranks)."""
    local = whole_state_dict(model, tensor_group, to=0) if tensor_group is not None else model.state_dict()
    if local is None:
        return None
    device = next(iter(model.parameters())).device
    merged = _gather(local, pipeline_group, device)
    if merged is None:
        return None
    missing = [n for n in whole_names if n not in merged]
    if missing:
        raise RuntimeError(f"pipeline checkpoint: no stage holds {missing[:5]} ({len(missing)} entries)")
    return {n: _as_tensor(merged[n], device) for n in whole_names}


def gather_optimizer_state(optimizer, state_dict, names, whole_groups, pipeline_group, tensor_group=None):
    """The whole model's optimizer state dict (torch's layout, numbered as ``whole_groups`` lists the names) on
    stage 0 / tensor rank 0; None elsewhere. ``state_dict``: this stage's (``optimizer.state_dict()``, after
    ZeRO's consolidation); ``names``: {id(parameter): name in the whole model}."""
    if tensor_group is not None:
        state_dict = whole_optimizer_state(state_dict, optimizer, tensor_group, to=0)
        if state_dict is None:
            return None
    by_index = params_by_index(state_dict, optimizer)
    named = {}
    for index, entry in state_dict["state"].items():
        p = by_index[int(index)]
        if getattr(p, "shared_embedding", False):
            continue  # the last stage's copy of the tied weight: the first stage sends the original
        for key, value in entry.items():
            named[names[id(p)] + _SEP + key] = value
    options = [{k: v for k, v in g.items() if k != "params"} for g in state_dict["param_groups"]]
    device = next(p.device for g in optimizer.whole_param_groups
                  for p in g["params"])
    merged = _gather(named, pipeline_group, device)
    if merged is None:
        return None
    per_param = {}
    for key, value in merged.items():
        name, entry_key = key.split(_SEP)
        per_param.setdefault(name, {})[entry_key] = _as_tensor(value, device)
    index = {name: i for i, name in enumerate(n for group in whole_groups for n in group)}
    groups = [{**opts, "params": [index[n] for n in group]} for opts, group in zip(options, whole_groups)]
    return {"state": {index[n]: entry for n, entry in per_param.items()}, "param_groups": groups}


def local_optimizer_state(whole, optimizer, names, whole_groups, tensor_group=None):
    """This stage's (and tensor rank's) part of a whole model's optimizer state dict, in ``optimizer``'s layout."""
    saved = whole["param_groups"]
    if [len(g["params"]) for g in saved] != [len(g) for g in whole_groups]:
        raise ValueError(f"optimizer state: the saved param groups hold {[len(g['params']) for g in saved]} "
                         f"parameters, the model's {[len(g) for g in whole_groups]}\nHINT: the checkpoint was written "
                         "for another model; resume with its own config")
    by_name = {}
    for group, names_in_group in zip(saved, whole_groups):
        for i, name in zip(group["params"], names_in_group):
            entry = whole["state"].get(i, whole["state"].get(str(i)))
            if entry is not None:
                by_name[name] = entry
    groups = optimizer.whole_param_groups
    state, param_groups, k = {}, [], 0
    for opts, group in zip(saved, groups):
        indices = []
        for p in group["params"]:
            entry = by_name.get(names[id(p)])
            if entry is not None:
                state[k] = dict(entry)
            indices.append(k)
            k += 1
        param_groups.append({**{key: v for key, v in opts.items() if key != "params"}, "params": indices})
    local = {"state": state, "param_groups": param_groups}
    return shard_optimizer_state(local, optimizer, tensor_group) if tensor_group is not None else local


__all__ = ["gather_model_state", "gather_optimizer_state", "local_optimizer_state"]
