"""``fully_shard(module, mesh_or_group=None, reshard_after_forward=True, mp_policy=None, shard_group_fn=None)``:
fully sharded data parallelism (ZeRO-3), with FSDP2's interface. Apply it to each transformer block, then to the root
model:

    for block in model.transformer.h:
        fully_shard(block, group)
    fully_shard(model, group)
    optimizer = AdamW(model.parameters(), lr=3e-4)   # steps each rank's shards

Each data-parallel rank keeps only its shard of every parameter, gradient and optimizer state. A unit's
parameters are all-gathered just before its module's forward and freed after it (``reshard_after_forward``; the
root keeps its own until backward is done), gathered again when backward reaches the module's outputs (the unit
before it in forward order is gathered ahead, so the two overlap), and their gradients are reduce-scattered to
the shards as soon as they have all accumulated (a unit holding a mixture of experts' experts, which some ranks
may get no gradient for, at the end of backward). The autograd graph keeps no copy of the gathered parameters: the
tensors ops save for backward that view them are packed (saved_tensors_hooks) as places in the unit's storage,
and an autocast cast of one as the cast to redo, read again after the backward gather. Expert parallelism
(``shard_group_fn``): a block's experts, which only the ranks holding the same experts share, are sharded over that
expert-data group within the block's unit, gathered and reduced with the rest of the block.

The module's class becomes ``FSDP<Class>`` (an ``FSDPModule``): ``unshard()``, ``reshard()``,
``set_requires_gradient_sync(flag)`` (off: whole gradients accumulate locally, as DDP's no_sync),
``set_reshard_after_backward(flag)``, ``clip_grad_norm_(max_norm)`` and ``with module.unsharded():`` (every
parameter of the subtree gathered, and written back to the shards on exit).
"""
from __future__ import annotations

import contextlib
import threading

from ...autograd import engine
from ...autograd.ops.conversion import Cast
from ...autograd.function import Op
from ...autograd.grad_mode import is_grad_enabled
from ...autograd.saved_hooks import saved_tensors_hooks
from ...backend import is_floating
from ...tensor import Tensor
from ..optim.zero_redundancy_optimizer import clip_sharded_grads_
from .flat_shard import GATHERED
from .hybrid_mesh import HybridShardMesh
from .param_group import FSDPParamGroup, MixedPrecisionPolicy, in_backward


class _Active(threading.local):
    root = None  # the root state whose forward is running on this thread


_active = _Active()


def _resolve_groups(mesh_or_group):
    """(the group to shard over, the group to replicate over or None) of fully_shard's ``mesh_or_group``."""
    from .. import default_group

    if mesh_or_group is None:
        return default_group(), None
    if isinstance(mesh_or_group, HybridShardMesh):  # HSDP: shard within a replica, replicate across them
        return mesh_or_group.shard_group, mesh_or_group.replicate_group
    data_group = getattr(mesh_or_group, "data_group", None)  # a ProcessMesh: shard over its data-parallel group
    if data_group is not None:
        return data_group, None
    if hasattr(mesh_or_group, "all_gather_into_tensor"):
        return mesh_or_group, None
    raise TypeError(f"fully_shard: mesh_or_group must be a ProcessGroup, a HybridShardMesh, a ProcessMesh or None, "
                    f"got {type(mesh_or_group).__name__}")


def fully_shard(module, mesh_or_group=None, *, reshard_after_forward=True, mp_policy=None, shard_group_fn=None):
    """Shard ``module``'s parameters (those not already sharded by an inner ``fully_shard``) over the data-parallel
    ``mesh_or_group`` (a ProcessGroup, a ProcessMesh's data group, or None for the world), or with a
    HybridShardMesh (HSDP) over its shard group, replicated over its replicate group; returns ``module``.
    ``shard_group_fn``: parameter -> the group to shard it over instead (None: ``mesh_or_group``'s), for parameters
    replicated over fewer ranks, e.g. an expert-parallel layer's experts over the ranks holding the same experts (not
    replicated further); their gradient sums over it are divided by the data-parallel size, as every gradient's is."""
    if isinstance(module, FSDPModule):
        raise ValueError(f"fully_shard: {type(module).__name__} is already sharded\nHINT: call fully_shard once "
                         "per module, inner modules first")
    group, replicate_group = _resolve_groups(mesh_or_group)
    if mp_policy is not None and not isinstance(mp_policy, MixedPrecisionPolicy):
        raise TypeError(f"fully_shard: mp_policy must be a MixedPrecisionPolicy, got {type(mp_policy).__name__}")
    params = [p for p in module.parameters() if p.placement.flat_shard is None]
    unit = (FSDPParamGroup(params, group, reshard_after_forward, mp_policy, replicate_group, shard_group_fn)
            if params else None)
    object.__setattr__(module, "_fsdp", _ModuleState(module, unit, group))
    cls = type(module)
    module.__class__ = _fsdp_class(cls)
    module.register_forward_pre_hook(_pre_forward)
    module.register_forward_hook(_post_forward)
    return module


