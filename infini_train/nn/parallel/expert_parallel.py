"""Expert parallelism for ``it.nn.MoE``: the experts are split over an expert group of E ranks, each token is sent
to the rank holding its expert and the result comes back (Megatron-Core's all-to-all token dispatcher).

    expert_parallel(moe, group)     in place: group rank r keeps experts [r * n / E, (r + 1) * n / E)

Names. ``moe.experts`` becomes a ``ModuleDict`` keyed by the global expert index, holding only this rank's experts,
so the state dict names (``experts.{global index}.gate_proj.weight``, ...) are the one-process names: a rank's state
dict is the one-process state dict less the other ranks' experts. ``whole_expert_state_dict`` gathers every expert
over the group (checkpoints, consolidation); ``shard_expert_state_dict`` keeps this rank's part of a whole one.

Forward on each rank (every rank of the group calls it: it holds collectives):
  1. route its own tokens (the router and any shared expert are replicated) and sort the assignments by expert;
  2. exchange the per-expert counts: one small ``all_to_all_single`` in which every rank sends its count vector to
     every rank, so each knows every rank's counts (E x num_experts integers);
  3. dispatch the sorted rows with the autograd ``all_to_all`` (rank j gets the rows of its experts), regroup them by
     local expert (expert, then source rank, then token: the one-process order over the group's tokens), run each
     local expert once over its contiguous rows (nn/moe.py's ``run_experts``), undo the regrouping, send the
     results back with the inverse ``all_to_all``, weight them and add them at their tokens (``combine``).
Gradients flow back through the same exchanges (every rank's backward joins both, even one without tokens; the
layer's input must require a gradient on every rank of the group or on none, as in any model), so a local expert's
gradient sums the contributions of every token of the expert group routed to it, and the input and router gradients
are those of this rank's tokens.

Capacity. With ``capacity_factor`` the capacity is the one-process layer's over the group's tokens in rank order:
C = ceil(capacity_factor * group tokens * top_k / num_experts), and expert e keeps its first C assignments counting
rank 0's tokens first; the counts exchange gives every rank what the earlier ranks routed, so the outputs equal the
one-process layer's on the concatenation of the group's tokens.

Metrics after each forward: ``tokens_per_expert`` (the assignments each local expert processed, from every rank),
``group_tokens_per_expert`` (every expert, over the group), ``dropped_tokens`` (this rank's assignments dropped for
capacity), ``all_to_all_bytes`` (bytes this rank sent to other ranks in the forward: the counts exchange, the tokens
and the results; the backward sends as many again, the other way). ``aux_loss`` is this rank's tokens' loss.

What a training loop reduces (``expert_groups`` builds the groups): the local experts' parameters
(``expert_parameters(model)``) must be left out of DDP over the data group; their
gradients are summed over the expert-data group (the ranks holding the same experts) and divided by the data size,
as ``all_reduce_expert_grads`` does -- each already sums the E ranks' tokens, so this equals DDP's average over all
data ranks. Everything else (router, shared experts, attention, embeddings) is averaged over the data group as usual.
"""
from __future__ import annotations

import numpy as np

from ... import backend
from ...autograd.grad_mode import no_grad
from ...placement import place
from ...tensor import Tensor
from ..containers import ModuleDict
from ..moe import MoE, combine, keep_within_capacity, run_experts, sort_by_expert
from .all_to_all import all_to_all
from .tensor_parallel import all_reduce_grads_where_any


