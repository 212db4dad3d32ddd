"""GPT-2, reading top to bottom as in nanoGPT / llm.c's train_gpt2.py.

Parameter names match Hugging Face's GPT2LMHeadModel (``transformer.h.0.attn.c_attn.weight``, ...), with
nn.Linear's (out, in) layout; the HF Conv1D transpose happens in the loaders (io.py).
"""
from __future__ import annotations

import math

from ... import nn
from ..attention import TP_RANDOM, KVCache, cached_attention, sharded_random, token_positions, whole_numel  # noqa: F401
from ..causal_lm import CausalLM
from ..registry import ModelSpec, register
from .config import GPT2_PRESETS, GPT2Config
from .io import HF_CONV1D, hf_weights, llmc_weights


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


class GPT2(CausalLM):
    BODY, EMBEDDING, BLOCKS, FINAL_NORM = "transformer", ("wte", "wpe", "drop"), "h", "ln_f"
    CONTEXT_KEY = "block_size"
    hf_conv1d_weights = HF_CONV1D  # the weights HF's GPT-2 stores (in, out) (PEFT's fan_in_fan_out for their adapters)

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

    def embed(self, idx, kv_cache=None):
        """Token + position embeddings (and dropout) of idx (B, T); under sequence parallelism this rank's slice
        of the sequence."""
        T = idx.shape[1]
        start = kv_cache.length if kv_cache is not None else 0
        self.check_length(start + T)
        pos = token_positions(start, T, idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        tp = self.tp
        if tp is not None and tp.sequence_parallel:  # each rank keeps its part of the sequence between blocks
            x = tp.scatter_sequence(x)
        with sharded_random(tp, self.transformer.drop.p if self.training else 0, whole_sequence_split=True):
            return self.transformer.drop(x)

    @staticmethod
    def kv_heads(block):
        return block.attn.n_head

    def position_embeddings(self):
        return [self.transformer.wpe.weight] if "wpe" in self.transformer else []

    def tied_weight_names(self):
        return ("transformer.wte.weight", "lm_head.weight")

    # ------------------------------------------------------------------------------------- weights
    @classmethod
    def from_pretrained(cls, path, device=None, dtype=None):
        """Load an HF GPT-2 directory (config.json + model.safetensors) or an llm.c .bin checkpoint (``dtype``: the
        weights converted to it, float32 otherwise)."""
        from .io import load_pretrained
        model = load_pretrained(cls, path)
        model = model.to(device) if device is not None else model
        return model.to(dtype=dtype) if dtype is not None else model

    @classmethod
    def config_from_hf(cls, hf, source):
        """Our config from an HF config.json dict (``source`` names it in errors)."""
        from .io import hf_config_to_gpt2
        return hf_config_to_gpt2(hf, source)

    def save_pretrained(self, directory):
        """Write the Hugging Face layout: config.json + model.safetensors (Conv1D weights transposed)."""
        from .io import save_hf
        save_hf(self, directory)

    def save_llmc(self, path, dtype="float32"):
        """Write llm.c's model file (magic 20240326; version 3 float32 or 5 bfloat16; vocab padded to 128)."""
        from .io import save_llmc
        save_llmc(self, path, dtype)


def _parallelize(model, group, sequence_parallel=False):
    from .parallel import parallelize_gpt2

    return parallelize_gpt2(model, group, sequence_parallel)


SPEC = register(ModelSpec("gpt2", GPT2, GPT2Config, _parallelize, head_counts=lambda config: {"n_head": config.n_head},
                          read_hf=hf_weights, read_llmc=llmc_weights))

__all__ = ["GPT2", "GPT2Config", "GPT2_PRESETS", "KVCache", "SPEC"]