_CLASSES = {}


def _fsdp_class(cls):
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"FSDP{cls.__name__}", (FSDPModule, cls), {})
    return _CLASSES[cls]


class _ModuleState:
    def __init__(self, module, unit, group):
        self.module, self.unit, self.group = module, unit, group
        self.own_root = None  # the _RootState of this module's tree, when its forward is the outermost one
        self.hooks = None  # the saved-tensor hooks while this module's forward runs as the root's


class _RootState:
    """The outermost sharded module of a forward: every unit under it, their forward order, the callback that
    finishes each backward pass."""

    def __init__(self, module):
        self.units = [m._fsdp.unit for m in module.modules() if isinstance(m, FSDPModule) and m._fsdp.unit is not None]
        self.order, self.last_order = [], []
        self.queued = False

    def start_forward(self):
        self.order = []
        for unit in self.units:  # their gradient hooks finish the backward pass this forward's graph gets
            unit.on_pass_start = self.on_pass_start

    def on_pass_start(self):
        if not self.queued:
            self.queued = True
            engine.queue_callback(self.finish_backward)

    def finish_backward(self):
        self.queued = False
        for unit in self.units:
            unit.finish_backward()

    def next_of(self, unit, step):
        """The unit ``step`` places after ``unit`` in the last forward's order, or None."""
        order = self.last_order
        for k, u in enumerate(order):
            if u is unit:
                j = k + step
                return order[j] if 0 <= j < len(order) else None
        return None


def _pack(tensor):
    array = tensor.array
    base = getattr(array, "base", None)
    space = GATHERED.get(id(base)) if base is not None else None
    if space is not None and array.dtype == base.dtype:
        return ("view", space.saved_view(array))
    fn = tensor.grad_fn
    if isinstance(fn, Cast) and fn.next_functions:  # autocast's cast of a parameter
        producer = fn.next_functions[0][0]
        source = getattr(producer, "tensor", None)
        if source is not None and source.placement.flat_shard is not None and source.placement.flat_shard.gathered:
            return ("cast", source, array.dtype)
    return ("array", array)


def _unpack(packed):
    kind = packed[0]
    if kind == "array":
        return packed[1]
    if kind == "view":
        space, offset, shape, strides = packed[1]
        return space.view_at(offset, shape, strides)
    source, dtype = packed[1], packed[2]
    source.placement.flat_shard.require_gathered()
    return source.array.astype(dtype)


class _PreBackward(Op):
    """Identity on a sharded module's output; its backward gathers the module's parameters (and starts gathering
    the unit that ran before it) before the module's own backward runs."""

    def __init__(self, unit, root):
        self.unit, self.root = unit, root

    def forward(self, a):
        return a

    def backward(self, g):
        if self.root is not None:
            self.root.on_pass_start()
        if self.unit is not None and self.root is not None:
            self.unit.unshard()
            previous = self.root.next_of(self.unit, -1)
            if previous is not None:
                previous.unshard(async_op=True)
        return g


class _PostBackward(Op):
    """Identity on a sharded module's input (units with frozen parameters): its backward runs once backward has
    passed the whole module, after which its parameters may be resharded."""

    def __init__(self, unit):
        self.unit = unit

    def forward(self, a):
        return a

    def backward(self, g):
        self.unit.input_done()
        return g


def _wait_for(unit, t):
    unit.inputs_pending += 1
    return _PostBackward(unit).apply(t)


def _map_tensors(obj, fn):
    if isinstance(obj, Tensor):
        return fn(obj)
    if isinstance(obj, tuple):
        return tuple(_map_tensors(o, fn) for o in obj)
    if isinstance(obj, list):
        return [_map_tensors(o, fn) for o in obj]
    if isinstance(obj, dict):
        return {k: _map_tensors(v, fn) for k, v in obj.items()}
    return obj


