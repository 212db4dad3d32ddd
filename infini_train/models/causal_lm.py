"""The shell every causal language model shares (as torchtitan's common decoder): the forward template (embed ->
blocks -> head), one pipeline chunk for every model, optimizer groups, parameter and FLOP counts, KV caches and
generation. A model brings its config (an ``LMConfig``), its blocks, its embedding and its names:

    BODY          the ModuleDict attribute that holds the parts ("transformer" for GPT-2, "model" for LLaMA)
    EMBEDDING     the body's parts the first pipeline stage runs (GPT-2: wte, wpe, drop; LLaMA: embed_tokens)
    BLOCKS        the body's list of blocks ("h", "layers")
    FINAL_NORM    the body's norm before the output layer ("ln_f", "norm"); the output layer is ``lm_head``

and implements ``embed(idx, kv_cache)``, ``block_args(x, kv_cache)`` (what every block takes after the hidden
states: nothing for GPT-2, the rotary tables for LLaMA), ``kv_heads(block)`` (a block's local key/value heads),
``position_embeddings()`` (parameters left out of the non-embedding count) and ``tied_weight_names()``.
"""
from __future__ import annotations

import contextlib

from .. import backend
from .. import nn
from ..autograd import grad_mode
from .attention import KVCache, whole_numel
from .documents import check_layout
from .lm_config import LMConfig
from .recompute import run_block
from .token_loss import token_loss


