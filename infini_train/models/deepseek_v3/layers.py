"""DeepSeek-V3's decoder layer: multi-head latent attention (MLA) and the MLP of its index (the dense SwiGLU, or a
DeepSeek-MoE layer after first_k_dense_replace), and the weights' initialisation as Hugging Face's; model.py builds the
model from them and mtp.py its multi-token prediction blocks. MLA is described in model.py's docstring."""
from __future__ import annotations

import numpy as np

from ... import backend
from ... import nn
from ...autograd.ops.joins import cat
from ...nn import functional as F
from ...nn.parallel.context_parallel import active_group
from ...tensor import Tensor
from ..attention import sharded_random
from ..documents import active_layout
from ..llama.model import LlamaDecoderLayer, LlamaMLP
from .config import DeepseekV3Config


def rotate(x, cos, sin, interleave):
    """The rotary embedding of ``x`` (..., T, d) as HF's DeepSeek-V3 applies it: with ``interleave`` the pairs
    (x0, x1), (x2, x3), ... rotate and come out as [evens, odds] (apply_rotary_pos_emb_interleave), else the halves
    (rotate_half)."""
    if interleave:
        shape = x.shape
        x = x.reshape(*shape[:-1], shape[-1] // 2, 2).transpose(-1, -2).reshape(*shape)
    return F.rotary_embedding(x, cos, sin)


def latent_attention(q, k, v, past, scale, dropout_p):
    """Causal attention of q (B, H, T, E) over k (B, H, past + T, E), v (B, H, past + T, Ev), with the softmax
    ``scale``: the new queries sit at the end of the key range; packed documents attend within themselves."""
    layout = active_layout()
    if layout is not None:
        if past:
            raise ValueError("attention: packed documents run whole sequences without a KV cache\nHINT: generate "
                             "outside packed_documents")
        return F.scaled_dot_product_attention(q, k, v, attn_mask=layout.attention_mask(q.device),
                                              dropout_p=dropout_p, scale=scale)
    if active_group() is not None:
        raise NotImplementedError("parallel.context: multi-head latent attention (model.arch=deepseek_v3) does not "
                                  "run context-parallel yet\nHINT: set parallel.context=1")
    mask, causal = None, True
    T = q.shape[2]
    if past:
        causal = False
        if T > 1:  # bottom-right aligned causal mask
            rows = np.arange(T)[:, None] + past >= np.arange(past + T)[None, :]
            mask = Tensor._make(backend.to_device_array(rows, q.device), q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal,
                                          scale=scale)


class DeepseekV3Attention(nn.Module):
    tp = None  # set by parallelize_deepseek_v3: the TensorParallel its heads are split over

    def __init__(self, config: DeepseekV3Config):
        super().__init__()
        c = config
        self.nope, self.rope_dim, self.v_dim, self.rank = (c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim,
                                                           c.kv_lora_rank)
        self.interleave, self.dropout, self.scale = c.rope_interleave, c.dropout, c.softmax_scale()
        qk = c.qk_nope_head_dim + c.qk_rope_head_dim
        if c.q_lora_rank is None:
            self.q_proj = nn.Linear(c.dim, c.n_heads * qk, bias=False)
        else:
            self.q_a_proj = nn.Linear(c.dim, c.q_lora_rank, bias=c.attention_bias)
            self.q_a_layernorm = nn.RMSNorm(c.q_lora_rank, eps=1e-6)  # (HF gives these two norms no config eps)
            self.q_b_proj = nn.Linear(c.q_lora_rank, c.n_heads * qk, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(c.dim, c.kv_lora_rank + c.qk_rope_head_dim, bias=c.attention_bias)
        self.kv_a_layernorm = nn.RMSNorm(c.kv_lora_rank, eps=1e-6)
        self.kv_b_proj = nn.Linear(c.kv_lora_rank, c.n_heads * (c.qk_nope_head_dim + c.v_head_dim), bias=False)
        self.o_proj = nn.Linear(c.n_heads * c.v_head_dim, c.dim, bias=c.attention_bias)

    def query(self, x):
        if "q_proj" in self._modules:
            return self.q_proj(x)
        return self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))

    def compress(self, x):
        """(latent (B, T, kv_lora_rank) after its norm, rope key (B, 1, T, qk_rope_head_dim) before rotation)."""
        latent, k_rot = self.kv_a_proj_with_mqa(x).split([self.rank, self.rope_dim], dim=-1)
        tp = self.tp
        if tp is not None and tp.sequence_parallel:  # this rank's slice: the whole sequence's rope key, its
            from ...nn.parallel import gather_from_sequence_parallel_region  # gradient reduce-scattered back
            k_rot = gather_from_sequence_parallel_region(k_rot, tp.group, 1)
        elif tp is not None:  # every rank's heads read the shared rope key: its gradient is summed over them
            from ...nn.parallel import copy_to_tensor_parallel_region
            k_rot = copy_to_tensor_parallel_region(k_rot, tp.group)
        B, T = k_rot.shape[0], k_rot.shape[1]
        return self.kv_a_layernorm(latent), k_rot.reshape(B, T, 1, self.rope_dim).transpose(1, 2)

    def expand(self, latent, k_rot):
        """Each (local) head's keys (k_nope, the shared rope key) and values from the latent (B, S, rank) and the
        rotated rope key (B, 1, S, rope)."""
        kv = self.kv_b_proj(latent)  # (under sequence parallelism the whole sequence's, from this rank's slice)
        B, S = kv.shape[0], kv.shape[1]
        kv = kv.reshape(B, S, -1, self.nope + self.v_dim).transpose(1, 2)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
        k = cat([k_nope, k_rot.expand(B, k_nope.shape[1], S, self.rope_dim)], -1)
        return k, v

    def absorbed_attention(self, q_nope, q_rot, latent, k_rot, past):
        """Attention over the cached latent without expanding it (DeepSeek-V2's weight absorption, for decoding):
        kv_b_proj's key part folded into the queries, q_nope W_UK . latent = q_nope . k_nope, and its value part
        applied after the weighted sum of latents, (P latent) W_UV = P v -- per step the cost of the latents, not of
        every head's keys and values. The same attention up to rounding."""
        if active_layout() is not None:
            raise ValueError("attention: packed documents run whole sequences without a KV cache\nHINT: generate "
                             "outside packed_documents")
        w = self.kv_b_proj.weight  # (this rank's heads x (nope + v), rank)
        w = w.reshape(w.shape[0] // (self.nope + self.v_dim), self.nope + self.v_dim, self.rank)
        w_k, w_v = w.split([self.nope, self.v_dim], dim=1)  # (H, nope, rank), (H, v, rank)
        lat = latent.unsqueeze(1)  # (B, 1, S, rank)
        scores = (q_nope @ w_k) @ lat.transpose(-1, -2) + q_rot @ k_rot.transpose(-1, -2)  # (B, H, T, S)
        T, S = scores.shape[-2], scores.shape[-1]
        if T > 1:  # the new queries sit at the end of the key range
            future = np.arange(T)[:, None] + past < np.arange(S)[None, :]
            scores = scores.masked_fill(Tensor._make(backend.to_device_array(future, scores.device), scores.device),
                                        float("-inf"))
        probs = F.softmax(scores * self.scale, dim=-1)
        return (probs @ lat) @ w_v.transpose(-1, -2)  # (B, H, T, v)

    def forward(self, x, rope, kv_cache=None, layer=0):
        q = self.query(x)  # (under sequence parallelism x is this rank's slice, q the whole sequence's)
        B, T = q.shape[0], q.shape[1]
        cos, sin = (t if t.dtype == q.dtype else t.to(q.dtype) for t in rope)
        q = q.reshape(B, T, -1, self.nope + self.rope_dim).transpose(1, 2)
        q_nope, q_rot = q.split([self.nope, self.rope_dim], dim=-1)
        latent, k_rot = self.compress(x)
        q_rot = rotate(q_rot, cos, sin, self.interleave)
        k_rot = rotate(k_rot, cos, sin, self.interleave)
        past = 0
        if kv_cache is not None:  # the cache keeps the compressed latent and the rotated rope key
            past = kv_cache.length
            latent, k_rot = kv_cache.append(layer, latent, k_rot)
            if kv_cache.absorbed:
                y = self.absorbed_attention(q_nope, q_rot, latent, k_rot, past)
                return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))
        k, v = self.expand(latent, k_rot)
        q = cat([q_nope, q_rot], -1)
        dropout_p = self.dropout if self.training else 0.0
        with sharded_random(self.tp, dropout_p):
            y = latent_attention(q, k, v, past, self.scale, dropout_p)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


