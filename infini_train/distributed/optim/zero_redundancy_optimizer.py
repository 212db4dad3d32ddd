"""ZeroRedundancyOptimizer: optimizer state (and, with DDP, gradients) sharded across data-parallel ranks.

The parameters of each (device, dtype) are laid out in one flat buffer that every parameter views. The flat
space is cut into ``world`` equal contiguous shards (the last padded); rank r owns shard r. An inner optimizer
(``optimizer_class``, e.g. AdamW) steps 1-D views of the owned pieces of the parameters, so its state (AdamW's
two moments) covers 1/world of the model, and param groups (weight decay / no decay) keep their options. After
the update each rank's shard is all-gathered in place into the flat buffer, so every rank holds the whole
model again.

Gradients: with ZeRO-1 they stay whole on every rank (DDP all-reduces them as usual) and live in a flat
buffer of the same layout, so the inner optimizer reads its shard of them without a copy. With ZeRO-2
(``DistributedDataParallel(module, zero_optimizer=opt)``) DDP reduces each bucket only to the ranks owning its
elements, which accumulate their shard in ``grad_shard``; the whole gradients are dropped as soon as they are
reduced.

``offload`` (a state store, it.optim.offload) keeps the inner optimizer's state in host memory or in a file per rank.

``state_dict`` / ``load_state_dict`` use the whole layout of ``optimizer_class`` over the same parameters
(``consolidate_state_dict`` gathers it to one rank first): a checkpoint written under ZeRO loads without it,
at another number of ranks, and the reverse.

Parameters that may get no gradient (``find_unused_parameters``, a mixture of experts' experts no token reached):
the flat gradient buffers hold zeros for them, where one process leaves ``.grad`` None and AdamW skips the parameter
(no step count, no moment decay, no weight decay). A post-accumulate hook records which parameters got a gradient
since ``zero_grad``; ``step`` agrees over the group on those no rank got one for (one all-reduce of flags per
group, as DDP's reducer agrees on unused parameters) and the inner optimizer skips their pieces, so their weights
and state stay as one process leaves them, and a parameter never reached gets no state at all.

Expert parallelism (``expert_params``, ``expert_data_group``): a rank's local experts are replicated over the
expert-data group, not over ``process_group``, so they get flat spaces of their own sharded over that group, as
Megatron-Core's distributed optimizer shards expert parameters over the expert-data-parallel group (rather than kept
whole per rank: the same code as the dense spaces, with 1/(expert-data size) of the experts' state). Their gradients
are not DDP's: the caller reduces them over the expert-data group after backward (``reduce_gradients`` with
``spaces=expert_spaces``; under ZeRO-2 their whole gradients live until then). Under ZeRO-3 fully_shard already
keeps the experts in spaces sharded over the expert-data group, and reduces their gradients itself; this optimizer
steps those shards as any other (``expert_spaces`` is then empty). The expert groups and expert-data groups tile
``process_group``, so each element of every expert is owned by one rank of it and ``clip_grad_norm_``'s sum over it
counts each expert once.
"""
from __future__ import annotations

import math

import numpy as np

from ... import backend
from ...autograd.grad_mode import no_grad
from ...optim.offload import materialized
from ...tensor import Tensor
from ..grad_hooks import globally_unused

_CONSOLIDATED = "_consolidated"


