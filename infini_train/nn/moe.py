"""Mixture of experts: a top-k ``Router`` and the ``MoE`` layer of SwiGLU experts, computing what Hugging Face's
``MixtralSparseMoeBlock`` and ``Qwen3MoeSparseMoeBlock`` compute (and Qwen2-MoE's shared expert).

Names are the checkpoints' names, so HF weights load as they are:

    gate.weight                                      the router, (num_experts, dim) (HF: mlp.gate.weight)
    experts.{i}.gate_proj / up_proj / down_proj      Qwen3-MoE's expert names; Mixtral's w1 / w3 / w2 are
                                                     gate_proj / up_proj / down_proj (block_sparse_moe -> mlp)
    shared_expert.{gate,up,down}_proj, shared_expert_gate    Qwen2-MoE's shared expert and its sigmoid gate

Routing is dropless by default: the (token, choice) pairs are sorted by expert (a stable sort, so each expert sees
its tokens in token order), every expert runs once over its contiguous rows (one matmul per projection: the
"grouped GEMM"), and the weighted outputs are added back at their tokens (index_add), so gradients reach the
input, the router and every expert that received a token. With ``capacity_factor`` an expert keeps its first
ceil(capacity_factor * tokens * top_k / num_experts) assignments in token order and drops the rest (Switch/GShard);
a dropped assignment contributes zero. The sorting bookkeeping runs on plain xp arrays, outside the graph.

Numerics follow HF: the logits come out in the input's dtype, the softmax runs in float32 (float64 stays float64,
where HF would round to float32), top-k picks the largest probabilities -- among equal ones the lowest expert index
first (torch.topk's order on ties is unspecified; this one is deterministic) -- the chosen ones are renormalised
(Mixtral always; Qwen3-MoE with ``norm_topk_prob``) and cast back to the input dtype (Qwen3-MoE; Mixtral keeps them
in float32, which differs only below float32).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .. import backend
from ..autograd.ops.joins import cat, split
from ..autograd.ops.sorting import stable_order
from ..creation import zeros
from ..promotion import promote_types
from ..tensor import Tensor
from . import functional as F
from . import init
from .containers import ModuleList
from .layers import Linear, _param
from .module import Module

__all__ = ["Router", "RouterOutput", "SwiGLU", "MoE", "load_balancing_loss", "router_statistics",
           "load_balancing_loss_from_statistics", "router_z_loss", "sort_by_expert",
           "keep_within_capacity", "run_experts", "combine"]


def _router_dtype(dtype):
    """float32, or the input's dtype where that is wider (float64)."""
    return promote_types(np.dtype("float32"), dtype)


class RouterOutput(NamedTuple):
    logits: Tensor   # (N, num_experts), the input's dtype
    probs: Tensor    # (N, num_experts), softmax in float32 (float64 for float64 inputs)
    weights: Tensor  # (N, top_k), the chosen probabilities (renormalised if asked), the input's dtype
    indices: Tensor  # (N, top_k) int64 expert ids, highest probability first


class Router(Module):
    """Top-k gate: logits = x @ weight.T (bias-free; ``weight`` is HF's ``gate.weight``), probabilities by a
    float32 softmax over the experts, the ``top_k`` largest (lowest index first on ties), renormalised to sum to 1
    when ``norm_topk_prob``, and cast back to the input dtype. ``forward`` takes (..., dim) and returns a
    ``RouterOutput`` over the N = prod(...) tokens."""

    def __init__(self, dim, num_experts, top_k, norm_topk_prob=True, device=None, dtype=None):
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"Router: top_k must be in [1, num_experts={num_experts}], got {top_k}")
        self.dim, self.num_experts, self.top_k = int(dim), int(num_experts), int(top_k)
        self.norm_topk_prob = bool(norm_topk_prob)
        self.weight = _param(num_experts, dim, device=device, dtype=dtype)
        self.reset_parameters()

    def reset_parameters(self):
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # as a bias-free nn.Linear(dim, num_experts)

    def forward(self, x):
        x = x.reshape(-1, self.dim)
        logits = F.linear(x, self.weight)
        probs = F.softmax(logits.to(_router_dtype(logits.dtype)), dim=-1)
        weights, indices = probs.topk(self.top_k, dim=-1)  # stable: equal probabilities, lowest index first
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return RouterOutput(logits, probs, weights.to(x.dtype), indices)

    def extra_repr(self):
        return f"{self.dim}, num_experts={self.num_experts}, top_k={self.top_k}, norm_topk_prob={self.norm_topk_prob}"