class CausalLM(nn.Module):
    tp = None  # a TensorParallel once the model is split over a tensor group (registry.tensor_parallel)
    recompute = "none"  # "block": recompute each block's activations in backward (models/recompute.py)
    first = last = True  # a pipeline chunk holds the embedding only when first, the head only when last
    BODY, EMBEDDING, BLOCKS, FINAL_NORM = "", (), "", ""
    CONTEXT_KEY = "context_length"  # the config field errors name for the context length
    CHUNK_ATTRIBUTES = ("config", "tp", "recompute", "training")  # plain attributes a chunk shares with its model

    @property
    def body(self):
        return getattr(self, self.BODY)

    def forward(self, idx, targets=None, kv_cache=None, last_only=False):
        """idx (B, T) int token ids -> (logits (B, T, V), loss or None).

        ``targets`` (B, T) gives the mean cross-entropy (positions with target -1 are ignored, as in llm.c).
        ``kv_cache`` continues a sequence incrementally; ``last_only`` computes logits of the final position only
        (generation). A pipeline chunk takes the previous chunk's activation unless it is the first, and returns
        its activation unless it is the last."""
        length = idx.shape[1]
        if self.first:
            check_layout(idx.shape, f"{type(self).__name__}.forward")
        x = self.embed(idx, kv_cache) if self.first else idx
        x = self.run_blocks(x, kv_cache)
        if not self.last:
            return x
        if kv_cache is not None and self.first:  # (a pipeline advances the cache once, after all its stages)
            kv_cache.advance(length)
        return self.head(x, targets, last_only)

    def pipeline_extras(self, dtype):
        """[(shape, dtype)] of what a pipeline chunk passes the next besides its hidden states (nothing here)."""
        return []

    def run_blocks(self, x, kv_cache=None):
        extra = self.block_args(x, kv_cache)
        for layer, block in self.numbered_blocks():
            x = run_block(block, self.recompute, x, *extra, kv_cache, layer)
        return x

    def block_args(self, x, kv_cache):
        return ()

    def numbered_blocks(self):
        """(layer index, block) of the blocks this module runs (a chunk keeps the whole model's indices)."""
        blocks = self.body[self.BLOCKS]
        return ((int(k), b) for k, b in blocks.items()) if isinstance(blocks, nn.ModuleDict) else enumerate(blocks)

    def head(self, x, targets=None, last_only=False):
        """Final norm, logits and (given ``targets``) the cross-entropy over the trained tokens (token_loss.py)."""
        x = self.body[self.FINAL_NORM](x)
        if last_only:
            x = x[:, -1:, :]
        logits = self.lm_head(x)
        if self.tp is not None:  # logits hold this rank's part of the vocabulary
            return self.tp.logits_and_loss(logits, targets, self.config.vocab_size)
        loss = None
        if targets is not None:
            loss = token_loss(logits.view(-1, logits.shape[-1]), targets.view(-1))
        return logits, loss

    def check_length(self, end):
        """A clear error when a sequence would run past the model's context."""
        if end > self.config.context_length:
            raise ValueError(f"{type(self).__name__}.forward: sequence of length {end} exceeds {self.CONTEXT_KEY} "
                             f"{self.config.context_length}\nHINT: crop the context to the last "
                             f"{self.config.context_length} tokens (generate() does this)")

    # ------------------------------------------------------------------------------------ pipeline
    reads_input_tokens = False  # whether the last pipeline stage's chunk reads the batch's input tokens (input_tokens)

    def input_tokens(self, idx):
        """A context in which forwards see ``idx`` (B, T) as the batch's input tokens, for modules of the last
        pipeline stage that read them (DeepSeek-V3's multi-token prediction); nothing here."""
        return contextlib.nullcontext()

    def shared_embedding_names(self):
        """(embedding, the last pipeline stage's copy) of an embedding the last stage also reads beside an untied
        output layer (summed over the embedding group), else None."""
        return None

    def pipeline_chunk(self, layers, first, last, head=None):
        """The module a pipeline stage runs: blocks ``layers`` (and the embedding / head when first / last), the
        same class as the model, whose submodules keep their names in the whole model (``transformer.h.5``,
        ``lm_head``); ``head`` replaces the output layer (a tied weight's copy on the last stage)."""
        chunk = type(self).__new__(type(self))
        nn.Module.__init__(chunk)
        for name in self.CHUNK_ATTRIBUTES:
            object.__setattr__(chunk, name, getattr(self, name))
        chunk.first, chunk.last = first, last
        parts = {name: self.body[name] for name in self.EMBEDDING} if first else {}
        parts[self.BLOCKS] = nn.ModuleDict({str(i): self.body[self.BLOCKS][i] for i in layers})
        if last:
            parts[self.FINAL_NORM] = self.body[self.FINAL_NORM]
        setattr(chunk, self.BODY, nn.ModuleDict(parts))
        if last:
            chunk.lm_head = head if head is not None else self.lm_head
        return chunk

    # ---------------------------------------------------------------------------------- accounting
    def optimizer_groups(self, weight_decay):
        """Param groups with weight decay on 2-D parameters (matmul weights, embeddings) only."""
        params = [p for p in self.parameters() if p.requires_grad]
        return [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
                {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]

    def configure_optimizers(self, weight_decay, learning_rate, betas=(0.9, 0.95), eps=1e-8):
        """AdamW over ``optimizer_groups(weight_decay)``."""
        from ..optim import AdamW

        return AdamW(self.optimizer_groups(weight_decay), lr=learning_rate, betas=betas, eps=eps)

    def num_params(self, non_embedding=False, trainable=None):
        """Parameters of the model; split over a tensor group, a shard counts as the tensor it is part of (without
        the vocabulary padding). ``non_embedding`` leaves out the embeddings that do not compute (positions, an
        untied token embedding); ``trainable``: True counts only those that require grad, False only the frozen
        ones (LoRA's base weights)."""
        size = self.tp.size if self.tp is not None else 1
        counted = [p for p in self.parameters() if trainable is None or p.requires_grad == trainable]
        if non_embedding:
            left_out = {id(p) for p in self.position_embeddings()}
            counted = [p for p in counted if id(p) not in left_out]
        return sum(whole_numel(p, size) for p in counted)

    def flops_per_token(self, seq_len=None):
        """Training FLOPs per token (forward + backward), PaLM appendix B: 6N + 12 L H Q T (see models.flops)."""
        from .flops import training_flops_per_token

        cfg = self.config
        return training_flops_per_token(self, cfg.num_layers, cfg.num_heads, cfg.head_dim,
                                        seq_len or cfg.context_length, self.idle_params)

    def idle_params(self, trainable):
        """Of the parameters ``num_params`` counts (``trainable`` or frozen), those a token does not pass through:
        none in a dense model."""
        return 0

    # ---------------------------------------------------------------------------------- generation
    def new_kv_cache(self, batch_size, device, dtype=backend.float32):
        """A KV cache for this model's (this rank's) key/value heads."""
        _, block = next(iter(self.numbered_blocks()))
        return KVCache(self.config, batch_size, device, dtype, n_head=self.kv_heads(block))

    @grad_mode.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, seed=None, use_cache=True,
                 stream=None, stop_tokens=None):
        """Sample ``max_new_tokens`` after the prompts ``idx`` (B, T), stopping a row at ``stop_tokens``; see
        generation.py."""
        from .generation import generate

        return generate(self, idx, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                        use_cache=use_cache, stream=stream, stop_tokens=stop_tokens)


__all__ = ["CausalLM", "LMConfig"]
