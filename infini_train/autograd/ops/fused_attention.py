"""scaled_dot_product_attention through the tensor-core kernels (kernels/flash_attention.py): one kernel forward,
three backward, q, k, v in bfloat16 or float16 on a GPU, no mask. A registry kernel (kernels/registry.py): chosen
when INFINI_TRAIN_KERNELS selects it (by default: verified); everywhere else, and for arrays the kernels do not take,
the materialised Op (attention.py) runs as before. The results are the kernels' (flash_attention's NumPy reference
is their arithmetic): the output and each row's log-sum-exp are kept, and backward recomputes the probabilities from
them.
Dropout draws the same seed and mask as the array path (attention_dropout.py), and a double backward differentiates
the same composite."""
from __future__ import annotations

import math

from ... import backend
from ...kernels import flash_attention as flash
from .attention import ScaledDotProductAttention
from .attention_dropout import draw_seed
from ..autocast import get_autocast_dtype, is_autocast_enabled


def applies(q, k, v):
    """Whether the kernels may take these tensors (checked again on the arrays in forward): on a GPU, of (or cast
    by autocast to) bfloat16 or float16, (B, H, T, D) with a head dim the kernels have."""
    if not (q.device.type == "cuda" and k.device == q.device and v.device == q.device):
        return False
    dtype = q.dtype
    if is_autocast_enabled("cuda") and dtype in (backend.float32, backend.bfloat16, backend.float16):
        dtype = get_autocast_dtype("cuda")
    return (dtype.name in flash.DTYPES and q.ndim == 4 and k.ndim == 4 and v.ndim == 4
            and q.shape[-1] in flash.HEAD_DIMS)


class FusedAttention(ScaledDotProductAttention):
    fused = False

    def forward(self, q, k, v):
        problem = flash.why_not(q, k, v, self.dropout_p, 0, self.is_causal)
        if problem is not None or not flash.ready(q.dtype, q.shape[-1]):
            return super().forward(q, k, v)
        self._check(q, k, v, None)
        self.fused = True
        self.in_dtype = q.dtype
        self.tq, self.tk = q.shape[-2], k.shape[-2]
        self.used_scale = self.scale if self.scale is not None else 1.0 / math.sqrt(q.shape[-1])
        self.seed = draw_seed(self.device) if self.dropout_p > 0.0 else None
        out, lse = flash.forward(self.xp, q, k, v, self.used_scale, self.is_causal, 0, self.seed, self.dropout_p)
        self.stash(out, lse)
        return out

    def backward(self, g):
        if not self.fused:
            return super().backward(g)
        q, k, v = self.saved_arrays[:3]
        out, lse = self.stashed
        grads = flash.backward(self.xp, q, k, v, out, lse, g, self.used_scale, self.is_causal, 0, self.seed,
                               self.dropout_p)
        return tuple(grad if need else None for grad, need in zip(grads, self.needs_input_grad[:3]))


__all__ = ["FusedAttention", "applies"]