class SwiGLU(Module):
    """One expert: down_proj(silu(gate_proj(x)) * up_proj(x)), bias-free (HF's Qwen3MoeMLP / LlamaMLP names)."""

    def __init__(self, dim, hidden_dim, device=None, dtype=None):
        super().__init__()
        self.gate_proj = Linear(dim, hidden_dim, bias=False, device=device, dtype=dtype)
        self.up_proj = Linear(dim, hidden_dim, bias=False, device=device, dtype=dtype)
        self.down_proj = Linear(hidden_dim, dim, bias=False, device=device, dtype=dtype)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def load_balancing_loss(probs, routed_counts):
    """HF's load_balancing_loss_func for one layer without a mask (Switch eqs. 4-6): num_experts * sum over experts
    of (assignments routed to it, all top-k counted, / tokens) * (mean router probability). ``probs`` is (N, E);
    ``routed_counts`` (E,) an array of the assignments before any capacity drop (a constant: no gradient)."""
    return load_balancing_loss_from_statistics(router_statistics([probs], [routed_counts]), int(probs.shape[1]))


def router_statistics(router_probs, routed_counts, keep=None, router_indices=None):
    """What the auxiliary loss needs of some sparse layers, as one (2E + 1,) Tensor: every layer's router
    probabilities summed over its rows (E, differentiable), its top-k assignments per expert summed (E, a constant)
    and the rows (1). Statistics of different layers (pipeline stages) add up. ``keep`` (N,) bool, with the layers'
    ``router_indices``: count only those rows (the positions that are not padding, as HF's attention mask does)."""
    device = router_probs[0].device
    xp = device.array_module()
    num_experts = int(router_probs[0].shape[1])
    if keep is not None:
        weight = Tensor._make(xp.asarray(keep, router_probs[0].dtype)[:, None], device)
        router_probs = [p * weight for p in router_probs]
        routed_counts = [xp.bincount(i.array[keep].reshape(-1), minlength=num_experts) for i in router_indices]
        rows = int(keep.sum()) * len(router_probs)
    else:
        rows = sum(int(p.shape[0]) for p in router_probs)
    prob_sums = router_probs[0].sum(0)
    for probs in router_probs[1:]:
        prob_sums = prob_sums + probs.sum(0)
    with device.context():
        counts = xp.concatenate([sum(routed_counts).astype(prob_sums.dtype), xp.asarray([rows], prob_sums.dtype)])
    return cat([prob_sums, Tensor._make(counts, device)], 0)


def load_balancing_loss_from_statistics(stats, num_experts):
    """HF's load_balancing_loss_func over the layers ``stats`` sums (router_statistics): num_experts * sum over
    experts of (assignments / rows) * (mean router probability), the rows and probabilities of every layer pooled."""
    prob_sums, constants = stats[:num_experts], stats[num_experts:].detach()
    rows = constants[num_experts]
    return (prob_sums * constants[:num_experts]).sum() * num_experts / (rows * rows)


def router_z_loss(logits):
    """ST-MoE's router z-loss: the mean over tokens of logsumexp(logits)^2, in float32 (or wider)."""
    return (logits.to(_router_dtype(logits.dtype)).logsumexp(-1) ** 2).mean()


def sort_by_expert(xp, ids, num_experts):
    """The assignments ``ids`` (expert per assignment, token-major) ordered by expert, then token (a stable sort),
    and the assignments routed to each expert (xp arrays)."""
    return stable_order(xp, ids, 0, descending=False), xp.bincount(ids, minlength=num_experts)


