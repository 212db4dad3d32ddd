"""LLaMA-3: RMSNorm, rotary position embeddings (with llama3 frequency scaling), grouped-query attention and a
SwiGLU MLP. Module names are Hugging Face's LlamaForCausalLM names (``model.layers.3.self_attn.q_proj``), so its
checkpoints load as they are (llama_io.py). The call shape is GPT2's: ``model(idx, targets=None) -> (logits, loss)``,
and the parts the run loop, pipelines and generation use (``embed``, ``run_blocks``, ``head``, KV cache) match too.
"""
from __future__ import annotations

import numpy as np

from .. import backend
from .. import nn
from ..nn import functional as F
from ..tensor import Tensor
from .attention import KVCache, cached_attention, sharded_random, whole_numel
from .flops import training_flops_per_token
from .llama_config import LlamaConfig
from .recompute import run_block


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

    def forward(self, x, rope, kv_cache=None, layer=0):
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)  # the whole sequence, this rank's heads
        cos, sin = (t if t.dtype == q.dtype else t.to(q.dtype) for t in rope)  # HF rotates in q's dtype
        B, T = q.shape[0], q.shape[1]
        hd = self.head_dim
        q = F.rotary_embedding(q.view(B, T, -1, hd).transpose(1, 2), cos, sin)  # (B, heads, T, hd)
        k = F.rotary_embedding(k.view(B, T, -1, hd).transpose(1, 2), cos, sin)
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


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.self_attn = LlamaAttention(config)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = nn.RMSNorm(config.dim, eps=config.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(config.dim, eps=config.rms_norm_eps)

    def forward(self, x, rope, kv_cache=None, layer=0):
        x = x + self.self_attn(self.input_layernorm(x), rope, kv_cache, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    tp = None  # a TensorParallel after parallelize_llama (models/llama_parallel.py)
    recompute = "none"  # "block": recompute each block's activations in backward (models/recompute.py)

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.model = nn.ModuleDict(dict(
            embed_tokens=nn.Embedding(config.vocab_size, config.dim),
            layers=nn.ModuleList([LlamaDecoderLayer(config) for _ in range(config.n_layers)]),
            norm=nn.RMSNorm(config.dim, eps=config.rms_norm_eps),
        ))
        self.lm_head = nn.Linear(config.dim, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.apply(self._init_weights)
        self._inv_freq = config.inv_freq()
        self._rope_tables = {}

    @staticmethod
    def _init_weights(module):
        # HF's LlamaPreTrainedModel: N(0, initializer_range = 0.02) for linear and embedding weights, zero biases
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def forward(self, idx, targets=None, kv_cache=None, last_only=False):
        """idx (B, T) int token ids -> (logits (B, T, V), loss or None); see GPT2.forward."""
        T = idx.shape[1]
        start = kv_cache.length if kv_cache is not None else 0
        x = self.run_blocks(self.embed(idx, kv_cache), kv_cache, self.rope(start, T, idx.device))
        if kv_cache is not None:
            kv_cache.advance(T)
        return self.head(x, targets, last_only)

    # the parts of forward, also run one by one by pipeline stages
    def embed(self, idx, kv_cache=None):
        T = idx.shape[1]
        start = kv_cache.length if kv_cache is not None else 0
        if start + T > self.config.max_seq_len:
            raise ValueError(f"Llama.forward: sequence of length {start + T} exceeds max_seq_len "
                             f"{self.config.max_seq_len}\nHINT: crop the context to the last max_seq_len tokens")
        x = self.model.embed_tokens(idx)
        tp = self.tp
        if tp is not None and tp.sequence_parallel:
            x = tp.scatter_sequence(x)
        return x

    def run_blocks(self, x, kv_cache=None, rope=None):
        if rope is None:  # a pipeline stage: the positions follow from the cache
            T = x.shape[1] * (self.tp.size if self.tp is not None and self.tp.sequence_parallel else 1)
            rope = self.rope(kv_cache.length if kv_cache is not None else 0, T, x.device)
        for layer, block in self.numbered_blocks():
            x = run_block(block, self.recompute, x, rope, kv_cache, layer)
        return x

    def numbered_blocks(self):
        return enumerate(self.model.layers)

    def head(self, x, targets=None, last_only=False):
        x = self.model.norm(x)
        if last_only:
            x = x[:, -1:, :]
        logits = self.lm_head(x)
        if self.tp is not None:
            return self.tp.logits_and_loss(logits, targets, self.config.vocab_size)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1), ignore_index=-1)
        return logits, loss

    def rope(self, start, length, device):
        """(cos, sin) of positions start .. start+length-1, (length, head_dim) float32 on ``device``, computed in
        float32 as HF does (position x inverse frequency, the halves repeated); the table grows as needed."""
        table = self._rope_tables.get(device)
        if table is None or table[0].shape[0] < start + length:
            size = min(max(start + length, 2 * (table[0].shape[0] if table is not None else 128)),
                       max(self.config.max_seq_len, start + length))
            freqs = np.arange(size, dtype=np.float32)[:, None] * self._inv_freq[None, :]
            emb = np.concatenate([freqs, freqs], axis=-1)
            table = tuple(backend.to_device_array(f(emb).astype(np.float32), device) for f in (np.cos, np.sin))
            self._rope_tables[device] = table
        return tuple(Tensor._make(t[start:start + length], device) for t in table)

    def new_kv_cache(self, batch_size, device, dtype=backend.float32):
        """A KV cache of this model's (this rank's) key/value heads."""
        _, block = next(iter(self.numbered_blocks()))
        return KVCache(self.config, batch_size, device, dtype, n_head=block.self_attn.k_proj.weight.shape[0]
                       // self.config.head_dim)

    def pipeline_chunk(self, layers, first, last, head=None):
        """The module a pipeline stage runs: blocks ``layers`` (and the embeddings / head when first / last)."""
        return LlamaChunk(self, layers, first, last, head)

    def tied_weight_names(self):
        return ("model.embed_tokens.weight", "lm_head.weight") if self.config.tie_word_embeddings else None

    # ----------------------------------------------------------------------------------- accounting
    def optimizer_groups(self, weight_decay):
        """Weight decay on 2-D parameters (matmul weights, embeddings) only."""
        params = [p for p in self.parameters() if p.requires_grad]
        return [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
                {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]

    def num_params(self, non_embedding=False, trainable=None):
        """Parameters of the whole model (shards count as the tensors they are part of); ``non_embedding`` leaves
        out the token embedding unless it is tied to the output layer (which does compute). ``trainable``: True
        counts only those that require grad, False only the frozen ones (LoRA's base weights)."""
        size = self.tp.size if self.tp is not None else 1
        counted = [p for p in self.parameters() if trainable is None or p.requires_grad == trainable]
        if non_embedding and not self.config.tie_word_embeddings:
            counted = [p for p in counted if p is not self.model.embed_tokens.weight]
        return sum(whole_numel(p, size) for p in counted)

    def flops_per_token(self, seq_len=None):
        """Training FLOPs per token: 6N + 12 L H Q T (PaLM appendix B; see models.flops)."""
        cfg = self.config
        return training_flops_per_token(self, cfg.n_layers, cfg.n_heads, cfg.head_dim, seq_len or cfg.max_seq_len)

    # ---------------------------------------------------------------------------------------- weights
    @classmethod
    def from_pretrained(cls, directory, device=None, dtype=None):
        """Load a Hugging Face LlamaForCausalLM directory (config.json + model.safetensors, or sharded with
        model.safetensors.index.json); weights in bfloat16 / float16 are widened to float32 unless ``dtype``."""
        from .llama_io import load_hf
        model = load_hf(cls, directory, dtype)
        return model.to(device) if device is not None else model

    def save_pretrained(self, directory, max_shard_size="5GB", dtype=None):
        """Write the Hugging Face layout (config.json, safetensors, an index when sharded)."""
        from .llama_io import save_hf
        save_hf(self, directory, max_shard_size, dtype)

    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, seed=None,
                 use_cache=True, stream=None):
        """Sample ``max_new_tokens`` after the prompts ``idx`` (B, T); see generation.py."""
        from .generation import generate
        return generate(self, idx, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                        seed=seed, use_cache=use_cache, stream=stream)


class LlamaChunk(Llama):
    """Some consecutive blocks of a Llama, with the token embedding when ``first`` and the final norm and output
    layer when ``last``; submodules keep their names in the whole model (``model.layers.5``, ``lm_head``)."""

    def __init__(self, model, layers, first, last, head=None):
        nn.Module.__init__(self)
        self.config, self.tp = model.config, model.tp
        self.first, self.last = first, last
        self._inv_freq, self._rope_tables = model._inv_freq, {}
        parts = {"embed_tokens": model.model.embed_tokens} if first else {}
        parts["layers"] = nn.ModuleDict({str(i): model.model.layers[i] for i in layers})
        if last:
            parts["norm"] = model.model.norm
        self.model = nn.ModuleDict(parts)
        if last:
            self.lm_head = head if head is not None else model.lm_head

    def numbered_blocks(self):
        return ((int(k), block) for k, block in self.model.layers.items())

    def forward(self, x, targets=None, kv_cache=None, last_only=False):
        if self.first:
            x = self.embed(x, kv_cache)
        x = self.run_blocks(x, kv_cache)
        return self.head(x, targets, last_only) if self.last else x


__all__ = ["Llama", "LlamaConfig", "LlamaAttention", "LlamaMLP", "LlamaDecoderLayer", "LlamaChunk"]
