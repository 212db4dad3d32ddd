"""GPT-2, reading top to bottom as in nanoGPT / llm.c's train_gpt2.py.

Parameter names match Hugging Face's GPT2LMHeadModel (``transformer.h.0.attn.c_attn.weight``, ...), with
nn.Linear's (out, in) layout; the HF Conv1D transpose happens in the loaders (gpt2_io.py).
"""
from __future__ import annotations

import math

from .. import backend
from .. import nn
from ..autograd import grad_mode
from ..creation import arange
from ..nn import functional as F
from .attention import TP_RANDOM, KVCache, cached_attention, sharded_random, whole_numel  # noqa: F401
from .flops import training_flops_per_token
from .gpt2_config import GPT2_PRESETS, GPT2Config
from .recompute import run_block

__all__ = ["GPT2", "GPT2Config", "GPT2_PRESETS", "KVCache"]


class CausalSelfAttention(nn.Module):
    tp = None  # set by parallelize_gpt2: the TensorParallel this layer's heads are split over

    def __init__(self, config: GPT2Config):
        super().__init__()
        self.n_head = config.n_head  # this rank's heads under tensor parallelism
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.c_proj.LLMC_RESIDUAL_SCALE_FLAG = True
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x, kv_cache=None, layer=0):
        qkv = self.c_attn(x)  # (B, T, 3C) or, split over a tensor group, this rank's heads (and whole sequence)
        B, T, three_c = qkv.shape
        C = three_c // 3
        nh, hd = self.n_head, C // self.n_head
        q, k, v = qkv.split(C, dim=2)
        q = q.view(B, T, nh, hd).transpose(1, 2)  # (B, nh, T, hd)
        k = k.view(B, T, nh, hd).transpose(1, 2)
        v = v.view(B, T, nh, hd).transpose(1, 2)
        dropout_p = self.dropout if self.training else 0.0
        with sharded_random(self.tp, dropout_p):
            y = cached_attention(q, k, v, kv_cache, layer, dropout_p)
        y = y.transpose(1, 2).reshape(B, T, C)
        y = self.c_proj(y)
        with sharded_random(self.tp, self.resid_dropout.p if self.training else 0, whole_sequence_split=True):
            return self.resid_dropout(y)


