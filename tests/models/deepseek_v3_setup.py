"""Tiny random DeepSeek-V3 pairs for the tests: HF's DeepseekV3ForCausalLM built locally, saved, and loaded as ours;
and, for float64 comparisons, HF with its float32 steps taken out (``hf_float64``): its RMSNorm and router cast to
float32 and its rotary tables are float32 (torch's and numpy's float32 cos differ by an ulp), so float64 runs give
both models HF's tables and compute everything else in float64."""
import contextlib

import numpy as np
import torch

import infini_train as it
from infini_train.models.deepseek_v3.model import DeepseekV3

VOCAB = 61
YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=16, beta_fast=32,
            beta_slow=1, mscale=0.9, mscale_all_dim=0.8)


def hf_config(q_lora_rank=24, dense=1, layers=3, interleave=True, yarn=True, **overrides):
    from transformers import DeepseekV3Config

    fields = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                  num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8,
                  n_group=2, topk_group=1, num_experts_per_tok=3, n_shared_experts=1, kv_lora_rank=16,
                  q_lora_rank=q_lora_rank, qk_rope_head_dim=8, qk_nope_head_dim=12, v_head_dim=10,
                  first_k_dense_replace=dense, max_position_embeddings=64, rope_interleave=interleave,
                  rope_parameters=dict(YARN) if yarn else dict(rope_type="default", rope_theta=10000.0),
                  routed_scaling_factor=2.5, norm_topk_prob=True, rms_norm_eps=1e-6, tie_word_embeddings=False,
                  pad_token_id=None, attn_implementation="sdpa")
    fields.update(overrides)
    config = DeepseekV3Config(**fields)
    config._experts_implementation = "eager"  # (torch's grouped_mm takes no float64)
    return config


def pair(tmp_path, seed=0, **kwargs):
    """(ours, HF) with the same random weights: non-trivial norms, spread routers and correction biases."""
    from transformers import DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    hf = DeepseekV3ForCausalLM(hf_config(**kwargs))
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
            elif name.endswith("gate.weight"):
                p.normal_(0.0, 0.5)
            elif name.endswith(".bias"):
                p.normal_(0.0, 0.1)
        for name, b in hf.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.05 * torch.randn_like(b))
    hf.save_pretrained(tmp_path / f"hf{seed}")
    return DeepseekV3.from_pretrained(tmp_path / f"hf{seed}"), hf.eval()


@contextlib.contextmanager
def hf_float64(ours, hf, length):
    """Both models in float64, HF without its float32 casts (RMSNorm, router) and ours on HF's rotary tables."""
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as m

    def rms_forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    saved_rms, saved_router = m.DeepseekV3RMSNorm.forward, m.DeepseekV3TopkRouter.forward
    m.DeepseekV3RMSNorm.forward = rms_forward
    m.DeepseekV3TopkRouter.forward = router_forward
    hf.double()
    ours.double()
    cos, sin = hf.model.rotary_emb(torch.zeros(1, dtype=torch.float64), torch.arange(length)[None])
    ours._rope_tables[it.backend.CPU] = (cos[0].numpy(), sin[0].numpy())
    try:
        yield
    finally:
        m.DeepseekV3RMSNorm.forward, m.DeepseekV3TopkRouter.forward = saved_rms, saved_router
        ours._rope_tables.clear()


def router_forward(self, hidden_states):
    """HF's DeepseekV3TopkRouter.forward in the input's dtype (HF's casts both operands to float32)."""
    hidden_states = hidden_states.view(-1, self.hidden_dim)
    router_logits = torch.nn.functional.linear(hidden_states, self.weight)
    scores = router_logits.sigmoid()
    scores_for_choice = scores + self.e_score_correction_bias
    group_scores = scores_for_choice.view(-1, self.num_group, self.num_experts // self.num_group).topk(2, dim=-1)[0]
    group_idx = torch.topk(group_scores.sum(dim=-1), k=self.topk_group, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores[..., 0]).scatter_(1, group_idx, 1)
    score_mask = group_mask.unsqueeze(-1).expand(-1, self.num_group, self.num_experts // self.num_group).reshape(
        -1, self.num_experts)
    scores_for_choice = scores_for_choice.masked_fill(~score_mask.bool(), float("-inf"))
    topk_indices = torch.topk(scores_for_choice, k=self.top_k, dim=-1, sorted=False)[1]
    topk_weights = scores.gather(1, topk_indices)
    if self.norm_topk_prob:
        topk_weights = topk_weights / (topk_weights.sum(dim=-1, keepdim=True) + 1e-20)
    return router_logits, topk_weights * self.routed_scaling_factor, topk_indices


def batch(seed=1, B=2, T=20):
    return np.random.default_rng(seed).integers(0, VOCAB, (B, T))


def shifted_targets(x):
    return np.concatenate([x[:, 1:], -np.ones((x.shape[0], 1), dtype=x.dtype)], axis=1)


def grads_by_hf_name(ours):
    """Our gradients under HF's names: the experts stacked as experts.gate_up_proj / experts.down_proj."""
    from .hf_lm_checks import hf_named_grads

    return hf_named_grads(ours)