def _pre_forward(module, args):
    state = module._fsdp
    unit = state.unit
    if in_backward():  # a recomputation: gather if needed, nothing else
        if unit is not None:
            unit.unshard()
        return None
    if _active.root is None:  # the outermost sharded module of this forward is its root
        if state.own_root is None:
            state.own_root = _RootState(module)
        _active.root = state.own_root
        state.own_root.start_forward()
        state.hooks = saved_tensors_hooks(_pack, _unpack)
        state.hooks.__enter__()
        mp = unit.mp_policy if unit is not None else None
        if mp is not None and mp.param_dtype is not None and mp.cast_forward_inputs:
            args = _map_tensors(args, lambda t: t.to(mp.param_dtype) if is_floating(t.dtype) else t)
    root = _active.root
    if unit is not None:
        if unit.waits_for_inputs and is_grad_enabled():
            args = _map_tensors(args, lambda t: _wait_for(unit, t) if t.requires_grad else t)
        unit.unshard()
        unit.used = True
        root.order.append(unit)
        following = root.next_of(unit, +1)
        if following is not None:
            following.unshard(async_op=True)
    return args


def _post_forward(module, args, output):
    state = module._fsdp
    unit = state.unit
    if in_backward():  # a recomputation builds the graph the forward built (its pre-backward node included)
        return _map_tensors(output, lambda t: _PreBackward(unit, None).apply(t) if t.requires_grad else t)
    root = _active.root
    is_root = state.hooks is not None
    grad = is_grad_enabled()
    if grad:
        output = _map_tensors(output, lambda t: _PreBackward(unit, root).apply(t) if t.requires_grad else t)
    if unit is not None and (not grad or (unit.reshard_after_forward and not is_root)):
        unit.reshard()
    if is_root:
        state.hooks.__exit__(None, None, None)
        state.hooks = None
        _active.root = None
        root.last_order = root.order
        mp = unit.mp_policy if unit is not None else None
        if mp is not None and mp.output_dtype is not None:
            output = _map_tensors(output, lambda t: t.to(mp.output_dtype) if is_floating(t.dtype) else t)
    return output


class FSDPModule:
    """What ``fully_shard`` adds to a module's class."""

    def __call__(self, *args, **kwargs):
        try:
            return super().__call__(*args, **kwargs)
        except BaseException:
            state = self._fsdp
            if state.hooks is not None:  # a forward that raised leaves no root half-open for the next one
                state.hooks.__exit__(None, None, None)
                state.hooks = None
                _active.root = None
            raise

    def _units(self):
        return [m._fsdp.unit for m in self.modules() if isinstance(m, FSDPModule) and m._fsdp.unit is not None]

    def unshard(self, async_op=False):
        """Gather this module's own parameters (those of inner sharded modules gather with them)."""
        if self._fsdp.unit is not None:
            self._fsdp.unit.unshard(async_op)

    def reshard(self):
        if self._fsdp.unit is not None:
            self._fsdp.unit.reshard()

    def set_requires_gradient_sync(self, requires_gradient_sync, *, recurse=True):
        """Off: backward keeps whole gradients and accumulates them locally (for accumulation steps); the next
        backward with sync on reduce-scatters the sum."""
        for unit in (self._units() if recurse else [u for u in [self._fsdp.unit] if u is not None]):
            unit.requires_gradient_sync = bool(requires_gradient_sync)

    def set_reshard_after_backward(self, reshard_after_backward, *, recurse=True):
        for unit in (self._units() if recurse else [u for u in [self._fsdp.unit] if u is not None]):
            unit.reshard_after_backward = bool(reshard_after_backward)

    @contextlib.contextmanager
    def unsharded(self, writeback=True, trainable_only=False):
        """Every parameter of this subtree gathered in its own dtype (torch's summon_full_params; collective over the
        group); with ``writeback`` what was written into them goes back to the shards on exit. ``trainable_only``:
        gather just the parameters that require grad (a LoRA model's adapters)."""
        spaces = [s for unit in self._units() for s in unit.spaces
                  if not trainable_only or s.params[0].requires_grad]
        for space in spaces:
            space.unshard(full_precision=True)
        try:
            yield self
        finally:
            for space in spaces:
                if writeback and space.flat is not None:
                    space.shard[:space.hi - space.lo] = space.flat[space.lo:space.hi]
                space.reshard()

    def clip_grad_norm_(self, max_norm, norm_type=2.0):
        """Scale the sharded gradients so that the norm of the whole model's gradients is at most ``max_norm``;
        returns that norm (the same on every rank)."""
        grads = [v.grad.array for unit in self._units() for space in unit.spaces
                 for v in space.shard_views.values() if v.grad is not None and v.array.size]
        return clip_sharded_grads_(grads, grads, max_norm, norm_type, [self._fsdp.group])


__all__ = ["fully_shard", "FSDPModule", "MixedPrecisionPolicy"]
