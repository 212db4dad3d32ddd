"""The KV cache of multi-head latent attention: per layer and token, the compressed latent (kv_lora_rank, after its
RMSNorm) and the rotated rope key (qk_rope_head_dim, shared by every head) -- not the expanded per-head keys and
values, which attention recomputes from them (kv_b_proj) at each step. That is the memory MLA exists for:
``cache_bytes_per_token`` against a LLaMA of the same width."""
from __future__ import annotations

import numpy as np

from ... import backend
from ...tensor import Tensor


class MLACache:
    """Preallocated to the context length, written in place (no_grad only); ``length``, ``advance`` and ``reset`` as
    KVCache's (models/attention.py), which generation drives. ``absorbed``: attention over it folds kv_b_proj into
    the queries and the output instead of expanding the keys and values."""

    def __init__(self, config, batch_size, device, dtype=backend.float32, absorbed=False):
        dev = backend.Device.parse(device)
        xp = dev.array_module()
        T = config.context_length
        with dev.context():
            self.latents = [xp.zeros((batch_size, T, config.kv_lora_rank), dtype) for _ in range(config.num_layers)]
            self.rope_keys = [xp.zeros((batch_size, 1, T, config.qk_rope_head_dim), dtype)
                              for _ in range(config.num_layers)]
        self.length, self.capacity, self.device = 0, T, dev
        self.absorbed = absorbed  # attention reads the latents by weight absorption (model.py)

    def append(self, layer, latent, k_rot):
        """Store latent (B, T, rank) and k_rot (B, 1, T, rope) at the next positions of ``layer``; return both over
        every position so far."""
        t0, t1 = self.length, self.length + latent.shape[1]
        self.latents[layer][:, t0:t1] = latent.array
        self.rope_keys[layer][:, :, t0:t1] = k_rot.array
        return (Tensor._make(self.latents[layer][:, :t1], self.device),
                Tensor._make(self.rope_keys[layer][:, :, :t1], self.device))

    def advance(self, steps):
        self.length += steps

    def reset(self):
        self.length = 0

    def nbytes(self):
        return sum(a.nbytes for a in self.latents + self.rope_keys)


def cache_bytes_per_token(config, dtype=np.float32):
    """{"mla": bytes MLA caches per token (every layer's latent and rope key), "llama": bytes a LLaMA of the same
    width caches (n_layers layers of n_heads key and value heads of dim / n_heads), "ratio": llama / mla}."""
    size = np.dtype(dtype).itemsize
    mla = config.num_layers * (config.kv_lora_rank + config.qk_rope_head_dim) * size
    llama = config.num_layers * 2 * config.dim * size
    return {"mla": mla, "llama": llama, "ratio": llama / mla}


__all__ = ["MLACache", "cache_bytes_per_token"]