def keep_within_capacity(xp, ids, order, routed, capacity, before=None):
    """``order`` without the assignments past each expert's first ``capacity`` in token order, and the kept counts.
    ``before`` (per expert) counts the assignments that come earlier elsewhere (on lower expert-parallel ranks)."""
    starts = xp.cumsum(routed) - routed
    place = xp.arange(order.size) - starts[ids[order]]              # place in its expert's queue
    if before is not None:
        place = place + before[ids[order]]
        kept = xp.clip(capacity - before, 0, routed)
    else:
        kept = xp.minimum(routed, capacity)
    return order[place < capacity], kept


def run_experts(experts, rows, counts):
    """Expert i over its contiguous block of ``counts[i]`` rows (one matmul per projection), the outputs
    concatenated in the same order; None when no expert has a row."""
    pieces = split(rows, [int(c) for c in counts], 0)
    outs = [expert(piece) for expert, piece, c in zip(experts, pieces, counts) if c]
    return cat(outs, 0) if outs else None


def combine(x, y, weights, order, top_k):
    """The output shaped like the tokens ``x`` (n, dim): row i of ``y`` (assignment ``order[i]``) times its router
    weight, added at its token; zeros when ``y`` is None (no expert ran)."""
    n, device = x.shape[0], x.device
    if y is None:
        return zeros(n, x.shape[-1], dtype=x.dtype, device=device)
    w = weights.reshape(-1).index_select(0, Tensor._make(order, device))
    y = y * w.unsqueeze(-1)
    tokens = Tensor._make(order // top_k, device)
    return zeros(n, y.shape[-1], dtype=y.dtype, device=device).index_add(0, tokens, y)


class MoE(Module):
    """A sparse mixture of ``num_experts`` SwiGLU experts (``hidden_dim`` wide), each token sent to its ``top_k``
    experts by a ``Router`` and the outputs summed with the router weights; optionally a dense shared expert
    (``num_shared_experts`` fused into one SwiGLU of ``shared_hidden_dim``, default num_shared_experts * hidden_dim,
    as DeepSeek fuses them) added to every token, scaled by sigmoid(shared_expert_gate(x)) when
    ``shared_expert_gate`` (Qwen2-MoE).

    ``forward(x)`` takes (B, T, dim) or (N, dim) and returns the same shape. After each forward the module holds:
    ``aux_loss`` (HF's load-balancing loss) and ``z_loss`` (router z-loss), 0-d Tensors in the graph;
    ``router_loss`` = aux_loss_coef * aux_loss + z_loss_coef * z_loss, to add to the training loss;
    ``router_logits`` (N, num_experts); ``router_probs`` (N, num_experts), ``router_indices`` (N, top_k) and
    ``routed_counts`` (an xp array: each expert's assignments before any capacity drop), from which the aux loss is
    computed (a model's loss over all its
    layers uses them: models/moe_lm.py); ``tokens_per_expert`` (a NumPy int64 array: the assignments each expert
    processed) and ``dropped_tokens`` (int: the assignments dropped for capacity; 0 when dropless)."""

    def __init__(self, dim, hidden_dim, num_experts, top_k, norm_topk_prob=True, num_shared_experts=0,
                 shared_hidden_dim=None, capacity_factor=None, aux_loss_coef=0.0, z_loss_coef=0.0,
                 shared_expert_gate=False, device=None, dtype=None):
        super().__init__()
        if capacity_factor is not None and not capacity_factor > 0:
            raise ValueError(f"MoE: capacity_factor must be positive or None (dropless), got {capacity_factor}")
        self.dim, self.hidden_dim = int(dim), int(hidden_dim)
        self.num_experts, self.top_k = int(num_experts), int(top_k)
        self.capacity_factor = capacity_factor
        self.aux_loss_coef, self.z_loss_coef = float(aux_loss_coef), float(z_loss_coef)
        self.gate = Router(dim, num_experts, top_k, norm_topk_prob, device=device, dtype=dtype)
        self.experts = ModuleList([SwiGLU(dim, hidden_dim, device=device, dtype=dtype) for _ in range(num_experts)])
        self.num_shared_experts = int(num_shared_experts)
        if self.num_shared_experts:
            shared = shared_hidden_dim or self.num_shared_experts * hidden_dim
            self.shared_expert = SwiGLU(dim, shared, device=device, dtype=dtype)
            if shared_expert_gate:
                self.shared_expert_gate = Linear(dim, 1, bias=False, device=device, dtype=dtype)
        self.aux_loss = self.z_loss = self.router_logits = self.router_probs = self.routed_counts = None
        self.router_indices = None
        self.tokens_per_expert, self.dropped_tokens = None, 0
        self.local_load = None  # the assignments of this rank's tokens each expert processed (NumPy int64)
        self.token_dispatcher = None  # None: every expert is here; else a callable (moe, x, weights, indices)

    @property
    def router_loss(self):
        """aux_loss_coef * aux_loss + z_loss_coef * z_loss of the last forward (None before the first)."""
        if self.aux_loss is None:
            return None
        return self.aux_loss * self.aux_loss_coef + self.z_loss * self.z_loss_coef

    def capacity(self, num_tokens):
        """Assignments an expert keeps: ceil(capacity_factor * tokens * top_k / num_experts); None when dropless."""
        if self.capacity_factor is None:
            return None
        return math.ceil(self.capacity_factor * num_tokens * self.top_k / self.num_experts)

    def forward(self, x):
        if x.shape[-1] != self.dim:
            raise ValueError(f"MoE: expected inputs (..., {self.dim}), got {tuple(x.shape)}\n"
                             f"HINT: the last dim is the model dim the layer was built with")
        flat = x.reshape(-1, self.dim)
        route = self.gate(flat)
        out, routed = self._dispatch(flat, route.weights, route.indices)
        shared = self.shared_output(flat)
        if shared is not None:
            out = out + shared
        self.router_logits, self.router_probs, self.routed_counts = route.logits, route.probs, routed
        self.router_indices = route.indices
        self.aux_loss = load_balancing_loss(route.probs, routed)
        self.z_loss = router_z_loss(route.logits)
        return out.reshape(*x.shape)

    def shared_output(self, flat):
        """The shared expert's output for the tokens ``flat`` (gated when ``shared_expert_gate``), or None."""
        if not self.num_shared_experts:
            return None
        shared = self.shared_expert(flat)
        if "shared_expert_gate" in self._modules:
            shared = F.sigmoid(self.shared_expert_gate(flat)) * shared
        return shared

    def _dispatch(self, x, weights, indices):
        """Sum over each token's kept choices of weight * expert(x); returns (output, routed counts as an array).
        An expert-parallel layer (nn.parallel.expert_parallel) hands this to its ``token_dispatcher``."""
        if self.token_dispatcher is not None:
            return self.token_dispatcher(self, x, weights, indices)
        n, k = x.shape[0], self.top_k
        xp = x.device.array_module()
        ids = indices.array.reshape(-1)                              # assignment a = token * k + choice
        order, routed = sort_by_expert(xp, ids, self.num_experts)
        kept = routed
        capacity = self.capacity(n)
        if capacity is not None:
            order, kept = keep_within_capacity(xp, ids, order, routed, capacity)
        counts = backend.to_device_array(kept, backend.CPU).astype(np.int64)
        self.tokens_per_expert, self.dropped_tokens = counts, int(n * k - counts.sum())
        self.local_load = counts
        rows = x.index_select(0, Tensor._make(order // k, x.device))   # gathered once, contiguous per expert
        y = run_experts(list(self.experts), rows, counts)
        return combine(x, y, weights, order, k), routed

    def extra_repr(self):
        cap = f", capacity_factor={self.capacity_factor}" if self.capacity_factor is not None else ""
        return f"dim={self.dim}, hidden_dim={self.hidden_dim}, num_experts={self.num_experts}, top_k={self.top_k}{cap}"
