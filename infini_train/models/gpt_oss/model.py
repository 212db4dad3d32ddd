"""gpt-oss: LLaMA's decoder (RMSNorm, rotary embeddings, grouped-query attention) with biases on the attention
projections, one learned attention sink per head (a logit in each row's softmax denominator: sinks= of
scaled_dot_product_attention), sliding-window and full attention layers alternating (``layer_types``), YaRN rope
scaling (models/yarn.py: the cos / sin tables times its attention factor) and in every layer a mixture of experts
with a biased router and clamped-SwiGLU experts with biases (moe.py); the loss adds HF's load-balancing loss
(models/moe_lm.py). Module names are Hugging Face's GptOssForCausalLM names, so its directories load as they are
(the experts stacked as HF stores them)."""
from __future__ import annotations


from ... import nn
from ...nn import functional as F
from ...nn.layers import _param
from ..attention import cached_attention, sharded_random
from ..llama.model import Llama, LlamaDecoderLayer, _head_counts, read_hf
from ..moe_lm import MoECausalLM
from ..registry import ModelSpec, register
from .config import GptOssConfig
from .moe import GptOssMLP


class GptOssAttention(nn.Module):
    tp = None  # set by parallelize_gpt_oss: the TensorParallel its heads are split over

    def __init__(self, config: GptOssConfig, layer=0):
        super().__init__()
        hd = config.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.n_kv_heads, hd  # this rank's heads
        self.dropout = config.dropout
        self.window = config.window(layer)
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.dim, config.n_heads * hd, bias=bias)
        self.k_proj = nn.Linear(config.dim, config.n_kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(config.dim, config.n_kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(config.n_heads * hd, config.dim, bias=bias)
        self.sinks = _param(config.n_heads)  # one logit per query head (HF: self_attn.sinks)

    def forward(self, x, rope, kv_cache=None, layer=0):
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        cos, sin = (t if t.dtype == q.dtype else t.to(q.dtype) for t in rope)
        B, T = q.shape[0], q.shape[1]
        hd = self.head_dim
        q = F.rotary_embedding(q.view(B, T, -1, hd).transpose(1, 2), cos, sin)  # (B, heads, T, hd)
        k = F.rotary_embedding(k.view(B, T, -1, hd).transpose(1, 2), cos, sin)
        v = v.view(B, T, -1, hd).transpose(1, 2)
        dropout_p = self.dropout if self.training else 0.0
        with sharded_random(self.tp, dropout_p):
            y = cached_attention(q, k, v, kv_cache, layer, dropout_p, enable_gqa=k.shape[1] != q.shape[1],
                                 sinks=self.sinks, window=self.window)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))

    def extra_repr(self):
        return f"window={self.window}"


class GptOssDecoderLayer(LlamaDecoderLayer):
    @staticmethod
    def attention(config, layer):
        return GptOssAttention(config, layer)

    @staticmethod
    def feed_forward(config, layer):
        return GptOssMLP(config)


class GptOss(MoECausalLM, Llama):
    CHUNK_ATTRIBUTES = Llama.CHUNK_ATTRIBUTES + ("_rope_factor",)
    DECODER_LAYER = GptOssDecoderLayer

    def __init__(self, config: GptOssConfig):
        nn.Module.__init__(self)
        self.build_shell(config)
        self._inv_freq, self._rope_factor = config.rope_parameters()
        self._rope_tables = {}

    @staticmethod
    def _init_weights(module):
        # HF's GptOssPreTrainedModel: N(0, 0.02) linear / embedding weights and sinks, zero linear biases (the
        # router and experts initialise themselves so: moe.py)
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, GptOssAttention):
            nn.init.normal_(module.sinks, mean=0.0, std=0.02)

    def moe_layers(self):
        return [block.mlp for _, block in self.numbered_blocks()]

    def idle_params(self, trainable):
        """The experts a token is not routed to: (num_experts - num_experts_per_tok) experts (weights and biases)
        of every layer."""
        cfg = self.config
        experts = [p for m in self.moe_layers() for p in m.experts.parameters()]
        if (bool(experts) and not experts[0].requires_grad) == trainable:
            return 0
        d, h = cfg.dim, cfg.intermediate_size
        per_expert = d * 2 * h + 2 * h + h * d + d
        return cfg.n_layers * (cfg.num_experts - cfg.num_experts_per_tok) * per_expert

    def flops_per_token(self, seq_len=None):
        """PaLM's 6N + 12 L H Q T (models/flops.py) with N the active parameters and, in a sliding-window layer,
        the window's keys in place of T."""
        from ..flops import training_flops_per_token

        cfg = self.config
        length = seq_len or cfg.max_seq_len
        keys = sum(min(length, cfg.window(layer) or length) for layer in range(cfg.n_layers))
        return (training_flops_per_token(self, 0, cfg.n_heads, cfg.head_dim, length, self.idle_params)
                + 12 * cfg.n_heads * cfg.head_dim * keys)

    @classmethod
    def config_from_hf(cls, hf, source):
        from .io import hf_config_to_gpt_oss
        return hf_config_to_gpt_oss(hf, source)

    def hf_config(self, dtype):
        from .io import gpt_oss_to_hf_config
        return gpt_oss_to_hf_config(self.config, dtype)


def _parallelize(model, group, sequence_parallel=False):
    from .parallel import parallelize_gpt_oss

    return parallelize_gpt_oss(model, group, sequence_parallel)


SPEC = register(ModelSpec("gpt_oss", GptOss, GptOssConfig, _parallelize, _head_counts, read_hf=read_hf))

__all__ = ["GptOss", "GptOssConfig", "GptOssAttention", "GptOssDecoderLayer", "SPEC"]
