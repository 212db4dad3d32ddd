"""LLaMA-3: RMSNorm, rotary position embeddings (with llama3 frequency scaling), grouped-query attention and a
SwiGLU MLP. Module names are Hugging Face's LlamaForCausalLM names (``model.layers.3.self_attn.q_proj``), so its
checkpoints load as they are (io.py). The shell (forward, pipeline chunks, counts, generation) is the
CausalLM every model shares (models/causal_lm.py); this file holds LLaMA's blocks, embedding and rotary tables.
"""
from __future__ import annotations

import numpy as np

from ... import backend
from ... import nn
from ...nn import functional as F
from ...tensor import Tensor
from ...nn.parallel.context_parallel import active_group, local_positions
from ..attention import cached_attention, sharded_random
from ..documents import active_layout
from ..causal_lm import CausalLM
from ..registry import ModelSpec, register
from .config import LlamaConfig


class LlamaAttention(nn.Module):
    tp = None  # set by parallelize_llama: the TensorParallel its heads are split over

    def __init__(self, config: LlamaConfig):
        super().__init__()
        hd = config.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.n_kv_heads, hd  # this rank's heads
        self.dropout = config.dropout
        self.q_proj = nn.Linear(config.dim, config.n_heads * hd, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.dim, config.n_kv_heads * hd, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.dim, config.n_kv_heads * hd, bias=config.attention_bias)
        self.o_proj = nn.Linear(config.n_heads * hd, config.dim, bias=config.attention_bias)
        if config.qk_norm:  # Qwen3: RMSNorm over each head's queries and keys, before the rotation
            self.q_norm = nn.RMSNorm(hd, eps=config.rms_norm_eps)
            self.k_norm = nn.RMSNorm(hd, eps=config.rms_norm_eps)

    def forward(self, x, rope, kv_cache=None, layer=0):
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)  # the whole sequence, this rank's heads
        cos, sin = (t if t.dtype == q.dtype else t.to(q.dtype) for t in rope)  # HF rotates in q's dtype
        B, T = q.shape[0], q.shape[1]
        hd = self.head_dim
        q, k = q.view(B, T, -1, hd), k.view(B, T, -1, hd)
        if "q_norm" in self._modules:
            q, k = self.q_norm(q), self.k_norm(k)
        q = F.rotary_embedding(q.transpose(1, 2), cos, sin)  # (B, heads, T, hd)
        k = F.rotary_embedding(k.transpose(1, 2), cos, sin)
        v = v.view(B, T, -1, hd).transpose(1, 2)
        dropout_p = self.dropout if self.training else 0.0
        with sharded_random(self.tp, dropout_p):
            y = cached_attention(q, k, v, kv_cache, layer, dropout_p, enable_gqa=k.shape[1] != q.shape[1])
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class LlamaMLP(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.dim, config.intermediate_size, bias=config.mlp_bias)
        self.up_proj = nn.Linear(config.dim, config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.dim, bias=config.mlp_bias)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def build_mlp(config, layer):
    """The MLP of block ``layer``: a sparse mixture of experts where the config makes the layer sparse (Qwen3-MoE,
    Mixtral: ``config.sparse_layer(layer)``), else LLaMA's SwiGLU. The auxiliary loss is the model's
    (models/moe_lm.py)."""
    if config.sparse_layer(layer):
        return nn.MoE(config.dim, config.moe_intermediate_size, config.num_experts, config.num_experts_per_tok,
                      norm_topk_prob=config.norm_topk_prob)
    return LlamaMLP(config)


