"""DeepSeek-MoE routing (DeepSeek-V3): a sigmoid router with the auxiliary-loss-free correction bias and group-limited
top-k, the MoE layer with its shared experts, the sequence-wise balance loss and the bias update, computing what
Hugging Face's ``DeepseekV3TopkRouter`` / ``DeepseekV3MoE`` compute (transformers.models.deepseek_v3).

    router = DeepSeekRouter(dim, num_experts, top_k, n_group=1, topk_group=1, norm_topk_prob=True,
                            routed_scaling_factor=1.0, bias_update_rate=1e-3)
    moe = DeepSeekMoE(dim, moe_intermediate_size, num_experts, top_k, n_shared_experts=1, n_group=1, topk_group=1,
                      norm_topk_prob=True, routed_scaling_factor=1.0, bias_update_rate=1e-3, seq_aux_loss_alpha=0.0)
    y = moe(x)                      # (B, T, dim) or (N, dim) -> the same shape

Names are HF's checkpoint names: ``gate.weight`` (num_experts, dim), ``gate.e_score_correction_bias`` (num_experts,;
a persistent buffer, not a parameter: saved, loaded and resharded with the model's state, never seen by the
optimizer), ``experts.{i}.gate_proj / up_proj / down_proj``, ``shared_experts.gate_proj / up_proj / down_proj``
(the n_shared_experts fused into one SwiGLU of n_shared_experts * moe_intermediate_size).

Routing (per token): logits = x @ gate.weight.T in float32 (float64 for float64 inputs; autocast off, DeepSeek's
float32 gate), scores = sigmoid(logits). The choice uses scores + e_score_correction_bias: the experts are split into
``n_group`` consecutive groups, each scored by the sum of its two largest biased scores, the ``topk_group`` best
groups kept, and the ``top_k`` largest biased scores among their experts chosen (ties: lowest index first). The
weights are the chosen *unbiased* scores, divided by their sum (+1e-20) when ``norm_topk_prob``, times
``routed_scaling_factor``, cast to the input dtype. The choice is made outside the graph (xp arrays), so the bias
gets no gradient; the weights carry it to the gate and the input.

Everything else is ``MoE``'s (nn/moe.py): dropless or capacity-limited dispatch, expert parallelism (the dispatcher
takes the chosen indices and the unbiased weights), ``router_logits`` / ``router_probs`` (the sigmoid scores) /
``router_indices`` / ``routed_counts``, ``tokens_per_expert``, and ``expert_load`` below.

The auxiliary-loss-free balance (DeepSeek-V3 sec. 2.1.2; Megatron-Core's ``moe_router_enable_expert_bias``): each
training forward (grad enabled) adds the assignments each expert processed to ``expert_load`` (an int64 NumPy
array, this rank's tokens); after the step, ``update_expert_biases`` (models/expert_bias.py sums the loads over the
ranks) sets bias += rate * sign(mean load - load) per layer (``updated_expert_bias``) and zeroes the loads.
``bias_update_rate`` None or 0: the bias is left alone.

The sequence-wise balance loss (DeepSeek-V3 eqs. 17-20, as Megatron's ``seq_aux_loss``), with
``seq_aux_loss_alpha`` > 0: per sequence of T tokens, f_i = E / (top_k T) * (tokens choosing expert i),
P_i = mean over the tokens of s_i / sum_j s_j (the unbiased scores normalised over all experts); the loss is
alpha * sum_i f_i P_i, averaged over the sequences (the rows of a (B, T, dim) input; one sequence for (N, dim)).
``seq_aux_loss`` holds it after each forward (0-d, in the graph) and ``router_loss`` includes it. A causal LM
(models/moe_lm.py's MoECausalLM, its config holding ``seq_aux_loss_alpha``) adds alpha times the sum over its layers,
computed from each layer's ``router_probs`` / ``router_indices`` / ``sequences`` (with sequence parallelism, each
tensor rank's part over its slices of the sequences, the counts summed over the group). Padding rows count as tokens
(as in Megatron-Core).
"""
from __future__ import annotations

import math

import numpy as np

from ..autograd.autocast import autocast
from ..autograd.grad_mode import is_grad_enabled
from ..promotion import promote_types
from ..tensor import Tensor
from . import functional as F
from . import init
from .layers import _param
from .moe import MoE, RouterOutput, SwiGLU
from .module import Module

__all__ = ["DeepSeekRouter", "DeepSeekMoE", "group_limited_topk", "sequence_balance_loss", "updated_expert_bias"]


def _router_dtype(dtype):
    return promote_types(np.dtype("float32"), dtype)