class MLP(nn.Module):
    tp = None  # set by parallelize_gpt2

    def __init__(self, config: GPT2Config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.c_proj.LLMC_RESIDUAL_SCALE_FLAG = True
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        y = self.c_proj(self.gelu(self.c_fc(x)))
        with sharded_random(self.tp, self.dropout.p if self.training else 0, whole_sequence_split=True):
            return self.dropout(y)


class Block(nn.Module):
    def __init__(self, config: GPT2Config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, kv_cache=None, layer=0):
        x = x + self.attn(self.ln_1(x), kv_cache, layer)
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    tp = None  # a TensorParallel after parallelize_gpt2 (models/gpt2_parallel.py)
    recompute = "none"  # "block": recompute each block's activations in backward (models/recompute.py)

    def __init__(self, config: GPT2Config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.LLMC_SKIP_INIT = True  # tied to wte, initialised there
        self.lm_head.weight = self.transformer.wte.weight
        self.apply(self._init_weights)

    def _init_weights(self, module):
        # llm.c: N(0, 0.02) everywhere, residual projections scaled by 1/sqrt(2 * n_layer)
        if isinstance(module, nn.Linear):
            std = 0.02
            if getattr(module, "LLMC_RESIDUAL_SCALE_FLAG", False):
                std = 0.02 / math.sqrt(2 * self.config.n_layer)
            if not getattr(module, "LLMC_SKIP_INIT", False):
                nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None, kv_cache=None, last_only=False):
        """idx (B, T) int token ids -> (logits (B, T, V), loss or None).

        ``targets`` (B, T) gives the mean cross-entropy (positions with target -1 are ignored, as in llm.c).
        ``kv_cache`` continues a sequence incrementally; ``last_only`` computes logits of the final position
        only (generation).
        """
        T = idx.shape[1]
        x = self.run_blocks(self.embed(idx, kv_cache), kv_cache)
        if kv_cache is not None:
            kv_cache.advance(T)
        return self.head(x, targets, last_only)

    # The three parts of forward, also run one by one by the stages of a pipeline (models/pipeline_lm.py).
    def embed(self, idx, kv_cache=None):
        """Token + position embeddings (and dropout) of idx (B, T); under sequence parallelism this rank's slice
        of the sequence."""
        T = idx.shape[1]
        start = kv_cache.length if kv_cache is not None else 0
        if start + T > self.config.block_size:
            raise ValueError(
                f"GPT2.forward: sequence of length {start + T} exceeds block_size {self.config.block_size}\n"
                "HINT: crop the context to the last block_size tokens (generate() does this)")
        pos = arange(start, start + T, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        tp = self.tp
        if tp is not None and tp.sequence_parallel:  # each rank keeps its part of the sequence between blocks
            x = tp.scatter_sequence(x)
        with sharded_random(tp, self.transformer.drop.p if self.training else 0, whole_sequence_split=True):
            return self.transformer.drop(x)

    def run_blocks(self, x, kv_cache=None):
        for layer, block in self.numbered_blocks():
            x = run_block(block, self.recompute, x, kv_cache, layer)
        return x

    def numbered_blocks(self):
        """(layer index, block) of the blocks this module runs."""
        return enumerate(self.transformer.h)

    def head(self, x, targets=None, last_only=False):
        """Final layer norm, logits and (given ``targets``) the mean cross-entropy."""
        x = self.transformer.ln_f(x)
        if last_only:
            x = x[:, -1:, :]
        logits = self.lm_head(x)
        if self.tp is not None:  # logits hold this rank's part of the vocabulary
            return self.tp.logits_and_loss(logits, targets, self.config.vocab_size)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1), ignore_index=-1)
        return logits, loss

    def new_kv_cache(self, batch_size, device, dtype=backend.float32):
        """A KV cache for this model's (local) attention heads."""
        _, block = next(iter(self.numbered_blocks()))
        return KVCache(self.config, batch_size, device, dtype, n_head=block.attn.n_head)

    def pipeline_chunk(self, layers, first, last, head=None):
        """The module a pipeline stage runs: blocks ``layers`` (and the embeddings / head when first / last)."""
        return GPT2Chunk(self, layers, first, last, head)

    def tied_weight_names(self):
        return ("transformer.wte.weight", "lm_head.weight")

    def optimizer_groups(self, weight_decay):
        """Param groups with weight decay on 2-D parameters (matmul weights, embeddings) only."""
        params = [p for p in self.parameters() if p.requires_grad]
        decay = [p for p in params if p.ndim >= 2]
        no_decay = [p for p in params if p.ndim < 2]
        return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]

    def configure_optimizers(self, weight_decay, learning_rate, betas=(0.9, 0.95), eps=1e-8):
        """AdamW over ``optimizer_groups(weight_decay)``."""
        from ..optim import AdamW

        return AdamW(self.optimizer_groups(weight_decay), lr=learning_rate, betas=betas, eps=eps)

    def num_params(self, non_embedding=False, trainable=None):
        """Parameters of the whole model; split over a tensor group, a shard counts as the tensor it is part of
        (without the vocabulary padding). ``trainable``: True counts only those that require grad, False only the
        frozen ones (LoRA's base weights)."""
        size = self.tp.size if self.tp is not None else 1
        counted = [p for p in self.parameters() if trainable is None or p.requires_grad == trainable]
        if non_embedding:
            counted = [p for p in counted if p is not self.transformer.wpe.weight]
        return sum(whole_numel(p, size) for p in counted)

    def flops_per_token(self, seq_len=None):
        """Training FLOPs per token (forward + backward), PaLM appendix B: 6N + 12 L H Q T (see models.flops)."""
        cfg = self.config
        return training_flops_per_token(self, cfg.n_layer, cfg.n_head, cfg.head_dim, seq_len or cfg.block_size)

    # ------------------------------------------------------------------------------------- weights
    @classmethod
    def from_pretrained(cls, path, device=None):
        """Load an HF GPT-2 directory (config.json + model.safetensors) or an llm.c .bin checkpoint."""
        from .gpt2_io import load_pretrained
        model = load_pretrained(cls, path)
        return model.to(device) if device is not None else model

    def save_pretrained(self, directory):
        """Write the Hugging Face layout: config.json + model.safetensors (Conv1D weights transposed)."""
        from .gpt2_io import save_hf
        save_hf(self, directory)

    def save_llmc(self, path, dtype="float32"):
        """Write llm.c's model file (magic 20240326; version 3 float32 or 5 bfloat16; vocab padded to 128)."""
        from .gpt2_io import save_llmc
        save_llmc(self, path, dtype)

    # ----------------------------------------------------------------------------------- generate
    @grad_mode.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, seed=None,
                 use_cache=True, stream=None):
        """Sample ``max_new_tokens`` after the prompts ``idx`` (B, T); see generation.py."""
        from .generation import generate
        return generate(self, idx, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                        seed=seed, use_cache=use_cache, stream=stream)


class GPT2Chunk(GPT2):
    """Some consecutive blocks of a GPT2, with the embeddings when ``first`` and the head when ``last``;
    submodules keep their names in the whole model (``transformer.h.5``, ``lm_head``)."""

    def __init__(self, model, layers, first, last, head=None):
        nn.Module.__init__(self)
        self.config, self.tp = model.config, model.tp
        self.first, self.last = first, last
        parts = {}
        if first:
            parts.update(wte=model.transformer.wte, wpe=model.transformer.wpe, drop=model.transformer.drop)
        parts["h"] = nn.ModuleDict({str(i): model.transformer.h[i] for i in layers})
        if last:
            parts["ln_f"] = model.transformer.ln_f
        self.transformer = nn.ModuleDict(parts)
        if last:
            self.lm_head = head if head is not None else model.lm_head

    def numbered_blocks(self):
        return ((int(k), block) for k, block in self.transformer.h.items())

    def forward(self, x, targets=None, kv_cache=None, last_only=False):
        if self.first:
            x = self.embed(x, kv_cache)
        x = self.run_blocks(x, kv_cache)
        return self.head(x, targets, last_only) if self.last else x