def build_mlp(config, layer):
    """Block ``layer``'s MLP: the dense SwiGLU before first_k_dense_replace, a DeepSeek-MoE layer after."""
    if not config.sparse_layer(layer):
        return LlamaMLP(config)
    from ...nn.moe_routing import DeepSeekMoE

    c = config
    return DeepSeekMoE(c.dim, c.moe_intermediate_size, c.n_routed_experts, c.num_experts_per_tok,
                       n_shared_experts=c.n_shared_experts, n_group=c.n_group, topk_group=c.topk_group,
                       norm_topk_prob=c.norm_topk_prob, routed_scaling_factor=c.routed_scaling_factor,
                       bias_update_rate=c.bias_update_rate, seq_aux_loss_alpha=c.seq_aux_loss_alpha)


class DeepseekV3DecoderLayer(LlamaDecoderLayer):
    @staticmethod
    def attention(config, layer):
        return DeepseekV3Attention(config)

    @staticmethod
    def feed_forward(config, layer):
        return build_mlp(config, layer)


def init_weights(module):
    # HF's DeepseekV3PreTrainedModel: N(0, 0.02) for linear, embedding and router weights, zero biases
    router = "e_score_correction_bias" in module._buffers  # (nn.moe_routing.DeepSeekRouter)
    if isinstance(module, (nn.Linear, nn.Embedding)) or router:
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)


__all__ = ["DeepseekV3Attention", "DeepseekV3DecoderLayer", "build_mlp", "init_weights", "latent_attention",
           "rotate"]
