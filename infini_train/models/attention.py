"""What GPT-2 and LLaMA share around attention: the KV cache of incremental decoding, causal attention over
the cache (or within each packed document: documents.py), where dropout draws its masks under tensor parallelism, and
counting a sharded model's parameters."""
from __future__ import annotations

import contextlib

import numpy as np

from .. import backend
from ..nn import functional as F
from ..creation import arange
from ..nn.parallel.context_parallel import active_group, context_attention, local_positions
from ..nn.parallel.tensor_parallel import TP_RANDOM
from .documents import active_layout


class KVCache:
    """Per-layer key/value buffers for incremental decoding: each new token attends over the cached prefix
    instead of re-running it. Buffers are preallocated to the context length and written in place (no_grad only).
    ``n_head``: the heads whose keys and values are cached (this rank's, or LLaMA's key/value heads; default the
    config's key/value heads); ``config`` (an LMConfig) gives num_layers, context_length and head_dim."""

    def __init__(self, config, batch_size: int, device, dtype=backend.float32, n_head=None):
        dev = backend.Device.parse(device)
        xp = dev.array_module()
        shape = (batch_size, n_head or config.num_kv_heads, config.context_length, config.head_dim)
        with dev.context():
            self.keys = [xp.zeros(shape, dtype) for _ in range(config.num_layers)]
            self.values = [xp.zeros(shape, dtype) for _ in range(config.num_layers)]
        self.length = 0  # positions filled so far
        self.capacity = config.context_length
        self.device = dev

    def append(self, layer: int, k, v):
        """Store k, v (B, nh, T, hd) at the next positions of ``layer``; return the keys/values so far."""
        t0, t1 = self.length, self.length + k.shape[2]
        self.keys[layer][:, :, t0:t1] = k.array
        self.values[layer][:, :, t0:t1] = v.array
        from ..tensor import Tensor
        return (Tensor._make(self.keys[layer][:, :, :t1], self.device),
                Tensor._make(self.values[layer][:, :, :t1], self.device))

    def advance(self, steps: int):
        self.length += steps

    def reset(self):
        self.length = 0


def sharded_random(tp, dropout_p, whole_sequence_split=False):
    """Where dropout draws its mask. Under tensor parallelism, activations split across the group (attention
    heads; with sequence parallelism, the residual stream too: ``whole_sequence_split``) draw each rank's own
    mask from a stream seeded per rank; elsewhere the default stream, the same on every rank of the group."""
    if tp is None or not dropout_p or (whole_sequence_split and not tp.sequence_parallel):
        return contextlib.nullcontext()
    return backend.fork_rng(TP_RANDOM)


def cached_attention(q, k, v, kv_cache, layer, dropout_p=0.0, enable_gqa=False, sinks=None, window=None):
    """Causal attention of q over k, v (B, heads, T, hd); with ``kv_cache`` the new keys and values are appended
    to ``layer``'s cache first and the queries (the last T positions) attend over everything cached. ``sinks``
    (heads,) and a sliding ``window`` (keys within window - 1 positions before the query) as
    scaled_dot_product_attention takes them (gpt-oss)."""
    mask, causal = None, True
    group = active_group()
    layout = active_layout()
    if layout is not None:  # packed documents: each attends to itself only
        if kv_cache is not None or group is not None:
            raise ValueError("attention: packed documents run whole sequences without a KV cache or context "
                             "parallelism\nHINT: generate and run context-parallel forwards outside packed_documents")
        return F.scaled_dot_product_attention(q, k, v, attn_mask=layout.attention_mask(q.device), dropout_p=dropout_p,
                                              enable_gqa=enable_gqa, sinks=sinks, sliding_window=window)
    if group is not None and kv_cache is None:  # a sequence split over context-parallel ranks
        return context_attention(q, k, v, dropout_p=dropout_p, enable_gqa=enable_gqa, sinks=sinks, window=window)
    if kv_cache is not None:
        past = kv_cache.length
        k, v = kv_cache.append(layer, k, v)
        T = q.shape[2]
        if past:
            causal = False
            if T > 1 or window is not None:  # new queries sit at the end of the key range: bottom-right aligned
                lag = np.arange(T).reshape(T, 1) + past - np.arange(past + T).reshape(1, past + T)
                allowed = (lag >= 0) & (lag < window) if window is not None else lag >= 0
                from ..tensor import Tensor
                mask = Tensor._make(backend.to_device_array(allowed, q.device), q.device)
                window = None  # (folded into the mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal,
                                          enable_gqa=enable_gqa, sinks=sinks, sliding_window=window)


def token_positions(start, length, device):
    """The positions of a forward's ``length`` tokens: start .. start+length-1, under context parallelism the
    global positions of this rank's chunks (an int64 Tensor), or for packed documents each row's (B, T) positions."""
    from ..tensor import Tensor

    layout = active_layout()
    if layout is not None:
        return layout.position_ids(device)
    group = active_group()
    if group is None:
        return arange(start, start + length, device=device)
    return Tensor._make(backend.to_device_array(local_positions(length, group), device), device)


def whole_numel(param, tp_size):
    spec = param.placement.tensor_shard
    if spec is None:
        return param.numel()
    length = param.shape[spec.dim]
    return param.numel() // length * (spec.whole_size if spec.whole_size is not None else length * tp_size)


__all__ = ["KVCache", "cached_attention", "sharded_random", "TP_RANDOM", "whole_numel", "token_positions"]
