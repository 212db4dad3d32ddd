"""The vocabulary split over a tensor-parallel group: VocabParallelEmbedding and vocab_parallel_cross_entropy.

The vocabulary is padded with zero rows up to a multiple of size * pad_to_multiple_of and rank r owns the
contiguous rows [r * V_local, (r + 1) * V_local). The embedding looks up the ids it owns (zeros for the others) and
sums over the group. The loss works on each rank's columns of the logits (the tied output projection computes just
those) and never gathers the full-vocabulary logits: the row max and the softmax denominator are all-reduced, and
the target's logit comes from the rank owning it. Padding columns count as -inf: they never win the max, never enter
the denominator, and get no gradient.
"""
from __future__ import annotations

import numpy as np

from ...autograd.function import Op, op_error
from ...autograd.ops.softmax import ignore_overflow, upcast
from ...autograd.ops.embedding import scatter_add_rows
from ...distributed import ReduceOp, default_group
from ..layers import Embedding
from ..module import Module
from .mappings import reduce_from_tensor_parallel_region
from .tensor_parallel import ShardSpec, shard_parameter


def _check_ids(what, ids, low, high, hint):
    if ids.dtype.kind not in "iu":
        raise op_error(what, "integer ids", f"ids of dtype {ids.dtype}", "convert with .long()")
    if ids.size:
        lo, hi = int(ids.min()), int(ids.max())
        if lo < low or hi >= high:
            raise op_error(what, f"ids in [{low}, {high})", f"id {lo if lo < low else hi}", hint)


class VocabShardLookup(Op):
    """Rows of this rank's vocabulary shard for the ids it owns, zeros for the others; backward adds the
    gradient rows of owned ids into the shard (ids owned elsewhere, the vocabulary padding and ``padding_idx``, the
    row torch's padding_idx keeps out of the gradient, get none)."""

    def __init__(self, vocab_start, num_embeddings, padding_idx=None):
        self.vocab_start = vocab_start
        self.num_embeddings = num_embeddings
        self.padding_idx = padding_idx

    def forward(self, ids, weight):
        xp = self.xp
        _check_ids("VocabParallelEmbedding", ids, 0, self.num_embeddings,
                   "the tokenizer's vocabulary must fit the model's vocab_size")
        local = ids - self.vocab_start
        owned = (local >= 0) & (local < weight.shape[0])
        local = xp.where(owned, local, 0)
        rows = xp.take(weight, local, axis=0)
        rows[~owned] = 0
        self.stash(local, owned)
        return rows

    def backward(self, g):
        xp = self.xp
        local, owned = self.stashed
        shape = self._input_shapes[1]
        grad = xp.zeros(shape, dtype=self._input_dtypes[1])
        if self.padding_idx is not None:
            owned = owned & (local != self.padding_idx - self.vocab_start)
        owned = owned.reshape(-1)
        scatter_add_rows(xp, grad, local.reshape(-1)[owned], upcast(g).reshape(-1, shape[1])[owned])
        return None, grad


class VocabParallelEmbedding(Module):
    """An embedding table whose rows (the vocabulary, padded to a multiple of size * pad_to_multiple_of) are split
    over ``group``: weight (padded / size, embedding_dim). Output: the whole lookup, on every rank."""

    def __init__(self, num_embeddings, embedding_dim, group=None, pad_to_multiple_of=1, device=None, dtype=None,
                 _whole=None, padding_idx=None):
        super().__init__()
        self.group = group if group is not None else default_group()
        if int(pad_to_multiple_of) < 1:
            raise ValueError(f"VocabParallelEmbedding: expected pad_to_multiple_of >= 1, got {pad_to_multiple_of}\n"
                             "HINT: 1 pads only to a multiple of the group size; 64 or 128 keeps shards GEMM-friendly")
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        self.pad_to_multiple_of = int(pad_to_multiple_of)
        spec = ShardSpec(0, whole_size=self.num_embeddings, pad_to_multiple_of=self.pad_to_multiple_of)
        self.padded_num_embeddings = spec.padded_length(self.num_embeddings, self.group.size)
        self.num_embeddings_per_partition = self.padded_num_embeddings // self.group.size
        whole = _whole if _whole is not None else Embedding(num_embeddings, embedding_dim, padding_idx, device=device,
                                                            dtype=dtype)
        self.padding_idx = whole.padding_idx  # (as torch's: no gradient for that id)
        self.weight = shard_parameter(whole.weight, spec, self.group)

    @classmethod
    def from_embedding(cls, embedding, group, pad_to_multiple_of=1):
        """This rank's shard of the whole ``embedding`` (its rows are copied, not shared; its padding_idx kept)."""
        rows, dim = embedding.weight.shape
        return cls(rows, dim, group, pad_to_multiple_of, _whole=embedding)

    @property
    def vocab_range(self):
        """(start, end): the ids whose rows this rank holds (end may run into the padding)."""
        start = self.group.rank * self.num_embeddings_per_partition
        return start, start + self.num_embeddings_per_partition

    def forward(self, ids):
        rows = VocabShardLookup(self.vocab_range[0], self.num_embeddings, self.padding_idx).apply(ids, self.weight)
        return reduce_from_tensor_parallel_region(rows, self.group)

    def extra_repr(self):
        start, end = self.vocab_range
        return (f"{self.num_embeddings} ({self.padded_num_embeddings} padded; ids [{start}, {end}) on this rank), "
                f"{self.embedding_dim}, tp_size={self.group.size}")