class FlatSpace:
    """The parameters of one (device, dtype) in one flat buffer, and this rank's shard of it over ``group``."""

    resident = True  # every rank holds the whole flat buffer (ZeRO 1 and 2); ZeRO-3's spaces keep the shard only

    def __init__(self, params, group):
        self.lay_out(params, group.rank, group.size)
        self.group = group
        xp = self.device.array_module()
        with self.device.context():
            self.flat = xp.zeros(self.shard_size * self.world, self.dtype)
            self.flat_grad = xp.zeros(self.shard_size * self.world, self.dtype)
        for p, start in zip(params, self.offsets):
            region = self.flat[start:start + p.numel()].reshape(p.shape)
            region[...] = p.array
            p.array = region  # the parameter now views the flat buffer (its version is bumped)

    def lay_out(self, params, rank, world):
        """Offsets of ``params`` in the flat space, and the shard [lo, hi) rank ``rank`` of ``world`` owns."""
        self.params = params
        self.rank, self.world = rank, world
        self.sharded = False  # ZeRO-2: the gradients live only as this rank's shard (grad_shard)
        self.device, self.dtype = params[0].device, params[0].dtype
        self.offsets = []
        total = 0
        for p in params:
            self.offsets.append(total)
            total += p.numel()
        self.numel = total
        self.position = {id(p): k for k, p in enumerate(params)}  # by identity: == is elementwise on Tensors
        self.shard_size = max(1, math.ceil(total / world))
        self.grad_shard = None  # the reduced gradient shard, allocated on first use (ZeRO-1 never needs it)
        self.lo = min(rank * self.shard_size, total)
        self.hi = min((rank + 1) * self.shard_size, total)

    def sharded_grad(self):
        """This rank's reduced gradient shard (ZeRO-2), zero-filled on first use."""
        if self.grad_shard is None:
            with self.device.context():
                self.grad_shard = self.device.array_module().zeros(self.shard_size, self.dtype)
        return self.grad_shard

    def owned_pieces(self):
        """(param, flat start, start, stop) for each parameter's elements inside this rank's shard: elements
        [start, stop) of the flattened parameter, at ``flat start`` in the flat space."""
        for k, (p, offset) in enumerate(zip(self.params, self.offsets)):
            a, b = self.held(k)
            if a < b:
                yield p, a, a - offset, b - offset

    def held(self, k):
        """The flat range [a, b) of parameter ``k`` this rank's shard holds (empty: a >= b)."""
        offset = self.offsets[k]
        return max(offset, self.lo), min(offset + self.params[k].numel(), self.hi)

    def owner_segments(self, start, stop):
        """(rank, a, b): the part [a, b) of the flat range [start, stop) that each rank owns."""
        first, last = start // self.shard_size, (stop - 1) // self.shard_size
        for r in range(first, last + 1):
            yield r, max(start, r * self.shard_size), min(stop, (r + 1) * self.shard_size)


