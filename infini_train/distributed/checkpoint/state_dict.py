"""torch.distributed.checkpoint.state_dict's functions: a model's and its optimizers' state, sharded (each rank's
shards with their placement) or full (whole tensors, on rank 0 or on every rank), and loading either back.

    model_state = get_model_state_dict(model)                  # {name: ShardedTensor | Tensor}: this rank's part
    optim_state = get_optimizer_state_dict(model, optimizer)   # {"state": {name: {...}}, "param_groups": [...]}
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=path)   # every rank writes its shards
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))  # rank 0's
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))

Names are the model's parameter names (a DistributedDataParallel wrapper's ``module.`` left out, as torch leaves
it out; DataParallel's kept, as torch keeps it), and the optimizer state is keyed by parameter name instead of
position, as torch's is: a state dict loads into whichever layout or wrapper, whatever order the optimizer lists
the parameters in. The full functions are collectives: every rank calls them.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from ... import backend
from ...tensor import Tensor
from ..sharded_tensor import ShardedTensor, ShardView


@dataclass
class StateDictOptions:
    """As torch's: ``full_state_dict`` whole tensors instead of each rank's shards (gathered, collective);
    ``cpu_offload`` tensors on the host, and with ``full_state_dict`` only rank 0 keeps them (the others get {});
    ``ignore_frozen_params`` leaves out parameters that do not require grad; ``strict`` (set_*) requires exactly the
    model's keys; ``broadcast_from_rank0`` (set_*, with ``full_state_dict``) rank 0 alone passes the state, the
    others an empty dict, and each rank keeps its shards of what rank 0 broadcasts."""

    full_state_dict: bool = False
    cpu_offload: bool = False
    ignore_frozen_params: bool = False
    strict: bool = True
    broadcast_from_rank0: bool = False


def _options(options, what):
    options = StateDictOptions() if options is None else options
    if not isinstance(options, StateDictOptions):
        raise TypeError(f"{what}: options must be a StateDictOptions, got {type(options).__name__}\nHINT: "
                        "options=StateDictOptions(full_state_dict=True)")
    if options.broadcast_from_rank0 and not options.full_state_dict:
        raise ValueError(f"{what}: broadcast_from_rank0=True needs full_state_dict=True (rank 0 broadcasts whole "
                         "tensors), got full_state_dict=False\nHINT: StateDictOptions(full_state_dict=True, "
                         "broadcast_from_rank0=True)")
    return options


def _world():
    from .. import default_group

    return default_group()


def _unwrapped(model):
    """The model under DistributedDataParallel wrappers (whose ``module.`` torch's functions leave out)."""
    from ...nn.parallel import DistributedDataParallel  # (the wrapper is nn's, a layer below: imported on use)

    while isinstance(model, DistributedDataParallel):
        model = model.module
    return model


def _as_list(optimizers):
    return list(optimizers) if isinstance(optimizers, (list, tuple)) else [optimizers]


def _stepped(p):
    """What an optimizer lists for ``p``: the parameter, or for one fully_shard keeps sharded, its ShardView."""
    flat_shard = p.placement.flat_shard
    return p if flat_shard is None else flat_shard.shard_views[id(p)]


def _on_host(value):
    if isinstance(value, ShardedTensor):
        return ShardedTensor(value.to_local().cpu(), value.shape, value.placement, value.group)
    return value.cpu() if isinstance(value, Tensor) else value


# ------------------------------------------------------------------------------------------------------- model
def get_model_state_dict(model, *, submodules=None, options=None):
    """``model``'s state dict: this rank's part (a fully_shard parameter as a ShardedTensor of its shard), or with
    ``options.full_state_dict`` the whole tensors (every rank calls it; with ``cpu_offload`` only rank 0 gets them,
    the others {})."""
    options = _options(options, "get_model_state_dict")
    if submodules is not None:
        raise ValueError("get_model_state_dict: submodules is not supported (torch deprecates it)\nHINT: take "
                         "get_model_state_dict(submodule) of each, or filter the keys")
    model = _unwrapped(model)
    state = model.state_dict()
    if options.ignore_frozen_params:
        frozen = {name for name, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}
        state = OrderedDict((k, v) for k, v in state.items() if k not in frozen)
    if not options.full_state_dict:
        return OrderedDict((k, _on_host(v)) for k, v in state.items()) if options.cpu_offload else state
    keep = not options.cpu_offload or _world().rank == 0
    out, whole = OrderedDict(), {}
    for key, value in state.items():
        if isinstance(value, ShardedTensor):
            shared = id(value.to_local().array)  # a tied weight is gathered once
            if shared not in whole:
                whole[shared] = value.full_tensor()
            value = whole[shared]
        if keep:
            out[key] = value.cpu() if options.cpu_offload else value
    return out if keep else {}


def set_model_state_dict(model, model_state_dict, *, options=None):
    """Load ``model_state_dict`` (sharded, as get_model_state_dict gives it under the same layout, or full: each
    rank keeps its shards) into ``model``; returns (missing_keys, unexpected_keys) as ``load_state_dict``."""
    options = _options(options, "set_model_state_dict")
    model = _unwrapped(model)
    if options.broadcast_from_rank0:
        own = model.state_dict(keep_vars=True)
        model_state_dict = _broadcast_from_rank0(model_state_dict, lambda path, t: _model_part(own, path, t))
    return model.load_state_dict(model_state_dict, strict=options.strict)


def _model_part(own, path, whole):
    """What a rank keeps of the whole tensor ``whole`` broadcast for the model's key ``path[0]``: its shard."""
    target = own.get(path[0]) if len(path) == 1 else None
    flat_shard = target.placement.flat_shard
    if flat_shard is None:
        return whole
    view = flat_shard.shard_views[id(target)]
    return view.placed(Tensor._make(view.local_of(whole, "set_model_state_dict").copy(), whole.device))


# --------------------------------------------------------------------------------------------------- optimizer
def _param_names(model):
    """{id(what an optimizer lists for a parameter): the parameter's name} (a tied weight under its first name)."""
    names = {}
    for name, p in model.named_parameters():
        names.setdefault(id(_stepped(p)), name)
    return names


def _listed(optimizer, names, what):
    """The names of the parameters ``optimizer`` lists, in its state dict's order."""
    out = []
    for g in optimizer.param_groups:
        for p in g["params"]:
            if id(p) not in names:
                raise ValueError(f"{what}: the optimizer updates a tensor of shape {tuple(p.shape)} that is not a "
                                 "parameter of the model\nHINT: pass the model whose parameters the optimizer was "
                                 "built from")
            out.append(names[id(p)])
    return out


def _zero(optimizer):
    from ..optim import ZeroRedundancyOptimizer

    return isinstance(optimizer, ZeroRedundancyOptimizer)


def get_optimizer_state_dict(model, optimizers, *, submodules=None, options=None):
    """The state of ``optimizers`` (one or a list) over ``model``'s parameters, keyed by parameter name: {"state":
    {name: {key: value}}, "param_groups": [{option: value, "params": [names]}]}; a fully_shard parameter's arrays
    as ShardedTensors of its shard, or with ``options.full_state_dict`` whole (collective, as get_model_state_dict).
    A ZeroRedundancyOptimizer's state comes full only (it is gathered from the ranks' pieces)."""
    options = _options(options, "get_optimizer_state_dict")
    if submodules is not None:
        raise ValueError("get_optimizer_state_dict: submodules is not supported (torch deprecates it)")
    model = _unwrapped(model)
    names = _param_names(model)
    views = {names[id(_stepped(p))]: _stepped(p) for p in model.parameters() if isinstance(_stepped(p), ShardView)}
    keep = not (options.full_state_dict and options.cpu_offload) or _world().rank == 0
    state, groups = {}, []
    for optimizer in _as_list(optimizers):
        if _zero(optimizer):
            indexed, listed = _zero_state(optimizer, options, keep, model)
            if indexed is None:  # (cpu_offload: rank 0's alone)
                continue
        else:
            _init_state(optimizer)
            indexed, listed = optimizer.state_dict(), _listed(optimizer, names, "get_optimizer_state_dict")
            if options.full_state_dict:
                indexed["state"] = _gathered_state(indexed["state"], listed, views, keep)
        for i, entry in indexed["state"].items():
            state[listed[int(i)]] = {k: _on_host(v) if options.cpu_offload else v for k, v in entry.items()}
        for g in indexed["param_groups"]:
            groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": [listed[i] for i in g["params"]]})
    return {"state": state, "param_groups": groups} if keep else {}


def _init_state(optimizer):
    """Give a fresh optimizer its state as torch's functions do (one step with zero gradients at learning rate 0,
    which leaves the parameters as they are), so that its state dict has the arrays a checkpoint load fills."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if optimizer.state or any(p.grad is not None for p in params):
        return
    for p in params:
        if p.requires_grad:
            with p.device.context():
                p.grad = Tensor._make(p.device.array_module().zeros_like(p.array), p.device)
    rates = [g.get("lr") for g in optimizer.param_groups]
    for g in optimizer.param_groups:
        if "lr" in g:
            g["lr"] = 0.0
    optimizer.step()
    for g, lr in zip(optimizer.param_groups, rates):
        if lr is not None:
            g["lr"] = lr
    optimizer.zero_grad(set_to_none=True)


def _zero_state(optimizer, options, keep, model):
    if not options.full_state_dict:
        raise ValueError("get_optimizer_state_dict: a ZeroRedundancyOptimizer's state comes whole only, gathered "
                         "from its ranks' pieces, got full_state_dict=False\nHINT: StateDictOptions("
                         "full_state_dict=True)")
    names = {}
    for name, p in model.named_parameters():
        names.setdefault(id(p), name)
    optimizer.consolidate_state_dict(to=0)
    indexed = optimizer.state_dict() if _world().rank == 0 else None
    listed = [names[id(p)] for g in optimizer.whole_param_groups for p in g["params"]]
    if keep and not options.cpu_offload:  # every rank: rank 0's, broadcast
        indexed = _broadcast_from_rank0(indexed, lambda path, t: t)
    return indexed, listed


def _gathered_state(state, listed, views, keep):
    """``state`` (indexed as ``listed``) with every sharded array whole. Every rank walks the same (parameter, key)
    list, agreed first: a rank holding none of a parameter may have no state for it."""
    def describe(value):
        if isinstance(value, ShardedTensor):
            return ("sharded", value.dtype)
        return ("tensor", None) if isinstance(value, Tensor) else ("value", value)

    mine = {listed[int(i)]: {k: describe(v) for k, v in entry.items()} for i, entry in state.items()}
    world = _world()
    every = [None] * world.size
    from .. import all_gather_object

    all_gather_object(every, mine, world)
    agreed = {}
    for described in every:
        for name, entry in described.items():
            agreed.setdefault(name, {})
            for key, kind in entry.items():
                agreed[name].setdefault(key, kind)
    position = {name: i for i, name in enumerate(listed)}
    local = {listed[int(i)]: entry for i, entry in state.items()}
    out = {}
    for name in sorted(agreed, key=position.get):
        entry = {}
        for key, (kind, info) in agreed[name].items():
            value = local.get(name, {}).get(key)
            if kind == "sharded":
                if value is None:  # this rank holds none of the parameter: an empty piece
                    with views[name].device.context():
                        empty = views[name].device.array_module().zeros(views[name].array.size, info)
                    value = views[name].placed(Tensor._make(empty, views[name].device))
                value = value.full_tensor()
            elif kind == "value" and value is None:
                value = info
            if value is not None:
                entry[key] = value
        out[position[name]] = entry
    return out if keep else {}


def set_optimizer_state_dict(model, optimizers, optim_state_dict, *, options=None):
    """Load ``optim_state_dict`` (by parameter name, as get_optimizer_state_dict gives it: sharded under the same
    layout, or full: each rank keeps its shards) into ``optimizers`` over ``model``'s parameters."""
    options = _options(options, "set_optimizer_state_dict")
    model = _unwrapped(model)
    names = _param_names(model)
    if options.broadcast_from_rank0:
        views = {names[id(_stepped(p))]: _stepped(p) for p in model.parameters()}
        optim_state_dict = _broadcast_from_rank0(optim_state_dict, lambda path, t: _optimizer_part(views, path, t))
    saved_groups = optim_state_dict["param_groups"]
    group_of = {name: g for g in saved_groups for name in g["params"]}
    for optimizer in _as_list(optimizers):
        if _zero(optimizer):
            by_id = {}
            for name, p in model.named_parameters():
                by_id.setdefault(id(p), name)
            listed = [by_id[id(p)] for g in optimizer.whole_param_groups for p in g["params"]]
            own_groups = optimizer.whole_param_groups
        else:
            listed = _listed(optimizer, names, "set_optimizer_state_dict")
            own_groups = optimizer.param_groups
        index = {name: i for i, name in enumerate(listed)}
        groups, at = [], 0
        for g in own_groups:
            members = listed[at:at + len(g["params"])]
            at += len(g["params"])
            saved = group_of.get(members[0]) if members else None
            if members and saved is None:
                raise ValueError(f"set_optimizer_state_dict: no saved param group lists {members[0]!r}\nHINT: was the "
                                 "state saved for this model's parameters?")
            options_of = {k: v for k, v in (saved or g).items() if k != "params"}
            groups.append({**options_of, "params": [index[name] for name in members]})
        state = {index[name]: entry for name, entry in optim_state_dict["state"].items() if name in index}
        optimizer.load_state_dict({"state": state, "param_groups": groups})


def _optimizer_part(views, path, whole):
    """What a rank keeps of a whole state tensor broadcast at ``path`` ("state", name, key): its shard."""
    view = views.get(path[1]) if len(path) == 3 and path[0] == "state" else None
    if not isinstance(view, ShardView) or tuple(whole.shape) != view.whole_shape:
        return whole
    return view.placed(Tensor._make(view.local_of(whole, "set_optimizer_state_dict").copy(), whole.device))


# ------------------------------------------------------------------------------------------------ both at once
def get_state_dict(model, optimizers, *, submodules=None, options=None):
    """(get_model_state_dict(model), get_optimizer_state_dict(model, optimizers)), as torch's."""
    return (get_model_state_dict(model, submodules=submodules, options=options),
            get_optimizer_state_dict(model, optimizers, submodules=submodules, options=options))


def set_state_dict(model, optimizers, *, model_state_dict, optim_state_dict, options=None):
    """set_model_state_dict then set_optimizer_state_dict, as torch's; returns the model's (missing, unexpected)."""
    keys = set_model_state_dict(model, model_state_dict, options=options)
    set_optimizer_state_dict(model, optimizers, optim_state_dict, options=options)
    return keys


# ----------------------------------------------------------------------------------------------- broadcasting
_TENSOR = "__tensor__"


def _broadcast_from_rank0(tree, keep):
    """Rank 0's ``tree`` (dicts and lists of Tensors and other values) on every rank, each whole tensor broadcast
    in turn and replaced by ``keep(path, tensor)`` as it arrives (a rank's shard of it), so no rank holds more than
    one whole tensor beyond what it keeps."""
    from .. import all_gather_object

    world = _world()

    def skeleton(node):
        if isinstance(node, Tensor):
            return (_TENSOR, tuple(node.shape), node.array.dtype)
        if isinstance(node, dict):
            return {k: skeleton(v) for k, v in node.items()}
        if isinstance(node, (list, tuple)):
            return type(node)(skeleton(v) for v in node)
        if isinstance(node, ShardedTensor):
            raise ValueError("broadcast_from_rank0: rank 0's state holds ShardedTensors; it must be full\nHINT: take "
                             "it with StateDictOptions(full_state_dict=True, cpu_offload=True)")
        return node

    every = [None] * world.size
    all_gather_object(every, skeleton(tree) if world.rank == 0 else None, world)

    def fill(shape_node, node, path):
        if isinstance(shape_node, tuple) and len(shape_node) == 3 and shape_node[0] == _TENSOR:
            _, shape, dtype = shape_node
            host = np.zeros(shape, dtype) if world.rank else backend.to_device_array(node.array, backend.CPU)
            host = np.ascontiguousarray(host)
            world.broadcast(host, 0)
            return keep(path, Tensor._make(host, backend.CPU))
        if isinstance(shape_node, dict):
            return {k: fill(v, node[k] if world.rank == 0 else None, path + (k,)) for k, v in shape_node.items()}
        if isinstance(shape_node, (list, tuple)):
            return type(shape_node)(fill(v, node[i] if world.rank == 0 else None, path + (i,))
                                    for i, v in enumerate(shape_node))
        return shape_node

    return fill(every[0], tree, ())


__all__ = ["StateDictOptions", "get_model_state_dict", "get_optimizer_state_dict", "set_model_state_dict",
           "set_optimizer_state_dict", "get_state_dict", "set_state_dict"]