class VocabParallelCrossEntropy(Op):
    """Per-token cross entropy of logits split by vocabulary columns over ``group``; see the module docstring."""

    def __init__(self, group, vocab_size, ignore_index=-100):
        self.group = group if group is not None else default_group()
        self.vocab_size = int(vocab_size)
        self.ignore_index = int(ignore_index)

    def forward(self, logits, target):
        xp, group = self.xp, self.group
        what = "vocab_parallel_cross_entropy"
        if logits.ndim == 0 or logits.dtype.kind not in "fV":
            raise op_error(what, "floating logits of shape (N, V_local)", f"logits of shape {tuple(logits.shape)} and "
                           f"dtype {logits.dtype}")
        if tuple(target.shape) != tuple(logits.shape[:-1]):
            raise op_error(what, f"target of shape {tuple(logits.shape[:-1])} for logits of shape "
                           f"{tuple(logits.shape)}", f"target of shape {tuple(target.shape)}",
                           "for (B, T, V_local) logits pass logits.view(-1, V_local) and targets.view(-1)")
        local_vocab = logits.shape[-1]
        if not 0 < self.vocab_size <= group.size * local_vocab:
            raise op_error(what, f"0 < vocab_size <= group size x V_local = {group.size} x {local_vocab}",
                           f"vocab_size={self.vocab_size}", "pass the real (unpadded) vocabulary size")
        start = group.rank * local_vocab
        real = min(max(self.vocab_size - start, 0), local_vocab)  # columns of real ids; the rest is padding
        x = upcast(logits.reshape(-1, local_vocab))
        t = target.reshape(-1)
        valid = t != self.ignore_index
        bad = valid & ((t < 0) | (t >= self.vocab_size))
        if bool(bad.any()):
            raise op_error(what, f"target values in [0, {self.vocab_size}) or ignore_index={self.ignore_index}",
                           f"target value {int(t[bad][0])}", "token ids must be smaller than vocab_size")
        rows = x.shape[0]
        row_max = x[:, :real].max(axis=1) if real and rows else xp.full(rows, -np.inf, x.dtype)
        group.all_reduce(row_max, ReduceOp.MAX)
        e = xp.subtract(x, row_max[:, None])
        with ignore_overflow(xp):
            xp.exp(e, out=e)
        e[:, real:] = 0
        local_t = t - start
        owned = valid & (local_t >= 0) & (local_t < real)
        local_t = xp.where(owned, local_t, 0)
        picked = xp.where(owned, x[xp.arange(rows), local_t] - row_max, 0)
        sums = xp.stack([e.sum(axis=1), picked.astype(e.dtype)])  # one all-reduce for both
        group.all_reduce(sums)
        exp_sum, target_logit = sums[0], sums[1]
        losses = xp.log(exp_sum.astype(np.float64)) - target_logit.astype(np.float64)
        losses = xp.where(valid, losses, 0.0)
        self.stash(e, exp_sum, local_t, owned, valid)
        return losses.reshape(target.shape).astype(x.dtype)

    def backward(self, g):
        xp = self.xp
        e, exp_sum, local_t, owned, valid = self.stashed
        scale = xp.where(valid, upcast(g).reshape(-1), 0).astype(e.dtype)
        grad = e if not self.retain_graph else e.copy()
        grad *= (scale / exp_sum)[:, None]  # softmax times the incoming gradient
        rows = xp.flatnonzero(owned)
        grad[rows, local_t[rows]] -= scale[rows]
        return grad.reshape(self._input_shapes[0]), None


def vocab_parallel_cross_entropy(logits_shard, target, group, vocab_size, ignore_index=-100):
    """Per-token losses (float32; float64 for float64 logits), 0 where ``target == ignore_index``, from this rank's
    vocabulary columns ``logits_shard`` (N, V_local) of the padded vocabulary and global target ids (N,). Columns at
    or beyond ``vocab_size`` are padding. Gradients flow to ``logits_shard``: softmax minus one-hot on each shard."""
    return VocabParallelCrossEntropy(group, vocab_size, ignore_index).apply(logits_shard, target)


__all__ = ["VocabParallelEmbedding", "vocab_parallel_cross_entropy"]