class ZeroRedundancyOptimizer:
    """``ZeroRedundancyOptimizer(params, optimizer_class=AdamW, process_group=None, **defaults)``: the
    optimizer ``optimizer_class(pieces, **defaults)`` runs on this rank's 1/N shard of the parameters.

    ``param_groups`` are the inner optimizer's (the same options, over the owned pieces), so learning-rate
    schedules and a GradScaler work unchanged. ``flat_order`` (e.g. ``model.parameters()``) lays the flat buffers
    out in that order instead of the param groups': DistributedDataParallel's buckets follow the flat layout, and in
    module order they fill as backward produces gradients, so their reductions overlap it.

    Use ``clip_grad_norm_`` (the norm over every rank's shard) rather than the module-level function, whose norm
    would count one shard only under ZeRO-2.

    ``find_unused_parameters``: skip the parameters that no rank got a gradient for since ``zero_grad``, as one
    process skips a ``.grad`` of None (``unused_also_over``: a further group that must agree, e.g. the tensor group
    when its ranks route different slices of the sequence); ``expert_params`` (with ``expert_data_group``):
    parameters replicated over that group instead, sharded over it (see the module docstring).
    """

    def __init__(self, params, optimizer_class=None, process_group=None, flat_order=None, find_unused_parameters=False,
                 expert_params=(), expert_data_group=None, unused_also_over=None, **defaults):
        from ... import distributed as dist
        from ...optim import AdamW

        self.optimizer_class = optimizer_class or AdamW
        self.group = process_group or dist.default_group()
        self.rank, self.world = self.group.rank, self.group.size
        groups = _as_groups(params)
        self.whole_param_groups = groups
        ordered = []
        seen = set()
        for p in list(flat_order or ()) + [p for g in groups for p in g["params"]]:
            if id(p) not in seen:
                seen.add(id(p))
                ordered.append(p)
        listed = {id(p) for g in groups for p in g["params"]}
        ordered = [p for p in ordered if id(p) in listed]
        self.params = ordered
        self.spaces = list({id(s): s for s in (p.placement.flat_shard for p in ordered) if s is not None}
                           .values())  # fully_shard's spaces (ZeRO-3): the parameters keep only their shards
        experts = {id(p) for p in expert_params}
        if experts and expert_data_group is None:
            raise ValueError("ZeroRedundancyOptimizer: expert_params need an expert_data_group, got None\nHINT: pass "
                             "the expert-data group the experts are replicated over")
        misplaced = [p for p in expert_params
                     if p.placement.flat_shard is not None and p.placement.flat_shard.group is not expert_data_group]
        if misplaced:
            raise ValueError(f"ZeroRedundancyOptimizer: expected fully_shard to shard expert_params over the "
                             f"expert_data_group, got {len(misplaced)} of them sharded over a group of "
                             f"{misplaced[0].placement.flat_shard.group.size} ranks\nHINT: fully_shard the blocks "
                             "with shard_group_fn giving the experts' expert-data group")
        whole = [p for p in ordered if p.placement.flat_shard is None]
        self.expert_spaces = []
        for expert, group in ((False, self.group), (True, expert_data_group)):
            members = [p for p in whole if (id(p) in experts) == expert]
            for key in dict.fromkeys((p.device, p.dtype) for p in members):
                space = FlatSpace([p for p in members if (p.device, p.dtype) == key], group)
                self.spaces.append(space)
                if expert:
                    self.expert_spaces.append(space)
        self._used = None  # find_unused_parameters: ids of the parameters that got a gradient since zero_grad
        self._unused_also_over = unused_also_over  # e.g. the tensor group, whose ranks route their own tokens
        if find_unused_parameters:
            self._used = set()
            self._use_hooks = [p.register_post_accumulate_grad_hook(self._mark_used) for p in ordered]
        self._attach_whole_grads()
        self.pieces = []  # (view, space, param, flat start, start, stop) for each owned piece
        group_of = {id(p): k for k, g in enumerate(groups) for p in g["params"]}
        views_by_group = [[] for _ in groups]
        for space in self.spaces:
            for p, flat_start, a, b in space.owned_pieces():
                if id(p) not in group_of:  # a sharded module's parameter this optimizer does not update
                    continue
                view = space.shard_views[id(p)] if not space.resident else self._view(p, a, b)
                self.pieces.append((view, space, p, flat_start, a, b))
                views_by_group[group_of[id(p)]].append(view)
        inner_groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": views}
                        for g, views in zip(groups, views_by_group)]
        self.optim = self.optimizer_class(inner_groups, **defaults)  # a rank may own nothing: empty groups
        self.param_groups = self.optim.param_groups
        self.defaults = self.optim.defaults
        self._point_grads()

    # -------------------------------------------------------------------------------------------- layout
    @staticmethod
    def _view(p, a, b):
        view = Tensor._make(p.array.reshape(-1)[a:b], p.device)
        view._requires_grad = True
        return view

    def _attach_whole_grads(self):
        """ZeRO-1: every parameter's .grad is a fixed view into the flat gradient buffer (zeroed, never freed)."""
        for space in self.spaces:
            if not space.resident:
                continue
            for p, start in zip(space.params, space.offsets):
                p.grad = Tensor._make(space.flat_grad[start:start + p.numel()].reshape(p.shape), p.device)

    def use_sharded_gradients(self, spaces=None):
        """ZeRO-2: the gradients of ``spaces`` (default: all) live only as this rank's shard (``grad_shard``), filled
        by DDP's reducer."""
        for space in self.spaces if spaces is None else spaces:
            space.sharded = True
            space.flat_grad = None
            for p in space.params:
                p.grad = None
        self._point_grads()

    def _point_grads(self):
        """Give each owned piece its gradient: a view into the flat gradients (ZeRO-1) or into grad_shard."""
        for view, space, p, flat_start, a, b in self.pieces:
            if space.sharded or not space.resident:
                local = flat_start - space.lo
                source = space.sharded_grad()[local:local + (b - a)]
            else:
                source = space.flat_grad[flat_start:flat_start + (b - a)]
            view.grad = Tensor._make(source, p.device)

    def reduce_gradients(self, shard, spaces=None, divide_by=None):
        """Average the accumulated whole gradients of ``spaces`` (default: all) over each one's group at once
        (pipeline runs, where no DDP reduces while backward goes on; an expert-parallel run's experts): in place in
        the flat gradient buffer (ZeRO-1), or reduce-scattered into this rank's gradient shard (ZeRO-2, as
        Megatron-LM's distributed optimizer does; the whole gradients live until then). ``divide_by``: the sum's
        divisor instead of the group size (experts: the data-parallel size, their gradients already sum the expert
        group's tokens)."""
        from ... import distributed as dist

        spaces = [s for s in (self.spaces if spaces is None else spaces) if s.resident]  # fully_shard reduced its own
        if any(space.flat_grad is None for space in spaces):
            raise RuntimeError("ZeroRedundancyOptimizer.reduce_gradients: the whole gradients were dropped by "
                               "DistributedDataParallel's ZeRO-2 reducer\nHINT: use one or the other")
        for space in spaces:
            flat = Tensor._make(space.flat_grad, space.device)
            divisor = divide_by or space.world
            if shard:
                if space.world == 1:  # the shard is the whole space: no second buffer
                    space.grad_shard = space.flat_grad
                else:
                    dist.reduce_scatter_tensor(Tensor._make(space.sharded_grad(), space.device), flat,
                                               dist.ReduceOp.SUM, group=space.group)
                space.grad_shard /= divisor
            elif divide_by is None:
                dist.all_reduce(flat, "avg", group=space.group)
            else:
                if space.world > 1:
                    dist.all_reduce(flat, dist.ReduceOp.SUM, group=space.group)
                space.flat_grad /= divisor
            for p in space.params:
                p.grad._version[0] += 1
            space.sharded = bool(shard)
        self._point_grads()

    def _mark_used(self, param):
        self._used.add(id(param))

    def _unused_pieces(self):
        """The owned pieces of the parameters no rank of their space's group (and of its replicate group: fully_shard's
        HSDP replicas, which read other batches) got a gradient for since ``zero_grad`` (one all-reduce of flags per
        group; none without find_unused_parameters)."""
        if self._used is None:
            return []
        by_group = {}  # in the spaces' order, the same on every rank
        for space in self.spaces:
            replicas = getattr(space, "replicate_group", None)
            key = (id(space.group), id(replicas))
            by_group.setdefault(key, (space.group, replicas, []))[2].extend(space.params)
        unused = set()
        for group, replicas, params in by_group.values():
            unused.update(id(params[k]) for k in globally_unused([id(p) in self._used for p in params], group,
                                                                 replicas, self._unused_also_over))
        return [view for view, _, p, *_ in self.pieces if id(p) in unused]

    def owned_grads(self):
        """(parameter, gradient of its owned piece) for each piece this rank owns; the gradients are views into
        the flat buffers, so changing them in place changes what the next ``step`` uses."""
        self._point_grads()
        return [(p, view.grad) for view, _, p, *_ in self.pieces]

    def accumulate_shard(self, space, start, values):
        """ZeRO-2: add reduced gradients for the flat range [start, start + len(values)) of this rank's shard."""
        local = start - space.lo
        space.sharded_grad()[local:local + values.shape[0]] += values

    # ------------------------------------------------------------------------------------------- stepping
    def zero_grad(self, set_to_none=True):
        """Zero the gradients (flat buffers are zeroed in place, never freed, whatever ``set_to_none``)."""
        if self._used is not None:
            self._used.clear()
        for space in self.spaces:
            if space.grad_shard is not None:
                space.grad_shard[...] = 0
            if space.flat_grad is not None:
                space.flat_grad[...] = 0
                for p in space.params:
                    p.grad._version[0] += 1

    @no_grad()
    def step(self, closure=None):
        """Step this rank's shard (with find_unused_parameters, not the parameters no rank got a gradient for), then
        all-gather every rank's updated shard into the flat parameters."""
        loss = self.optim._evaluate_closure(closure)
        self._point_grads()
        unused = self._unused_pieces()
        for view in unused:
            view.grad = None  # skipped by the inner optimizer, as one process skips a parameter whose .grad is None
        self.optim.step()
        if unused:
            self._point_grads()
        self.all_gather_parameters()
        return loss

    def all_gather_parameters(self):
        from ... import distributed as dist

        works = []
        for space in self.spaces:
            if not space.resident:  # gathered by fully_shard when its module runs next
                continue
            flat = Tensor._make(space.flat, space.device)
            mine = Tensor._make(space.flat[space.rank * space.shard_size:(space.rank + 1) * space.shard_size],
                                space.device)
            works.append(dist.all_gather_into_tensor(flat, mine, group=space.group, async_op=True))
        for work in works:
            work.wait()
        for space in self.spaces:
            if space.resident:
                for p in space.params:
                    p._version[0] += 1

    @no_grad()
    def clip_grad_norm_(self, max_norm, norm_type=2.0, tensor_group=None, pipeline_group=None):
        """Scale every rank's gradient shard so that the global norm is at most ``max_norm``; returns the
        global norm (over the whole model) as a 0-d float32 tensor, the same on every rank.

        The parameters may also be split over a ``tensor_group`` (a parameter placed as a tensor shard counts its
        shard on every rank of it, a replicated one only on tensor rank 0) and a ``pipeline_group`` (each stage counts
        its own; the last stage's copy of a tied weight, placed as a ``tied_copy``, does not count)."""
        self._point_grads()
        pieces = [view.grad.array for view, *_ in self.pieces]
        skip_replicated = tensor_group is not None and tensor_group.rank != 0
        counted = [g for g, (_, _, p, *_) in zip(pieces, self.pieces)
                   if not p.placement.tied_copy and not (skip_replicated and p.placement.replicated)]
        groups = [self.group] + [g for g in (tensor_group, pipeline_group) if g is not None and g.size > 1]
        return clip_sharded_grads_(pieces, counted, max_norm, norm_type, groups)

    # ---------------------------------------------------------------------------------------- state dicts
    def state_bytes(self):
        """Bytes of optimizer state this rank holds beside its parameters (the inner optimizer's arrays)."""
        return self.optim.state_bytes()

    def offloaded_bytes(self):
        """Bytes of this rank's optimizer state offloaded (``offload=``: to a file, or to host memory)."""
        return self.optim.offloaded_bytes()

    @property
    def state_store(self):
        return self.optim.state_store

    def grad_bytes(self):
        """Bytes of gradient storage: the flat gradient buffers and this rank's gradient shards."""
        held = lambda array: 0 if array is None else array.nbytes  # noqa: E731  (freed or not yet allocated)
        return sum(held(s.flat_grad) + (held(s.grad_shard) if s.grad_shard is not s.flat_grad else 0)
                   for s in self.spaces)

    def _state_keys(self):
        """The names of the array entries of the inner optimizer's per-parameter state (the same on every rank,
        also on a rank that owns nothing: they are AdamW's after its first step)."""
        from ... import distributed as dist

        mine = sorted({k for st in self.optim.state.values() for k, v in st.items()
                       if backend.is_array_like(v) and v.ndim})
        code = Tensor(np.frombuffer(",".join(mine).encode().ljust(256, b" "), np.uint8).copy())
        parts = [Tensor(np.zeros(256, np.uint8)) for _ in range(self.world)]
        dist.all_gather(parts, code, group=self.group)
        return sorted({k for part in parts for k in bytes(part.numpy()).decode().strip().split(",") if k})

    def consolidate_state_dict(self, to=0):
        """Gather the whole optimizer state to rank ``to`` (collective: every rank calls it)."""
        setattr(self, _CONSOLIDATED, (to, self._gather_state(to)))

    def state_dict(self):
        """The whole state dict (``optimizer_class``'s layout over all parameters); after
        ``consolidate_state_dict`` on the rank it was gathered to, or at any time in a world of one."""
        consolidated = getattr(self, _CONSOLIDATED, None)
        if consolidated is None and self.world == 1:
            return self._gather_state(0)
        if consolidated is None or consolidated[0] != self.rank:
            raise RuntimeError(f"ZeroRedundancyOptimizer.state_dict: rank {self.rank} holds only a shard of the "
                               "optimizer state\nHINT: call consolidate_state_dict(to=r) on every rank first, then "
                               "state_dict() on rank r")
        delattr(self, _CONSOLIDATED)
        return consolidated[1]

    def whole_states(self, build=True):
        """{id(parameter): its whole state in ``optimizer_class``'s layout (arrays, ``step`` an int)} of every
        parameter that has state, gathered over each space's group (collective: every rank calls it; a rank that
        does not ``build`` gets {})."""
        from ... import distributed as dist

        keys = self._state_keys()
        out = {}
        for space in self.spaces:
            # each parameter's step (-1: state without one, -2: no state); the maximum over the group is its owners'
            codes = np.full(len(space.params), -2, np.int64)
            for view, sp, p, *_ in self.pieces:
                st = self.optim.state.get(view)
                if sp is space and st:
                    codes[space.position[id(p)]] = st.get("step", -1)
            codes = Tensor(codes)
            if space.world > 1:
                dist.all_reduce(codes, dist.ReduceOp.MAX, group=space.group)
            full = {}  # key -> the whole flat array
            for key in keys:
                xp = space.device.array_module()
                with space.device.context():
                    flat = xp.zeros(space.shard_size * space.world, space.dtype)
                mine = flat[space.rank * space.shard_size:(space.rank + 1) * space.shard_size]
                for view, sp, _, flat_start, a, b in self.pieces:
                    st = self.optim.state.get(view)
                    if sp is space and st and key in st:
                        local = flat_start - space.rank * space.shard_size
                        mine[local:local + (b - a)] = backend.to_device_array(materialized(st[key]), space.device)
                dist.all_gather_into_tensor(Tensor._make(flat, space.device), Tensor._make(mine, space.device),
                                            group=space.group)
                full[key] = flat
            if not build:
                continue
            for p, start, code in zip(space.params, space.offsets, codes.numpy()):
                if code == -2:
                    continue
                entry = {} if code == -1 else {"step": int(code)}
                for key in keys:
                    entry[key] = full[key][start:start + p.numel()].reshape(p.shape).copy()
                out[id(p)] = entry
        return out

    def _gather_state(self, to):
        from ...optim.param_groups import numbering, packed_groups

        whole = self.whole_states(build=self.rank == to or self.world == 1)
        index = numbering(self.whole_param_groups, order=self.params)  # (ZeRO's numbering: the flat order)
        device = {id(p): p.device for p in self.params}
        state = {index[key]: {k: Tensor._make(v, device[key]) if backend.is_array_like(v) else v
                              for k, v in entry.items()}
                 for key, entry in whole.items() if key in index}
        groups = packed_groups(self.whole_param_groups, index, options=self.optim.param_groups)
        return {"state": state, "param_groups": groups}

    @no_grad()
    def load_state_dict(self, state_dict):
        """Load a whole state dict (from this optimizer, or ``optimizer_class`` without ZeRO, at any number
        of ranks): each rank keeps its shard."""
        from ...optim.param_groups import group_sizes, numbering, packed_groups, paired, saved_entry

        saved_sizes, own_sizes = group_sizes(state_dict["param_groups"]), group_sizes(self.whole_param_groups)
        if saved_sizes != own_sizes:
            raise ValueError(f"ZeroRedundancyOptimizer.load_state_dict: the saved param groups hold {saved_sizes} "
                             f"parameters, this optimizer's hold {own_sizes}\nHINT: build the optimizer over the same "
                             "model with the same param groups as the one that was saved")
        saved_of = {}  # id(param) -> its saved state
        for i, p in paired(state_dict["param_groups"], self.whole_param_groups).items():
            st = saved_entry(state_dict["state"], i)
            if st is not None:
                saved_of[id(p)] = st
        inner_state = {}
        for view, _, p, _, a, b in self.pieces:
            saved = saved_of.get(id(p))
            if saved is None:
                continue
            entry = {}
            for key, value in saved.items():
                if isinstance(value, Tensor):
                    value = value.array
                if backend.is_array_like(value) and value.ndim:
                    flat = backend.to_device_array(value, backend.CPU).reshape(-1)[a:b]
                    entry[key] = Tensor(flat.astype(p.dtype), device=p.device)
                else:
                    entry[key] = value
            inner_state[len(inner_state)] = (view, entry)
        index = numbering(self.optim.param_groups)
        groups = packed_groups(self.optim.param_groups, index, options=[
            {**g, **saved} for g, saved in zip(self.optim.param_groups, state_dict["param_groups"])])
        self.optim.load_state_dict({"state": {index[id(v)]: e for v, e in inner_state.values()},
                                    "param_groups": groups})

    def __repr__(self):
        return f"ZeroRedundancyOptimizer(rank {self.rank} of {self.world}, {self.optim!r})"


