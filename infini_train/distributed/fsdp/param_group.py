"""One fully_shard unit: the parameters a ``fully_shard(module)`` call manages (those of its subtree not managed by
an inner unit), kept in ShardedFlatSpaces, one per (device, dtype, requires_grad, process group): a parameter is
sharded over the unit's group (under HSDP replicated over its replicate group), or over the group ``shard_group_fn``
names for it (an expert-parallel layer's experts over their expert-data group, not replicated), whose gradient sums
are then divided by the unit's data-parallel size all the same.

The unit gathers its parameters before its module's forward and for its backward, reduce-scatters the gradients
as soon as every trainable parameter's has accumulated (post-accumulate-grad hooks), and reshards.
"""
from __future__ import annotations

from collections import deque

from ...autograd import engine
from .flat_shard import ShardedFlatSpace

# spaces whose gradient reduction is in flight: one unit's may overlap the next unit's backward, but each holds a
# whole-gradient buffer, so the older ones are completed as new ones start
_REDUCING = deque()
MAX_REDUCING = 1


class MixedPrecisionPolicy:
    """``MixedPrecisionPolicy(param_dtype=None, reduce_dtype=None, output_dtype=None, cast_forward_inputs=True)``,
    as FSDP2's: parameters are gathered (and the module computes) in ``param_dtype``, gradients reduced in
    ``reduce_dtype`` (default: ``param_dtype``); the sharded parameters, their gradients and the optimizer stay
    in the parameters' own dtype. The root casts floating inputs to ``param_dtype`` and outputs to
    ``output_dtype`` when set."""

    def __init__(self, param_dtype=None, reduce_dtype=None, output_dtype=None, cast_forward_inputs=True):
        self.param_dtype, self.reduce_dtype, self.output_dtype = param_dtype, reduce_dtype, output_dtype
        self.cast_forward_inputs = bool(cast_forward_inputs)

    def __repr__(self):
        return (f"MixedPrecisionPolicy(param_dtype={self.param_dtype}, reduce_dtype={self.reduce_dtype}, "
                f"output_dtype={self.output_dtype}, cast_forward_inputs={self.cast_forward_inputs})")


class FSDPParamGroup:
    def __init__(self, params, group, reshard_after_forward=True, mp_policy=None, replicate_group=None,
                 shard_group_fn=None):
        self.group, self.replicate_group = group, replicate_group
        self.reshard_after_forward = bool(reshard_after_forward)
        self.mp_policy = mp_policy or MixedPrecisionPolicy()
        self.params = params
        keys, groups = {}, {}  # (in the parameters' order: the same spaces, in the same order, on every rank)
        for p in params:
            shard_group = (shard_group_fn(p) if shard_group_fn is not None else None) or group
            groups[id(shard_group)] = shard_group
            keys.setdefault((p.device, str(p.dtype), p.requires_grad, id(shard_group)), []).append(p)
        mp = self.mp_policy
        data_size = group.size * (replicate_group.size if replicate_group is not None else 1)
        self.spaces = [ShardedFlatSpace(members, groups[key[3]], mp.param_dtype, mp.reduce_dtype,
                                        replicate_group if groups[key[3]] is group else None, data_size)
                       for key, members in keys.items()]
        self.trainable = [p for p in params if p.requires_grad]
        # frozen parameters (LoRA's base weights) may still be needed for the input's gradient after every trainable
        # one has its gradient: such a unit also waits until backward has passed its module's inputs
        self.waits_for_inputs = len(self.trainable) < len(params)
        self.inputs_pending = 0
        self.handles = [p.register_post_accumulate_grad_hook(self._on_grad) for p in self.trainable]
        self.ready = set()
        self.requires_gradient_sync = True
        self.reshard_after_backward = True
        self.used = False  # ran forward since its gradients were last reduced
        # A unit holding experts (placement.routed) may get all its gradients on one rank and not on another, so
        # reducing when they are all in would order the collectives differently on different ranks: such a unit
        # reduces at the end of backward, where every rank takes the units in the same order.
        self.reduces_at_end = any(p.placement.routed for p in self.trainable)
        self.on_pass_start = None  # set by the root: queues the end-of-backward callback once per pass

    @property
    def gathered(self):
        return all(s.gathered for s in self.spaces)

    def unshard(self, async_op=False):
        for space in self.spaces:
            space.unshard(async_op)

    def reshard(self):
        for space in self.spaces:
            space.reshard()

    def _on_grad(self, param):
        if self.on_pass_start is not None:
            self.on_pass_start()
        self.ready.add(id(param))
        self._maybe_post_backward()

    def input_done(self):
        """Backward has passed one of the module's inputs."""
        if self.on_pass_start is not None:
            self.on_pass_start()
        self.inputs_pending -= 1
        self._maybe_post_backward()

    def _maybe_post_backward(self):
        if self.reduces_at_end:
            return
        if len(self.ready) == len(self.trainable) and self.inputs_pending <= 0 and (self.ready or self.used):
            self.post_backward()

    def post_backward(self):
        """Every trainable parameter's gradient is in: reduce-scatter them (unless gradient sync is off, when the
        whole gradients stay and accumulate) and reshard."""
        self.ready.clear()
        self.used = False
        self.inputs_pending = 0
        if self.requires_gradient_sync:
            for space in self.spaces:
                if space.params[0].requires_grad:
                    while len(_REDUCING) >= MAX_REDUCING:
                        _REDUCING.popleft().fold_reduced()
                    space.reduce_grads()
                    _REDUCING.append(space)
        if self.reshard_after_backward:
            self.reshard()

    def finish_backward(self):
        """End of a backward pass: reduce what ran forward but got only some (or none) of its gradients, wait for
        every reduction, reshard."""
        if self.trainable and (self.ready or self.used):
            self.post_backward()
        for space in self.spaces:
            space.fold_reduced()
        if self.reshard_after_backward:
            self.reshard()


def in_backward():
    """Whether a backward pass is running (a recomputation re-runs forwards inside it)."""
    return engine.pass_state.callbacks is not None


__all__ = ["MixedPrecisionPolicy", "FSDPParamGroup", "in_backward"]
