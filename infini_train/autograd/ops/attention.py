"""scaled_dot_product_attention as one fused Op: scores, masks, stable softmax, dropout and the weighted sum
in forward; the analytic gradient in backward. Only the probabilities (and a bool dropout mask) are kept.

Forward:  S = q k^T * scale + mask,  P = softmax(S),  O = dropout(P) v
Backward: dV = dropout(P)^T dO,  dP = dropout'(dO v^T),  dS = P * (dP - rowsum(dP * P)),
          dQ = dS k * scale,  dK = dS^T q * scale,  dMask = dS (float masks only).

Attention sinks (gpt-oss): a learned logit per head that joins every row's softmax denominator and carries no
value, P_ij = exp(S_ij) / (exp(sink_h) + sum_j exp(S_ij)) (Hugging Face's GptOssAttention concatenates it to the
scores and drops its column after the softmax). The rows then sum to 1 - P_sink, dS keeps its form (the sink's
column has no dP) and dSink_h = -sum over the head's rows of P_sink * rowsum(dP * P). A sliding window keeps query
i to the keys j > i - window (top-left aligned, as is_causal); masked blocks are plain -inf biases here.
Scalar factors (the attention scale, the dropout's 1/(1-p)) are applied to the (T, E)-sized results rather
than to the (T, T)-sized score matrices.

Grouped-query attention (enable_gqa=True): k and v may have fewer heads (dim -3) than q, dividing q's. They are
repeated head by head (torch's repeat_interleave) to q's heads before the same computation, and backward sums
the gradients of each group of repeated heads back onto its shared k/v head.

float16/bfloat16 inputs: scores, probabilities and the weighted sum are computed in float32 (on the host q, k, v
are widened once, see low_precision.py), the output and the gradients are rounded once to the inputs' dtype."""
from __future__ import annotations

import math
import threading

import numpy as np

from ...kernels import registry
from ...kernels import softmax as softmax_kernels
from ...tensor import Tensor
from . import low_precision as lp
from .attention_dropout import draw_seed, keep_block
from ..double_backward import recomputed_grads
from ..function import Op, op_error, sum_to

_NAME = "scaled_dot_product_attention"
MATH, BLOCKED = "math", "blocked"  # the materialised path (this file) and the memory-efficient one (flash_attention.py)
AUTO_BLOCKED_KEYS = 1024  # with no choice made, key lengths above this take the memory-efficient path


class _Choice(threading.local):
    allowed = None  # a tuple of MATH / BLOCKED set by nn.attention.sdpa_kernel, or None: chosen by size


choice = _Choice()
_CAUSAL_BLOCK_ROWS = 128
_causal_cache = {}  # (Tq, Tk, window, dtype, device) -> additive (Tq, Tk) mask: 0 where attended, -inf elsewhere


def _causal_bias(xp, device, tq, tk, dtype, causal=True, window=None):
    """-inf above the diagonal (causal: torch keeps tril(ones(Tq, Tk)), top-left aligned) and, with a sliding
    ``window``, on keys j <= i - window; 0 elsewhere."""
    key = (tq, tk, causal, window, np.dtype(dtype).str, device)
    bias = _causal_cache.get(key)
    if bias is None:
        if len(_causal_cache) > 16:
            _causal_cache.clear()
        lag = xp.arange(tq).reshape(-1, 1) - xp.arange(tk).reshape(1, -1)  # query i minus key j
        masked = lag < 0 if causal else xp.zeros((tq, tk), dtype=bool)
        if window is not None:
            masked |= lag >= window
        bias = _causal_cache[key] = xp.where(masked, xp.asarray(-np.inf, dtype), xp.asarray(0, dtype))
    return bias


def sink_rows(sinks, dtype):
    """The sinks (heads,) as a (heads, 1, 1) column that broadcasts against scores (..., heads, Tq, Tk)."""
    return sinks.astype(dtype, copy=False).reshape(-1, 1, 1)


def _row_max(xp, scores):
    # numpy's fmax.reduce is 2-3x faster than .max() along the last axis (no NaN bookkeeping); a row holding
    # a NaN ends up NaN through exp either way.
    if xp.__name__ == "numpy":
        return xp.fmax.reduce(scores, axis=-1, keepdims=True)
    return scores.max(axis=-1, keepdims=True)


