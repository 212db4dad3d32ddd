"""Autoregressive sampling for GPT-2 under no_grad, with a per-layer KV cache.

With the cache each new token costs one position of attention. When the sequence reaches block_size the
context is cropped to the last block_size tokens and re-run (learned absolute position embeddings mean
cached keys cannot simply slide), which is what a cache-free loop does at every step.
"""
from __future__ import annotations

import numpy as np

from .. import backend
from ..autograd.grad_mode import no_grad
from ..tensor import Tensor


def sample_next(logits: np.ndarray, temperature=1.0, top_k=None, top_p=None, rng=None) -> np.ndarray:
    """Pick one token id per row of ``logits`` (B, V): greedy at temperature 0, else top-k / nucleus sampling
    (``top_k`` None or 0: no top-k, as in Hugging Face's generate)."""
    if temperature == 0:
        return logits.argmax(axis=-1)
    if temperature < 0:
        raise ValueError(f"generate: temperature must be >= 0, got {temperature}")
    logits = logits.astype(np.float64) / temperature
    if top_k is not None and int(top_k) < 0:
        raise ValueError(f"generate: top_k must be >= 0 (0: no top-k), got {top_k}")
    if top_k:
        k = min(int(top_k), logits.shape[-1])
        kth = np.partition(logits, -k, axis=-1)[:, -k][:, None]
        logits = np.where(logits < kth, -np.inf, logits)
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    if top_p is not None:
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"generate: top_p must be in (0, 1], got {top_p}")
        order = np.argsort(-probs, axis=-1)
        sorted_probs = np.take_along_axis(probs, order, axis=-1)
        # keep the smallest prefix whose mass reaches top_p (always at least the top token)
        drop_sorted = np.cumsum(sorted_probs, axis=-1) - sorted_probs >= top_p
        drop = np.zeros_like(drop_sorted)
        np.put_along_axis(drop, order, drop_sorted, axis=-1)
        probs = np.where(drop, 0.0, probs)
        probs /= probs.sum(axis=-1, keepdims=True)
    rng = rng or backend.host_generator()
    u = rng.random((probs.shape[0], 1))
    choice = (np.cumsum(probs, axis=-1) < u).sum(axis=-1)
    return np.minimum(choice, probs.shape[-1] - 1)


@no_grad()
def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, seed=None, use_cache=True,
             stream=None, stop_tokens=None):
    """Extend each prompt row of ``idx`` (B, T) by ``max_new_tokens`` sampled tokens; returns (B, T + new).

    ``stream(tokens)`` is called with each step's new token ids (numpy, shape (B,)) as they are produced.
    ``stop_tokens``: ids that end a row (an end-of-sequence or end-of-turn token, kept in the output, as HF's
    generate keeps its EOS); a row that stopped repeats its stop token while the others go on, and generation ends
    once every row has stopped (the result is then shorter than T + max_new_tokens).
    """
    if not isinstance(idx, Tensor):
        idx = Tensor(np.asarray(idx, dtype=np.int64))
    if idx.ndim == 1:
        idx = idx.view(1, -1)
    block = model.config.context_length
    B, T0 = idx.shape
    if T0 == 0:
        raise ValueError("generate: the prompt is empty\nHINT: start from the end-of-text token")
    if T0 > block:
        raise ValueError(f"generate: the prompt has {T0} tokens, more than block_size {block}\n"
                         f"HINT: shorten the prompt or keep its last {block} tokens")
    device = idx.device
    rng = np.random.default_rng(seed) if seed is not None else None
    tokens = np.zeros((B, T0 + max_new_tokens), dtype=np.int64)
    tokens[:, :T0] = idx.numpy()
    was_training = model.training
    model.eval()
    try:
        dtype = next(iter(model.parameters())).dtype  # the cache holds keys and values in the model's dtype
        cache = model.new_kv_cache(B, device, dtype) if use_cache else None
        length = T0
        stops = np.asarray(sorted(set(int(t) for t in stop_tokens or ())), np.int64)
        stopped = np.zeros(B, bool)
        logits, _ = model(idx, kv_cache=cache, last_only=True)
        for _ in range(max_new_tokens):
            nxt = sample_next(logits.numpy()[:, -1, :], temperature, top_k, top_p, rng)
            if stops.size:
                nxt = np.where(stopped, tokens[:, length - 1], nxt)
                stopped |= np.isin(nxt, stops)
            tokens[:, length] = nxt
            length += 1
            if stream is not None:
                stream(nxt)
            if length == tokens.shape[1] or stopped.all():
                break
            if cache is not None and length <= block:
                step = Tensor._make(backend.to_device_array(tokens[:, length - 1:length], device), device)
                logits, _ = model(step, kv_cache=cache, last_only=True)
            else:
                window = tokens[:, max(0, length - block):length]
                if cache is not None:
                    cache.reset()
                ctx = Tensor._make(backend.to_device_array(np.ascontiguousarray(window), device), device)
                logits, _ = model(ctx, kv_cache=cache, last_only=True)
    finally:
        model.train(was_training)
    return Tensor._make(backend.to_device_array(np.ascontiguousarray(tokens[:, :length]), device), device)