class ExpertParallelDispatch:
    """The token dispatcher of an expert-parallel ``MoE`` (its ``token_dispatcher``): see the module docstring."""

    def __init__(self, group, num_experts):
        self.group, self.size, self.rank = group, group.size, group.rank
        self.num_local = num_experts // self.size
        self.first = self.rank * self.num_local

    @property
    def local_experts(self):
        return range(self.first, self.first + self.num_local)

    def _all_counts(self, routed, xp):
        """(E, num_experts) int64 on the host: row j is group rank j's routed counts (one all_to_all_single)."""
        send = xp.tile(routed.astype(xp.int64), self.size)
        recv = xp.empty_like(send)
        self.group.all_to_all_single(recv, send, None, None)
        return backend.to_device_array(recv, backend.CPU).reshape(self.size, -1)

    def __call__(self, moe, x, weights, indices):
        n, k, dim = x.shape[0], moe.top_k, x.shape[-1]
        device = x.device
        xp = device.array_module()
        ids = indices.array.reshape(-1)
        order, routed = sort_by_expert(xp, ids, moe.num_experts)
        counts = self._all_counts(routed, xp)                  # counts[j, e]: assignments of rank j to expert e
        kept = counts
        capacity = moe.capacity(int(counts.sum()) // k)         # over the group's tokens
        if capacity is not None:
            before = np.cumsum(counts, axis=0) - counts        # assignments to e on the lower ranks
            kept = np.clip(capacity - before, 0, counts)
            order, _ = keep_within_capacity(xp, ids, order, routed, capacity,
                                            backend.to_device_array(before[self.rank], device))
        local = slice(self.first, self.first + self.num_local)
        send = kept[self.rank].reshape(self.size, self.num_local).sum(1)  # rows to each rank
        from_rank = kept[:, local]                              # (E, L): rows from rank j for local expert l
        recv = from_rank.sum(1)
        rows = x.index_select(0, Tensor._make(order // k, device))
        got = all_to_all(rows, recv, send, self.group)
        regroup = _by_expert(from_rank)
        per_expert = from_rank.sum(0)
        if not per_expert.sum():  # no row for any local expert: nothing to run or send back, but in the dtype the
            # experts give on the other ranks (autocast's), as every rank's buffers of the exchange must agree
            with no_grad():
                dtype = moe.experts[str(self.first)](got).dtype
            y = got.to(dtype)
        else:
            idx = Tensor._make(backend.to_device_array(regroup, device), device)
            y = run_experts([moe.experts[str(e)] for e in self.local_experts], got.index_select(0, idx), per_expert)
            y = y.index_select(0, Tensor._make(backend.to_device_array(np.argsort(regroup), device), device))
        back = all_to_all(y, send, recv, self.group)
        moe.tokens_per_expert = per_expert.astype(np.int64)
        moe.group_tokens_per_expert = kept.sum(0).astype(np.int64)
        moe.dropped_tokens = int(n * k - kept[self.rank].sum())
        moe.local_load = kept[self.rank].astype(np.int64)  # this rank's tokens' assignments each expert processed
        moe.all_to_all_bytes = int((self.size - 1) * counts.shape[1] * 8
                                   + (send.sum() - send[self.rank]) * dim * x.array.dtype.itemsize
                                   + (recv.sum() - recv[self.rank]) * dim * y.array.dtype.itemsize)
        # ``back`` is used even when it has no row, so that every rank's backward joins both exchanges
        return combine(x, back, weights, order, k), routed


def _by_expert(from_rank):
    """The permutation that reorders rows received rank-major (rank j's block holds its rows for local experts
    0..L-1 in turn) to expert-major (expert l's rows from ranks 0..E-1 in turn)."""
    starts = (np.cumsum(from_rank.reshape(-1)) - from_rank.reshape(-1)).reshape(from_rank.shape)
    size, num_local = from_rank.shape
    parts = [np.arange(starts[j, e], starts[j, e] + from_rank[j, e]) for e in range(num_local) for j in range(size)]
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)


def expert_parallel(moe, group):
    """Split ``moe``'s experts over ``group`` in place (group rank r keeps experts [r * n / E, (r + 1) * n / E),
    the others are freed) and dispatch its tokens with all-to-all; returns ``moe``. See the module docstring."""
    if moe.token_dispatcher is not None:
        raise ValueError("expert_parallel: this MoE is already expert-parallel\nHINT: apply the plan once")
    size, n = group.size, moe.num_experts
    if n % size:
        raise ValueError(f"expert_parallel: num_experts ({n}) must be divisible by the expert-parallel size ({size})"
                         f"\nHINT: choose parallel.expert among the divisors of {n}")
    dispatch = ExpertParallelDispatch(group, n)
    local = ModuleDict()
    for e in dispatch.local_experts:
        local[str(e)] = moe.experts[e]
        for p in local[str(e)].parameters():
            place(p, expert_local=True)  # a different expert on each rank of the group (gradient norms count each)
    moe.experts = local  # the other experts are no longer referenced: freed
    moe.token_dispatcher = dispatch
    moe.group_tokens_per_expert, moe.all_to_all_bytes = None, 0
    return moe


def expert_layers(model):
    """(name, MoE) of every expert-parallel MoE layer of ``model``."""
    return [(name, m) for name, m in model.named_modules()
            if isinstance(m, MoE) and isinstance(m.token_dispatcher, ExpertParallelDispatch)]


def expert_parameters(model):
    """The parameters of the local experts of ``model``'s expert-parallel layers (reduced over the expert-data group,
    not by DDP), in ``model.parameters()`` order."""
    ids = {id(p) for _, moe in expert_layers(model) for p in moe.experts.parameters()}
    return [p for p in model.parameters() if id(p) in ids]


def all_reduce_expert_grads(model, expert_data_group, data_size):
    """Sum the local experts' gradients over ``expert_data_group`` and divide by ``data_size`` (the data-parallel
    size, E x the expert-data size): DDP's average over every data rank for weights that already sum the expert
    group's tokens."""
    params = expert_parameters(model)
    # an expert no token of this expert group reached may have got some elsewhere
    all_reduce_grads_where_any(params, expert_data_group)
    grads = [p.grad for p in params if p.grad is not None]
    with no_grad():
        for g in grads:
            g.array[...] /= data_size
            g._version[0] += 1


def whole_expert_state_dict(model, group):
    """``model.state_dict()`` with every expert of every expert-parallel layer gathered over ``group`` (the expert
    group; every rank calls it), each layer's experts in index order: the one-process state dict."""
    own = model.state_dict()
    gathered = {}  # the layer's stem ("mlp.experts.") -> [(name, tensor)] for every expert of the group
    for prefix, moe in expert_layers(model):
        d, stem = moe.token_dispatcher, expert_stem(prefix)
        entries = {}  # global expert index -> [(name, tensor)] in the expert's state dict order
        for slot, e in enumerate(d.local_experts):
            for key, t in moe.experts[str(e)].state_dict().items():
                parts = [Tensor._make(t.array.copy(), t.device) for _ in range(d.size)]
                group.all_gather(parts, t)
                for j, part in enumerate(parts):
                    index = j * d.num_local + slot
                    entries.setdefault(index, []).append((f"{stem}{index}.{key}", part))
        gathered[stem] = [item for e in sorted(entries) for item in entries[e]]
    out = type(own)()
    for name, t in own.items():
        stem = next((s for s in gathered if name.startswith(s)), None)
        if stem is None:
            out[name] = t
        elif gathered[stem] is not None:  # the layer's first expert entry: all its experts, in order
            out.update(gathered[stem])
            gathered[stem] = None
    return out


def expert_stem(prefix):
    """The state-dict prefix of the experts of the MoE layer named ``prefix`` ("layers.3.mlp.experts.")."""
    return f"{prefix}.experts." if prefix else "experts."


def shard_expert_state_dict(model, whole_state):
    """This rank's part of a whole (one-process) state dict: the entries of other ranks' experts dropped."""
    drop = set()
    for prefix, moe in expert_layers(model):
        stem = expert_stem(prefix)
        mine = {str(e) for e in moe.token_dispatcher.local_experts}
        drop.update(k for k in whole_state if k.startswith(stem) and k[len(stem):].split(".", 1)[0] not in mine)
    return type(whole_state)((k, v) for k, v in whole_state.items() if k not in drop)


__all__ = ["expert_parallel", "ExpertParallelDispatch", "expert_parameters", "all_reduce_expert_grads",
           "whole_expert_state_dict", "shard_expert_state_dict", "expert_layers", "expert_stem"]