class ScaledDotProductAttention(Op):
    """Inputs: q, k, v, then the mask when ``has_mask`` and the sinks (heads,) when ``has_sinks``."""

    def __init__(self, is_causal=False, scale=None, dropout_p=0.0, enable_gqa=False, window=None, has_mask=False,
                 has_sinks=False, dropout_heads=None):
        self.is_causal = is_causal
        self.scale = scale
        self.dropout_p = dropout_p
        self.enable_gqa = enable_gqa
        self.window = window
        self.has_mask, self.has_sinks = has_mask, has_sinks
        self.dropout_heads = dropout_heads

    def _extras(self, rest):
        """(mask, sinks) of the inputs after q, k, v (None where absent)."""
        mask = rest[0] if self.has_mask else None
        sinks = rest[int(self.has_mask)] if self.has_sinks else None
        return mask, sinks

    def _check_sinks(self, q, sinks):
        if sinks is None:
            return
        heads = q.shape[-3] if q.ndim > 2 else None
        if heads is None or sinks.shape != (heads,) or sinks.dtype.kind not in "fV":
            raise op_error(_NAME, f"sinks of shape ({heads},) for q (..., heads, Tq, E): one floating logit per "
                           "query head",
                           f"sinks of shape {sinks.shape} and dtype {sinks.dtype}", "q's heads are its dim -3")

    def _check(self, q, k, v, mask):
        if q.ndim < 2 or k.ndim < 2 or v.ndim < 2 or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
            raise op_error(_NAME, "q (..., Tq, E), k (..., Tk, E), v (..., Tk, Ev)",
                           f"q {q.shape}, k {k.shape}, v {v.shape}",
                           "q and k share the last dim E; k and v share the key length Tk")
        kv_batch = self._gqa_batch_dims(q, k, v) if self.enable_gqa else (k.shape[:-2], v.shape[:-2])
        try:
            batch = np.broadcast_shapes(q.shape[:-2], *kv_batch)
        except ValueError:
            hint = "use the same (batch, heads) leading dims for q, k and v"
            if not self.enable_gqa and min(q.ndim, k.ndim, v.ndim) >= 3 and q.shape[-3] != k.shape[-3]:
                hint += "; for k and v with fewer heads than q (grouped-query attention) pass enable_gqa=True"
            raise op_error(_NAME, "batch dims of q, k, v that broadcast", f"q {q.shape}, k {k.shape}, v {v.shape}",
                           hint) from None
        if q.dtype != k.dtype or q.dtype != v.dtype or q.dtype.kind not in "fV":
            raise op_error(_NAME, "q, k, v of one floating dtype", f"{q.dtype}, {k.dtype}, {v.dtype}",
                           "cast with .to(dtype)")
        scores_shape = batch + (q.shape[-2], k.shape[-2])
        if mask is not None:
            if mask.dtype != bool and mask.dtype.kind not in "fV":
                raise op_error(_NAME, "a bool or floating attn_mask", f"attn_mask of dtype {mask.dtype}",
                               "bool: True takes part in attention; float: added to the scores")
            try:
                fits = np.broadcast_shapes(mask.shape, scores_shape) == scores_shape
            except ValueError:
                fits = False
            if not fits:
                raise op_error(_NAME, f"an attn_mask broadcastable to the scores' shape {scores_shape}",
                               f"attn_mask of shape {mask.shape}", "the mask's last two dims are (Tq, Tk)")
        return scores_shape

    @staticmethod
    def _gqa_batch_dims(q, k, v):
        """The batch dims of k and v once their heads are repeated to q's; checks that their heads divide q's."""
        if min(q.ndim, k.ndim, v.ndim) < 3:
            raise op_error(_NAME, "q, k, v of shape (..., heads, T, E) with enable_gqa=True",
                           f"q {q.shape}, k {k.shape}, v {v.shape}", "the heads are dim -3")
        heads = q.shape[-3]
        for name, a in (("k", k), ("v", v)):
            if a.shape[-3] == 0 or heads % a.shape[-3]:
                raise op_error(_NAME, f"{name} heads that divide q's {heads} heads (enable_gqa=True)",
                               f"{name} of shape {a.shape}",
                               "each group of q heads attends to one shared k/v head: q's heads must be a "
                               "multiple of k's and v's heads (dim -3)")
        return k.shape[:-3] + (heads,), v.shape[:-3] + (heads,)

    def _repeat_heads(self, heads, *arrays):
        """k/v repeated head by head to ``heads`` heads (torch's repeat_interleave on dim -3) for enable_gqa;
        a single head is left to broadcast."""
        if not self.enable_gqa:
            return arrays
        return tuple(a if a is None or a.shape[-3] in (1, heads) else self.xp.repeat(a, heads // a.shape[-3], axis=-3)
                     for a in arrays)

    def _blocks(self, tq, tk):
        """Query row ranges [q0, q1) and the key prefix each needs. Causal rows [q0, q1) see keys [0, q1) only,
        so blocks of >= 128 rows skip the masked upper triangle: 25% less work at T=256, ~40% at T=1024."""
        if not self.is_causal or tq < 2 * _CAUSAL_BLOCK_ROWS:
            return [(0, tq, tk)]
        rows = max(_CAUSAL_BLOCK_ROWS, -(-tq // 8))
        return [(q0, min(q0 + rows, tq), min(q0 + rows, tq, tk)) for q0 in range(0, tq, rows)]

    def _probs(self, q_rows, k_keys, mask, q0, q1, scale_q, sinks=None):
        """softmax(q_rows @ k_keys^T * scale + masks) for one block of query rows, in place, in >= float32, and
        the sink's probability per row (None without sinks)."""
        xp = self.xp
        scores = lp.matmul(xp, q_rows, xp.swapaxes(k_keys, -1, -2))
        if xp is not np and mask is None and sinks is None and self.window is None:  # one pass over the scores
            # on GPUs (kernels/softmax.py)
            probs = softmax_kernels.rows(xp, scores, 1.0 if scale_q else self.used_scale, self.is_causal, q0, q1 - q0)
            if probs is not None:
                return probs, None
        if scores.dtype.itemsize < 4:
            scores = scores.astype(xp.float32)
        if not scale_q:
            scores *= self.used_scale
        if self.is_causal or self.window is not None:
            causal = _causal_bias(xp, self.device, self.tq, self.tk, scores.dtype, self.is_causal, self.window)
            scores += causal[q0:q1, :scores.shape[-1]]
        if mask is not None:
            if mask.dtype == bool:
                mask = xp.where(mask, xp.asarray(0, scores.dtype), xp.asarray(-np.inf, scores.dtype))
            scores += mask
        row_max = _row_max(xp, scores)
        if sinks is not None:  # the sink joins the max and the sum (a fully masked row: the sink takes it all)
            sink = sink_rows(sinks, scores.dtype)
            row_max = xp.maximum(row_max, sink)
        elif mask is not None or self.window is not None:  # a fully masked row gives zeros (torch's safe softmax)
            row_max[row_max == -np.inf] = 0
        scores -= row_max
        xp.exp(scores, out=scores)
        row_sum = scores.sum(axis=-1, keepdims=True)
        sink_probs = None
        if sinks is not None:
            sink_probs = xp.exp(sink - row_max)
            row_sum += sink_probs
            sink_probs /= row_sum
        elif mask is not None or self.window is not None:
            row_sum[row_sum == 0] = 1
        scores /= row_sum
        return scores, sink_probs

    def forward(self, q, k, v, *rest):
        xp = self.xp
        mask, sinks = self._extras(rest)
        self._check(q, k, v, mask)
        self._check_sinks(q, sinks)
        self.in_dtype = q.dtype
        q, k, v = lp.widen(xp, q, k, v)
        k, v = self._repeat_heads(q.shape[-3] if q.ndim > 2 else 1, k, v)
        self.tq, self.tk = tq, tk = q.shape[-2], k.shape[-2]
        self.used_scale = self.scale if self.scale is not None else 1.0 / math.sqrt(q.shape[-1])
        scale_q = q.shape[-1] < tk  # scale whichever is smaller: q (..., Tq, E) or the scores (..., Tq, Tk)
        q_scaled = q * self.used_scale if scale_q else q
        blocks = self._blocks(tq, tk)
        self.seed = draw_seed(self.device) if self.dropout_p > 0.0 else None
        outs, probs, keeps, sink_probs = [], [], [], []
        for q0, q1, keys in blocks:
            block_probs, block_sink = self._probs(q_scaled[..., q0:q1, :], k[..., :keys, :], mask, q0, q1, scale_q,
                                                  sinks)
            sink_probs.append(block_sink)
            weights, keep = block_probs, None
            if self.dropout_p > 0.0:
                keep = keep_block(xp, self.seed, block_probs.shape[:-2], tq, tk, q0, q1, 0, keys, self.dropout_p,
                                  self.dropout_heads)
                weights = block_probs * (1.0 / (1.0 - self.dropout_p))
                weights *= keep
            outs.append(lp.matmul(xp, weights, v[..., :keys, :]))
            probs.append(block_probs)
            keeps.append(keep)
        self.stash(blocks, probs, keeps, sink_probs)
        out = outs[0] if len(outs) == 1 else xp.concatenate(outs, axis=-2)
        return lp.narrow(xp, out, self.in_dtype)

    def setup_context(self, inputs, output):
        # q, k and v by reference (the first-order backward reads k for dq, q for dk, v for the scores; a double
        # backward recomputes the forward from all three and the mask)
        self.save_for_backward(*inputs)

    def backward(self, g):
        xp = self.xp
        q, k, v = lp.widen(xp, *self.saved_arrays[:3])
        blocks, probs, keeps, sink_probs = self.stashed
        shapes = self._input_shapes
        k, v = self._repeat_heads(shapes[0][-3] if len(shapes[0]) > 2 else 1, k, v)
        need_q, need_k, need_v = self.needs_input_grad[:3]
        need_mask = self.has_mask and self.needs_input_grad[3]
        need_sinks = self.has_sinks and self.needs_input_grad[-1]
        drop_scale = 1.0 / (1.0 - self.dropout_p) if self.dropout_p > 0.0 else 1.0
        coef = self.used_scale * drop_scale
        g = g.astype(probs[0].dtype, copy=False)
        parts_q, parts_k, parts_v = [], [], []
        grad_mask = grad_sinks = None
        for (q0, q1, keys), p, keep, p_sink in zip(blocks, probs, keeps, sink_probs):
            g_rows = g[..., q0:q1, :]
            if need_v:
                weights = p if keep is None else p * keep
                parts_v.append(lp.matmul(xp, xp.swapaxes(weights, -1, -2), g_rows))
            if not (need_q or need_k or need_mask or need_sinks):
                continue
            ds = lp.matmul(xp, g_rows, xp.swapaxes(v[..., :keys, :], -1, -2))  # dP, up to the dropout's 1/(1-p)
            if keep is not None:
                ds *= keep
            fused = xp is not np and p_sink is None and softmax_kernels.rows_backward(xp, p, ds) is not None
            if not fused:
                ds *= p
                row = ds.sum(axis=-1, keepdims=True)
                if need_sinks:  # dSink = -P_sink * rowsum(dP * P), summed over every row of the head
                    part = _sum_to_heads(xp, -(p_sink * row), shapes[-1][0])
                    grad_sinks = part if grad_sinks is None else grad_sinks + part
                if self.retain_graph:
                    ds -= p * row
                else:  # p is not needed any more: reuse it instead of allocating a temporary
                    p *= row
                    ds -= p
            if need_q:
                parts_q.append(lp.matmul(xp, ds, k[..., :keys, :]))
            if need_k:
                parts_k.append(lp.matmul(xp, xp.swapaxes(ds, -1, -2), q[..., q0:q1, :]))
            if need_mask:  # masks and is_causal exclude each other: a single block
                if keep is not None:
                    ds *= drop_scale
                grad_mask = sum_to(ds, shapes[3])
        grad_q = grad_k = grad_v = None
        if need_q:  # the blocks' query rows are disjoint and in order
            grad_q = self._finish(parts_q[0] if len(parts_q) == 1 else xp.concatenate(parts_q, axis=-2), coef, 0)
        if need_k:
            grad_k = self._finish(_sum_key_prefixes(xp, parts_k, self.tk), coef, 1)
        if need_v:
            grad_v = self._finish(_sum_key_prefixes(xp, parts_v, self.tk), drop_scale, 2)
        if grad_sinks is not None:
            grad_sinks = lp.narrow(xp, grad_sinks * drop_scale, self.saved_arrays[-1].dtype)
        return self._with_extras((grad_q, grad_k, grad_v), grad_mask, grad_sinks)

    def _with_extras(self, grads, grad_mask, grad_sinks):
        """The gradients of q, k, v followed by the mask's and the sinks' where they are inputs."""
        return grads + ((grad_mask,) if self.has_mask else ()) + ((grad_sinks,) if self.has_sinks else ())

    def backward_graph(self, g):
        saved = self.saved_tensors
        return recomputed_grads(self, self._composite, saved, g)[:len(saved)]

    def _composite(self, q, k, v, *rest):
        """Attention in differentiable ops (the same dropout mask), for double backward."""
        from .elementwise import where
        from .joins import cat

        mask, sinks = self._extras(rest)
        xp, dev = self.xp, q.device
        if self.enable_gqa and q.ndim > 2:
            heads = q.shape[-3]
            k, v = (a if a.shape[-3] in (1, heads) else _repeat_heads_graph(a, heads) for a in (k, v))
        scores = (q @ k.transpose(-1, -2)) * self.used_scale
        if self.is_causal or self.window is not None:
            scores = scores + Tensor._make(_causal_bias(xp, dev, self.tq, self.tk, scores.dtype, self.is_causal,
                                                        self.window), dev)
        if mask is not None:
            if mask.dtype == bool:
                mask = Tensor._make(xp.where(mask.array, 0.0, -np.inf).astype(scores.dtype), dev)
            scores = scores + mask
        if sinks is not None:  # the sink's column joins the softmax, then is dropped
            column = sinks.to(scores.dtype).reshape(-1, 1, 1).expand(tuple(scores.shape[:-1]) + (1,))
            probs = cat([scores, column], -1).softmax(-1)[..., :-1]
        else:
            probs = scores.softmax(-1)
        if (mask is not None or self.window is not None) and sinks is None:  # a fully masked row attends to
            # nothing (zeros), as the forward's safe softmax
            blocked = Tensor._make(xp.isneginf(scores.array).all(axis=-1, keepdims=True), dev)
            probs = where(blocked, 0.0, probs)
        if self.dropout_p > 0.0:  # the forward's mask: a function of the positions (attention_dropout.py)
            keep = keep_block(xp, self.seed, tuple(probs.shape[:-2]), self.tq, self.tk, 0, self.tq, 0, self.tk,
                              self.dropout_p, self.dropout_heads)
            probs = probs * Tensor._make(keep * (1.0 / (1.0 - self.dropout_p)), dev)
        return probs @ v

    def _finish(self, grad, coef, input_index):
        """Apply the scalar factor to the (T, E)-sized gradient, sum repeated k/v heads over their group, undo
        batch broadcasting, cast to the input dtype."""
        if coef != 1.0:
            grad *= coef
        shape = self._input_shapes[input_index]
        if self.enable_gqa and input_index > 0 and shape[-3] not in (1, grad.shape[-3]):
            heads = shape[-3]
            grad = grad.reshape(grad.shape[:-3] + (heads, grad.shape[-3] // heads) + grad.shape[-2:]).sum(axis=-3)
        return lp.narrow(self.xp, sum_to(grad, shape), self.in_dtype)


def _repeat_heads_graph(a, heads):
    """``a`` (..., h, T, E) with each head repeated to ``heads`` heads (repeat_interleave on dim -3), by expand and
    reshape, which double backward differentiates."""
    h = a.shape[-3]
    lead = tuple(a.shape[:-3])
    grown = a.reshape(lead + (h, 1) + tuple(a.shape[-2:])).expand(lead + (h, heads // h) + tuple(a.shape[-2:]))
    return grown.reshape(lead + (heads,) + tuple(a.shape[-2:]))


def _sum_to_heads(xp, grad, heads):
    """A (..., heads, T, 1) gradient summed onto the (heads,) sinks."""
    return grad.reshape(-1, heads, grad.shape[-2]).sum(axis=(0, 2))


def _sum_key_prefixes(xp, parts, keys):
    """Sum per-block gradients (..., keys_i, E) over growing key prefixes, as if zero-padded to ``keys`` rows."""
    last = parts[-1]
    if last.shape[-2] == keys:  # the last block saw every key; a fresh matmul result, so adding into it is safe
        total, parts = last, parts[:-1]
    else:  # causal with Tq < Tk: keys after the last query get no gradient
        total = xp.zeros(last.shape[:-2] + (keys, last.shape[-1]), dtype=last.dtype)
    for part in parts:
        total[..., :part.shape[-2], :] += part
    return total


def _blocked():
    from .flash_attention import BlockedAttention

    return BlockedAttention


def scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False, sinks=None, sliding_window=None, dropout_heads=None):
    """softmax(q @ k^T * scale + mask) @ v for q (..., Tq, E), k (..., Tk, E), v (..., Tk, Ev), as torch.

    ``attn_mask``: bool (True = takes part) or float (added to the scores), broadcastable to (..., Tq, Tk).
    ``is_causal`` keeps tril(ones(Tq, Tk)) (top-left aligned, as torch). ``scale`` defaults to 1/sqrt(E).
    ``dropout_p`` drops attention weights with a mask from the generator seeded by ``manual_seed``.
    ``enable_gqa``: k and v may have fewer heads (dim -3) than q, dividing q's (grouped-query attention): q head
    h attends to k/v head h // (q heads / k heads), as torch. A fully masked query row gives a zero output.
    ``sinks`` (heads,): attention sinks (gpt-oss), a learned logit per query head that joins each row's softmax
    denominator without a value: P_ij = exp(S_ij) / (exp(sinks[h]) + sum_j exp(S_ij)); it gets its gradient.
    ``sliding_window`` (an int >= 1): query i attends only to keys j > i - sliding_window (with is_causal, HF's
    sliding-window causal attention: the query and the sliding_window - 1 keys before it), top-left aligned as
    is_causal; combines with attn_mask too. ``dropout_heads`` (offset, total): q's heads are heads offset ..
    offset + heads - 1 of an attention over ``total`` heads (a rank's share under Ulysses context parallelism), and
    dropout draws their masks in that attention (attention_dropout.py).

    Key lengths above ``AUTO_BLOCKED_KEYS`` take the memory-efficient path (flash_attention.py: no (Tq, Tk) matrix
    is ever held), shorter ones the materialised path, faster there; ``it.nn.attention.sdpa_kernel`` forces one."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) or not 0.0 <= dropout_p < 1.0:
        raise op_error(_NAME, "dropout_p in [0, 1)", repr(dropout_p), "dropout_p is the probability of dropping")
    if is_causal and attn_mask is not None:
        raise op_error(_NAME, "either attn_mask or is_causal=True", "both",
                       "fold the causal mask into attn_mask (e.g. with tril) and pass is_causal=False")
    if sliding_window is not None and (isinstance(sliding_window, bool) or not isinstance(sliding_window, int)
                                       or sliding_window < 1):
        raise op_error(_NAME, "sliding_window: None or an int >= 1", repr(sliding_window),
                       "query i attends to keys j > i - sliding_window")
    cls = ScaledDotProductAttention
    allowed = choice.allowed
    if allowed is None:
        if k.ndim >= 2 and q.ndim >= 2 and k.shape[-2] > AUTO_BLOCKED_KEYS and q.shape[-2] > 1:
            cls = _blocked()
    elif MATH not in allowed:
        cls = _blocked()
    plain = attn_mask is None and sinks is None and sliding_window is None and dropout_heads is None
    if plain and allowed is None and registry.use("flash_attention"):  # a registry kernel, unless
        from . import fused_attention  # INFINI_TRAIN_KERNELS leaves it out (kernels/registry.py)

        if fused_attention.applies(q, k, v):
            cls = fused_attention.FusedAttention
    fn = cls(bool(is_causal), scale, float(dropout_p), bool(enable_gqa), sliding_window, attn_mask is not None,
             sinks is not None, dropout_heads)
    extras = tuple(t for t in (attn_mask, sinks) if t is not None)
    return fn.apply(q, k, v, *extras)


__all__ = ["scaled_dot_product_attention"]
