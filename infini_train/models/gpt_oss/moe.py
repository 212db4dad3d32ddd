"""gpt-oss's mixture of experts, as Hugging Face's GptOssMLP computes it:

    router       logits = x W^T + b (``router.weight`` (E, dim), ``router.bias`` (E,)); the top-k logits (the lowest
                 expert first on ties) and their softmax are the chosen experts' weights
    experts      stacked, with HF's names and layouts: ``gate_up_proj`` (E, dim, 2I) whose even columns are the gate
                 and odd columns the up projection, ``gate_up_proj_bias`` (E, 2I), ``down_proj`` (E, I, dim),
                 ``down_proj_bias`` (E, dim)
    clamped SwiGLU  gate = min(gate, limit), up = clip(up, -limit, limit), (up + 1) * gate * sigmoid(alpha * gate)

The tokens are sorted by expert (nn.moe's sort_by_expert and combine, shared with the other MoE layers); each expert
runs once over its rows. For the model's load-balancing loss (models/moe_lm.py) the layer keeps what nn.MoE keeps:
``router_probs`` (the softmax over all experts, as HF's load_balancing_loss_func takes it), ``router_indices`` and
``routed_counts``. The experts stay whole on every rank (no expert parallelism: the run refuses parallel.expert)."""
from __future__ import annotations

import numpy as np

from ... import backend
from ...autograd.ops.joins import cat
from ...nn import functional as F
from ...nn import init
from ...nn.layers import _param
from ...nn.moe import combine, load_balancing_loss, sort_by_expert
from ...nn.module import Module
from ...promotion import promote_types
from ...tensor import Tensor


class GptOssRouter(Module):
    """Top-k of the biased logits, softmax over the chosen ones (HF's GptOssTopKRouter)."""

    def __init__(self, dim, num_experts, top_k):
        super().__init__()
        self.dim, self.num_experts, self.top_k = dim, num_experts, top_k
        self.weight = _param(num_experts, dim)
        self.bias = _param(num_experts)
        for p in (self.weight, self.bias):  # HF's init: both N(0, 0.02)
            init.normal_(p, std=0.02)

    def forward(self, x):
        """(logits (N, E), weights (N, k) in x's dtype, indices (N, k))."""
        logits = F.linear(x, self.weight, self.bias)
        top, indices = logits.topk(self.top_k, dim=-1)
        return logits, F.softmax(top, dim=-1), indices

    def extra_repr(self):
        return f"{self.dim}, num_experts={self.num_experts}, top_k={self.top_k}"


class GptOssExperts(Module):
    """``num_experts`` clamped-SwiGLU experts with biases, stacked in HF's layout (see the module docstring)."""

    def __init__(self, dim, hidden, num_experts, alpha=1.702, limit=7.0):
        super().__init__()
        self.dim, self.hidden, self.num_experts = dim, hidden, num_experts
        self.alpha, self.limit = float(alpha), float(limit)
        self.gate_up_proj = _param(num_experts, dim, 2 * hidden)
        self.gate_up_proj_bias = _param(num_experts, 2 * hidden)
        self.down_proj = _param(num_experts, hidden, dim)
        self.down_proj_bias = _param(num_experts, dim)
        for weight in (self.gate_up_proj, self.down_proj):  # HF's init: N(0, 0.02) weights, zero biases
            init.normal_(weight, std=0.02)
        for bias in (self.gate_up_proj_bias, self.down_proj_bias):
            init.zeros_(bias)

    def __len__(self):
        return self.num_experts  # (moe_lm counts experts per layer by len)

    def activation(self, gate_up):
        """The clamped SwiGLU of the interleaved gate / up columns."""
        gate = gate_up[..., ::2].clamp(max=self.limit)
        up = gate_up[..., 1::2].clamp(-self.limit, self.limit)
        return (up + 1.0) * (gate * F.sigmoid(gate * self.alpha))

    def expert(self, e, rows):
        """Expert ``e`` over ``rows`` (n, dim)."""
        hidden = self.activation(rows @ self.gate_up_proj[e] + self.gate_up_proj_bias[e])
        return hidden @ self.down_proj[e] + self.down_proj_bias[e]

    def extra_repr(self):
        return f"{self.num_experts} x ({self.dim} -> {self.hidden} -> {self.dim}), alpha={self.alpha}, " \
               f"limit={self.limit}"


class GptOssMLP(Module):
    """The sparse MLP of a gpt-oss block: ``router`` and ``experts`` (HF's module names)."""

    def __init__(self, config):
        super().__init__()
        self.num_experts, self.top_k = config.num_experts, config.num_experts_per_tok
        self.router = GptOssRouter(config.dim, config.num_experts, config.num_experts_per_tok)
        self.experts = GptOssExperts(config.dim, config.intermediate_size, config.num_experts, config.swiglu_alpha,
                                     config.swiglu_limit)
        self.aux_loss = self.router_logits = self.router_probs = self.routed_counts = self.router_indices = None
        self.tokens_per_expert, self.dropped_tokens = None, 0

    def forward(self, x):
        flat = x.reshape(-1, x.shape[-1])
        logits, weights, indices = self.router(flat)
        k, device = self.top_k, flat.device
        xp = device.array_module()
        order, routed = sort_by_expert(xp, indices.array.reshape(-1), self.num_experts)
        counts = backend.to_device_array(routed, backend.CPU).astype(np.int64)
        rows = flat.index_select(0, Tensor._make(order // k, device))  # gathered once, contiguous per expert
        outs, start = [], 0
        for e, count in enumerate(counts):
            if count:
                outs.append(self.experts.expert(e, rows[start:start + int(count)]))
            start += int(count)
        y = cat(outs, 0) if outs else None
        out = combine(flat, y, weights, order, k)
        probs = F.softmax(logits.to(promote_types(np.dtype("float32"), logits.dtype)), dim=-1)
        self.router_logits, self.router_probs, self.router_indices, self.routed_counts = logits, probs, indices, routed
        self.tokens_per_expert, self.dropped_tokens = counts, 0
        self.aux_loss = load_balancing_loss(probs, routed)
        return out.reshape(*x.shape)

    def extra_repr(self):
        return f"num_experts={self.num_experts}, top_k={self.top_k}"


__all__ = ["GptOssRouter", "GptOssExperts", "GptOssMLP"]