class LlamaDecoderLayer(nn.Module):
    """A pre-norm block: x + attention(norm(x)), then + mlp(norm(x)). The models on LLaMA's shell subclass it with
    their own ``attention`` and ``feed_forward`` (config, layer index) -> module."""

    def __init__(self, config: LlamaConfig, layer=0):
        super().__init__()
        self.self_attn = self.attention(config, layer)
        self.mlp = self.feed_forward(config, layer)
        self.input_layernorm = nn.RMSNorm(config.dim, eps=config.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(config.dim, eps=config.rms_norm_eps)

    @staticmethod
    def attention(config, layer):
        return LlamaAttention(config)

    @staticmethod
    def feed_forward(config, layer):
        return build_mlp(config, layer)

    def forward(self, x, rope, kv_cache=None, layer=0):
        x = x + self.self_attn(self.input_layernorm(x), rope, kv_cache, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(CausalLM):
    BODY, EMBEDDING, BLOCKS, FINAL_NORM = "model", ("embed_tokens",), "layers", "norm"
    CONTEXT_KEY = "max_seq_len"
    CHUNK_ATTRIBUTES = CausalLM.CHUNK_ATTRIBUTES + ("_inv_freq", "_rope_tables")

    DECODER_LAYER = LlamaDecoderLayer  # (config, layer index) -> a block; the other models on this shell set theirs

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.build_shell(config)
        self._inv_freq = config.inv_freq()

    def build_shell(self, config):
        """The embedding, ``config.n_layers`` blocks of DECODER_LAYER, the final norm and the output layer (tied to
        the embedding with tie_word_embeddings), initialised by ``_init_weights``: what every model on LLaMA's
        shell builds (in this order, which fixes the initial weights)."""
        self.config = config
        self.model = nn.ModuleDict(dict(
            embed_tokens=nn.Embedding(config.vocab_size, config.dim, padding_idx=config.pad_token_id),
            layers=nn.ModuleList([self.DECODER_LAYER(config, i) for i in range(config.n_layers)]),
            norm=nn.RMSNorm(config.dim, eps=config.rms_norm_eps),
        ))
        self.lm_head = nn.Linear(config.dim, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.apply(self._init_weights)
        self._rope_tables = {}  # device -> (cos, sin) of the positions so far, shared with pipeline chunks

    @staticmethod
    def _init_weights(module):
        # HF's LlamaPreTrainedModel: N(0, initializer_range = 0.02) for linear and embedding weights, zero biases
        if isinstance(module, (nn.Linear, nn.Embedding, nn.Router)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def embed(self, idx, kv_cache=None):
        self.check_length((kv_cache.length if kv_cache is not None else 0) + idx.shape[1])
        x = self.model.embed_tokens(idx)
        tp = self.tp
        if tp is not None and tp.sequence_parallel:
            x = tp.scatter_sequence(x)
        return x

    def block_args(self, x, kv_cache):
        """The rotary tables of the positions ``x`` holds (under sequence parallelism x is this rank's slice of the
        whole sequence, whose positions the rotation needs)."""
        length = x.shape[1] * (self.tp.size if self.tp is not None and self.tp.sequence_parallel else 1)
        layout = active_layout()
        if layout is not None:  # packed documents: each row's positions, (B, 1, T, head_dim) tables
            positions = layout.positions
            cos, sin = self.rope(0, int(positions.max()) + 1, x.device)
            index = backend.to_device_array(positions, x.device)
            tables = tuple(Tensor._make(t.array[index][:, None], x.device) for t in (cos, sin))
            return (tables,)
        group = active_group()
        if group is not None and kv_cache is None:  # context parallel: the global positions of this rank's chunks
            positions = local_positions(length, group)
            cos, sin = self.rope(0, int(positions.max()) + 1, x.device)
            index = backend.to_device_array(positions, x.device)
            return ((Tensor._make(cos.array[index], x.device), Tensor._make(sin.array[index], x.device)),)
        return (self.rope(kv_cache.length if kv_cache is not None else 0, length, x.device),)

    _rope_factor = None  # YaRN's attention factor the cos / sin tables are multiplied by (DeepSeek-V3, gpt-oss)

    def rope(self, start, length, device):
        """(cos, sin) of positions start .. start+length-1, (length, head_dim) float32 on ``device``, computed in
        float32 as HF does (position x inverse frequency, the halves repeated, times ``_rope_factor`` where the model
        has one); the table grows as needed."""
        table = self._rope_tables.get(device)
        if table is None or table[0].shape[0] < start + length:
            size = min(max(start + length, 2 * (table[0].shape[0] if table is not None else 128)),
                       max(self.config.max_seq_len, start + length))
            freqs = np.arange(size, dtype=np.float32)[:, None] * self._inv_freq[None, :]
            emb = np.concatenate([freqs, freqs], axis=-1)
            parts = [f(emb).astype(np.float32) for f in (np.cos, np.sin)]
            if self._rope_factor is not None:
                parts = [(p * np.float32(self._rope_factor)).astype(np.float32) for p in parts]
            table = tuple(backend.to_device_array(p, device) for p in parts)
            self._rope_tables[device] = table
        return tuple(Tensor._make(t[start:start + length], device) for t in table)

    def kv_heads(self, block):
        return block.self_attn.k_proj.weight.shape[0] // self.config.head_dim

    def position_embeddings(self):
        """The token embedding unless it is tied to the output layer (which computes)."""
        if self.config.tie_word_embeddings or "embed_tokens" not in self.model:
            return []
        return [self.model.embed_tokens.weight]

    def tied_weight_names(self):
        return ("model.embed_tokens.weight", "lm_head.weight") if self.config.tie_word_embeddings else None

    # ---------------------------------------------------------------------------------------- weights
    @classmethod
    def config_from_hf(cls, hf, source):
        """Our config from an HF config.json dict (``source`` names it in errors)."""
        from .io import hf_config_to_llama
        return hf_config_to_llama(hf, source)

    def hf_config(self, dtype):
        """The HF config.json dict of this model (weights stored in ``dtype``, a name)."""
        from .io import llama_to_hf_config
        return llama_to_hf_config(self.config, dtype)

    @staticmethod
    def from_hf_name(name):
        """Our parameter name of an HF checkpoint's tensor name (the same for LLaMA, Qwen3, Qwen3-MoE)."""
        return name

    @staticmethod
    def to_hf_name(name):
        return name

    @classmethod
    def from_pretrained(cls, directory, device=None, dtype=None):
        """Load a Hugging Face LlamaForCausalLM directory (config.json + model.safetensors, or sharded with
        model.safetensors.index.json); weights in bfloat16 / float16 are widened to float32 unless ``dtype``."""
        from .io import load_hf
        model = load_hf(cls, directory, dtype)
        return model.to(device) if device is not None else model

    def save_pretrained(self, directory, max_shard_size="5GB", dtype=None):
        """Write the Hugging Face layout (config.json, safetensors, an index when sharded)."""
        from .io import save_hf
        save_hf(self, directory, max_shard_size, dtype)


def _parallelize(model, group, sequence_parallel=False):
    from .parallel import parallelize_llama

    return parallelize_llama(model, group, sequence_parallel)


def _head_counts(config):
    return {"n_head": config.n_heads, "n_kv_head": config.n_kv_heads}  # query and key/value heads split alike


def read_hf(directory):
    """(config, {our name: tensor read box by box}) of an HF directory of a LLaMA-like model (io.hf_weights: the
    class of its config.json's model_type reads it)."""
    from .io import hf_weights

    return hf_weights(directory)[:2]


SPEC = register(ModelSpec("llama3", Llama, LlamaConfig, _parallelize, _head_counts, read_hf=read_hf))

__all__ = ["Llama", "LlamaConfig", "LlamaAttention", "LlamaMLP", "LlamaDecoderLayer", "SPEC"]
