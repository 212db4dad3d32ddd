"""Which scaled_dot_product_attention path runs (torch.nn.attention's names): ``SDPBackend.MATH`` materialises the
(Tq, Tk) probabilities (fastest for short sequences); ``SDPBackend.FLASH_ATTENTION`` / ``EFFICIENT_ATTENTION`` run the
memory-efficient blocked algorithm (FlashAttention-2: O(T) memory). Without ``sdpa_kernel`` the path is chosen by
the key length.

    with it.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
"""
from __future__ import annotations

import contextlib
import enum

from ..autograd.ops import attention as _attention


class SDPBackend(enum.Enum):
    MATH = "math"
    FLASH_ATTENTION = "flash_attention"
    EFFICIENT_ATTENTION = "efficient_attention"


_PATHS = {SDPBackend.MATH: _attention.MATH, SDPBackend.FLASH_ATTENTION: _attention.BLOCKED,
          SDPBackend.EFFICIENT_ATTENTION: _attention.BLOCKED}


@contextlib.contextmanager
def sdpa_kernel(backends):
    """Run scaled_dot_product_attention only with ``backends`` (one SDPBackend or a list) inside the block (per
    thread; nests)."""
    chosen = [backends] if isinstance(backends, SDPBackend) else list(backends)
    bad = [b for b in chosen if not isinstance(b, SDPBackend)]
    if not chosen or bad:
        raise ValueError(f"sdpa_kernel: expected SDPBackend members (MATH, FLASH_ATTENTION, EFFICIENT_ATTENTION), "
                         f"got {backends!r}")
    previous = _attention.choice.allowed
    _attention.choice.allowed = tuple(sorted({_PATHS[b] for b in chosen}))
    try:
        yield
    finally:
        _attention.choice.allowed = previous


__all__ = ["SDPBackend", "sdpa_kernel"]