@no_grad()
def clip_sharded_grads_(grads, counted, max_norm, norm_type, groups):
    """Scale ``grads`` (arrays: the pieces of the gradients this rank holds) so that the norm of the whole model's
    gradients is at most ``max_norm``; ``counted``: the pieces that count towards it on this rank (each element
    counted once over ``groups``, whose sums or maxima give the whole norm). Returns the norm as a 0-d float32
    tensor, the same on every rank."""
    from ... import distributed as dist

    norm_type = float(norm_type)
    if norm_type == math.inf:
        local = max((float(abs(g).max()) for g in counted if g.size), default=0.0)
        total = Tensor(np.array([local], np.float64))
        for group in groups:
            dist.all_reduce(total, dist.ReduceOp.MAX, group=group)
        norm = float(total.numpy()[0])
    else:
        local = sum(float((abs(g.astype(np.float64) if g.dtype.itemsize < 8 else g) ** norm_type).sum())
                    for g in counted)
        total = Tensor(np.array([local], np.float64))
        for group in groups:
            dist.all_reduce(total, dist.ReduceOp.SUM, group=group)
        norm = float(total.numpy()[0]) ** (1.0 / norm_type)
    coef = float(np.float32(max_norm) / (np.float32(norm) + np.float32(1e-6)))  # torch's formula
    if not coef >= 1.0:  # below 1, or nan (a nan norm turns the gradients nan, as in torch)
        for g in grads:
            g *= coef
    return Tensor(np.array(norm, np.float32))


def _as_groups(params):
    params = list(params)
    if not params:
        raise ValueError("ZeroRedundancyOptimizer: got an empty parameter list")
    if isinstance(params[0], dict):
        return [dict(g, params=list(g["params"])) for g in params]
    return [{"params": params}]