def group_limited_topk(xp, choice, n_group, topk_group, top_k):
    """(N, top_k) int64 expert ids: among the ``topk_group`` groups (of ``n_group`` consecutive ones) whose two
    largest ``choice`` scores sum highest, the ``top_k`` largest scores, highest first; ties go to the lower index
    (groups and experts alike). ``choice``: (N, E) xp array."""
    n, num_experts = choice.shape
    grouped = choice.reshape(n, n_group, num_experts // n_group)
    top2 = xp.sort(grouped, axis=-1)[..., -2:]
    group_scores = top2[..., 0] + top2[..., 1]                              # HF: topk(2)[0].sum(-1)
    groups = _stable_top(xp, group_scores, topk_group)
    keep = xp.zeros((n, n_group), dtype=bool)
    keep[xp.arange(n)[:, None], groups] = True
    masked = xp.where(xp.repeat(keep, num_experts // n_group, axis=1), choice, -xp.inf)
    return _stable_top(xp, masked, top_k)


def _stable_top(xp, a, k):
    """The indices of the ``k`` largest of each row of ``a``, highest first, equal ones lowest index first."""
    order = xp.argsort(xp.flip(a, 1), axis=1, kind="stable")
    return (a.shape[1] - 1 - xp.flip(order, 1))[:, :k].astype(np.int64)


class DeepSeekRouter(Module):
    """DeepSeek-V3's top-k router (see the module docstring). ``forward`` takes (..., dim) and returns a
    ``RouterOutput``: logits (N, E) float32 (float64 for float64 inputs), probs = the sigmoid scores, weights
    (N, top_k) in the input dtype, indices (N, top_k) int64 (highest biased score first)."""

    def __init__(self, dim, num_experts, top_k, n_group=1, topk_group=1, norm_topk_prob=True,
                 routed_scaling_factor=1.0, bias_update_rate=1e-3, device=None, dtype=None):
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"DeepSeekRouter: top_k must be in [1, num_experts={num_experts}], got {top_k}")
        if n_group < 1 or num_experts % n_group or num_experts // n_group < 2:
            raise ValueError(f"DeepSeekRouter: n_group must divide num_experts ({num_experts}) into groups of at "
                             f"least 2 experts (each group is scored by its two best), got n_group={n_group}\n"
                             f"HINT: n_group=1 routes over all experts at once")
        if not 1 <= topk_group <= n_group or top_k > topk_group * (num_experts // n_group):
            raise ValueError(f"DeepSeekRouter: topk_group must be in [1, n_group={n_group}] and keep at least top_k "
                             f"({top_k}) experts, got topk_group={topk_group}")
        if bias_update_rate is not None and not bias_update_rate >= 0:
            raise ValueError(f"DeepSeekRouter: bias_update_rate must be >= 0 or None, got {bias_update_rate!r}")
        self.dim, self.num_experts, self.top_k = int(dim), int(num_experts), int(top_k)
        self.n_group, self.topk_group = int(n_group), int(topk_group)
        self.norm_topk_prob, self.routed_scaling_factor = bool(norm_topk_prob), float(routed_scaling_factor)
        self.bias_update_rate = bias_update_rate
        self.weight = _param(num_experts, dim, device=device, dtype=dtype)
        bias = _param(num_experts, device=device, dtype=_router_dtype(self.weight.dtype))
        self.register_buffer("e_score_correction_bias", Tensor._make(bias.array, bias.device))
        self.reset_parameters()

    def reset_parameters(self):
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        init.zeros_(self.e_score_correction_bias)

    def forward(self, x):
        x = x.reshape(-1, self.dim)
        dtype = _router_dtype(x.dtype)
        with autocast(x.device.type, enabled=False):
            logits = F.linear(x.to(dtype), self.weight.to(dtype))
        scores = F.sigmoid(logits)
        xp = x.device.array_module()
        choice = scores.array + self.e_score_correction_bias.array.astype(dtype)
        with x.device.context():
            indices = group_limited_topk(xp, choice, self.n_group, self.topk_group, self.top_k)
        indices = Tensor._make(indices, x.device)
        weights = scores.gather(1, indices)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        weights = weights * self.routed_scaling_factor
        return RouterOutput(logits, scores, weights.to(x.dtype), indices)

    def extra_repr(self):
        return (f"{self.dim}, num_experts={self.num_experts}, top_k={self.top_k}, n_group={self.n_group}, "
                f"topk_group={self.topk_group}, norm_topk_prob={self.norm_topk_prob}, "
                f"routed_scaling_factor={self.routed_scaling_factor}, bias_update_rate={self.bias_update_rate}")


def sequence_balance_loss(scores, indices, sequences, top_k, group=None):
    """DeepSeek-V3's sequence-wise balance loss before alpha: the mean over ``sequences`` equal runs of rows of
    sum_i f_i P_i, f_i = E / (top_k T) * (rows choosing i), P_i = mean of s_i / sum_j s_j. ``scores`` (N, E) Tensor,
    ``indices`` (N, top_k) Tensor; N = sequences * T. ``group``: the ranks holding the other slices of the same
    sequences (sequence parallelism): the counts are summed over it and T is the whole length, so this rank's
    result is its part, and the parts of the group sum to the loss over the whole sequences."""
    n, num_experts = scores.shape
    length = n // sequences
    xp = scores.device.array_module()
    with scores.device.context():
        chosen = xp.zeros((n, num_experts), scores.dtype)
        chosen[xp.arange(n)[:, None], indices.array] = 1
        counts = chosen.reshape(sequences, length, num_experts).sum(1)
    whole = length
    if group is not None and group.size > 1:
        total = Tensor._make(counts, scores.device)
        group.all_reduce(total)
        counts, whole = total.array, length * group.size
    f = Tensor._make(counts * (num_experts / (top_k * whole)), scores.device)
    p = (scores / (scores.sum(dim=-1, keepdim=True) + 1e-20)).reshape(sequences, length, num_experts).sum(1) / whole
    return (p * f).sum(-1).mean()


def updated_expert_bias(bias, load, rate):
    """bias + rate * sign(mean(load) - load) along the last axis (Megatron-Core's get_updated_expert_bias), for xp
    arrays; ``load``: the assignments per expert over the step and every rank (any scale: only the sign counts)."""
    load = load.astype(np.float64)
    offset = load.mean(axis=-1, keepdims=True) - load
    return (bias + rate * np.sign(offset)).astype(bias.dtype)


class DeepSeekMoE(MoE):
    """DeepSeek-V3's MoE layer (HF's DeepseekV3MoE): ``MoE`` with a ``DeepSeekRouter`` as ``gate`` and
    ``n_shared_experts`` fused into ``shared_experts`` (one SwiGLU of n_shared_experts * hidden_dim, ungated),
    added to every token. See the module docstring for the arguments and what it holds after a forward."""

    def __init__(self, dim, hidden_dim, num_experts, top_k, n_shared_experts=1, n_group=1, topk_group=1,
                 norm_topk_prob=True, routed_scaling_factor=1.0, bias_update_rate=1e-3, seq_aux_loss_alpha=0.0,
                 capacity_factor=None, device=None, dtype=None):
        super().__init__(dim, hidden_dim, num_experts, top_k, norm_topk_prob, capacity_factor=capacity_factor,
                         device=device, dtype=dtype)
        if not seq_aux_loss_alpha >= 0:
            raise ValueError(f"DeepSeekMoE: seq_aux_loss_alpha must be >= 0, got {seq_aux_loss_alpha!r}")
        self.gate = DeepSeekRouter(dim, num_experts, top_k, n_group, topk_group, norm_topk_prob,
                                   routed_scaling_factor, bias_update_rate, device=device, dtype=dtype)
        self.n_shared_experts = int(n_shared_experts)
        if self.n_shared_experts:
            self.shared_experts = SwiGLU(dim, self.n_shared_experts * hidden_dim, device=device, dtype=dtype)
        self.seq_aux_loss_alpha = float(seq_aux_loss_alpha)
        self.seq_aux_loss, self.sequences = None, 1  # (sequences: the rows of the last (B, T, dim) input)
        self.expert_load = np.zeros(num_experts, np.int64)

    @property
    def router_loss(self):
        """aux_loss_coef * aux_loss + z_loss_coef * z_loss + seq_aux_loss_alpha * seq_aux_loss (None before)."""
        loss = super().router_loss
        if loss is None or not self.seq_aux_loss_alpha:
            return loss
        return loss + self.seq_aux_loss * self.seq_aux_loss_alpha

    def shared_output(self, flat):
        return self.shared_experts(flat) if self.n_shared_experts else None

    def forward(self, x):
        out = super().forward(x)
        if is_grad_enabled():  # a training forward (not evaluation, sampling or a recomputation under no_grad)
            self.expert_load += self.local_load
        self.sequences = x.shape[0] if len(x.shape) == 3 else 1
        if self.seq_aux_loss_alpha:
            self.seq_aux_loss = sequence_balance_loss(self.router_probs, self.router_indices, self.sequences,
                                                      self.top_k)
        return out

    def extra_repr(self):
        return super().extra_repr() + f", n_shared_experts={self.n_shared_experts}"
