"""embedding: rows of a weight table gathered by integer ids; backward scatter-adds into the table.
one_hot: integer class ids as rows of an identity (exposed as infini_train.nn.functional.one_hot only)."""
from __future__ import annotations

import numbers

from ...tensor import Tensor
from ..double_backward import LinearAdjoint
from ..function import Op, op_error
from ..grad_sum import RowUpdates, dense
from .low_precision import narrow
from .softmax import upcast


def sum_rows_by_id(xp, ids, rows):
    """(distinct ids, the sum of ``rows`` for each), for ``rows[i]`` belonging to ``ids[i]``.

    On the host, numpy's ``add.at`` costs ~5 ms for 1024 rows of 768 (GPT-2's ids); sorting the ids and
    summing each run of equal ids by a segmented tree reduction (log2(longest run) vectorised rounds) takes
    ~0.5 ms whatever the repetition pattern (np.add.reduceat: 1.5-3.8 ms). GPUs take the same path rather than
    an atomic scatter: the sums are then added in a fixed order, so a run (and its resume) is bitwise
    reproducible, as torch's sorted embedding backward.
    """
    n = ids.shape[0]
    order = xp.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    summed = rows[order]  # a fresh copy: reduced in place below
    first = xp.empty(n, dtype=bool)
    first[0] = True
    xp.not_equal(sorted_ids[1:], sorted_ids[:-1], out=first[1:])
    starts = xp.flatnonzero(first)
    if starts.shape[0] < n:  # repeated ids: fold each run of equal ids onto its first row
        run = xp.cumsum(first) - 1
        rank = xp.arange(n) - starts[run]  # position inside its run
        left = xp.diff(xp.append(starts, n))[run] - rank  # rows from here to the run's end
        step = 1
        active = xp.flatnonzero(left > step)  # rows with a partner `step` rows further in their run
        while active.shape[0]:
            dst = active[rank[active] % (2 * step) == 0]
            summed[dst] += summed[dst + step]
            step *= 2
            active = active[left[active] > step]
    return sorted_ids[starts], summed[starts]


def scatter_add_rows(xp, table, ids, rows):
    """table[ids[i]] += rows[i] for every i, summing over repeated ids (``sum_rows_by_id``); ``table`` (V, C) is
    updated in place.

    ``rows`` may be wider than ``table`` (float32 rows for a float16/bfloat16 table): sums are taken in the rows'
    dtype and each touched row of the table is rounded once.
    """
    if ids.shape[0] == 0:
        return table
    touched, sums = sum_rows_by_id(xp, ids, rows)
    if table.dtype == sums.dtype:
        table[touched] += sums
    else:
        table[touched] = narrow(xp, table[touched] + sums, table.dtype)
    return table


class Embedding(Op):
    def __init__(self, padding_idx=None):
        self.padding_idx = padding_idx

    def forward(self, ids, weight):
        if ids.dtype.kind not in "iu":
            raise op_error("embedding", "integer ids", f"ids of dtype {ids.dtype}", "convert with .long()")
        if weight.ndim != 2:
            raise op_error("embedding", "a 2-D weight (num_embeddings, embedding_dim)",
                           f"weight of shape {weight.shape}")
        vocab = weight.shape[0]
        if ids.size:
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= vocab:
                bad = lo if lo < 0 else hi
                raise op_error("embedding", f"ids in [0, {vocab}) (num_embeddings={vocab})", f"id {bad}",
                               "the tokenizer's vocabulary must fit the model's vocab_size")
        self.stash(ids)
        return self.xp.take(weight, ids, axis=0)

    def backward(self, g):
        if not self.needs_input_grad[1]:
            return None, None
        xp = self.xp
        (ids,) = self.stashed
        vocab, dim = self._input_shapes[1]
        ids, rows = ids.reshape(-1), upcast(g).reshape(-1, dim)  # float16/bfloat16: float32 sums
        if ids.shape[0] and rows.dtype == self._input_dtypes[1] and self.next_functions[1][0] is not None:
            touched, sums = sum_rows_by_id(xp, ids, rows)
            if self.padding_idx is not None:
                keep = touched != self.padding_idx
                touched, sums = touched[keep], sums[keep]
            # the weight's node adds these rows into another gradient of the weight, or makes them dense
            self.next_functions[1][0]._row_updates = True
            return None, RowUpdates(xp, (vocab, dim), touched, sums)
        grad = xp.zeros((vocab, dim), dtype=self._input_dtypes[1])
        scatter_add_rows(xp, grad, ids, rows)
        if self.padding_idx is not None:
            grad[self.padding_idx] = 0
        return None, grad

    def backward_graph(self, g):
        """The weight's gradient is linear in g: as an op, whose own backward looks the rows up again (the
        padding row excluded)."""
        if not self.needs_input_grad[1]:
            return None, None
        (ids,) = self.stashed
        padding = self.padding_idx

        def look_up(gg):
            if padding is not None:
                keep = self.xp.ones((gg.shape[0], 1), gg.dtype)
                keep[padding] = 0
                gg = gg * Tensor._make(keep, gg.device)
            return gg[Tensor._make(ids, gg.device)]

        return None, LinearAdjoint(lambda grad: dense(self.backward(grad)[1]), look_up).apply(g)


def embedding(ids, weight, padding_idx=None):
    """weight[ids] for integer ``ids`` of any shape and ``weight`` (num_embeddings, embedding_dim).

    The row at ``padding_idx`` (negative counts from the end) gets no gradient, as in torch."""
    if padding_idx is not None:
        vocab = weight.shape[0]
        if not isinstance(padding_idx, numbers.Integral) or not -vocab <= padding_idx < vocab:
            raise op_error("embedding", f"padding_idx in [{-vocab}, {vocab}) or None", repr(padding_idx),
                           "padding_idx is a row of the weight table")
        padding_idx = int(padding_idx) % vocab
    return Embedding(padding_idx).apply(ids, weight)


class OneHot(Op):
    differentiable = False

    def __init__(self, num_classes):
        self.num_classes = num_classes

    def forward(self, ids):
        if ids.dtype != "int64":
            raise op_error("one_hot", "an int64 index tensor", f"dtype {ids.dtype}", "convert it with .long()")
        num_classes = self.num_classes
        if not isinstance(num_classes, numbers.Integral):
            raise op_error("one_hot", "num_classes as an int", repr(num_classes))
        if ids.size == 0:
            if num_classes <= 0:
                raise op_error("one_hot", "num_classes > 0 for an empty tensor", f"num_classes={num_classes}",
                               "the number of classes cannot be inferred from an empty tensor; pass num_classes")
            return self.xp.zeros(ids.shape + (int(num_classes),), "int64")
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0:
            raise op_error("one_hot", "non-negative class values", f"class {lo}")
        if num_classes == -1:
            num_classes = hi + 1
        elif hi >= num_classes:
            raise op_error("one_hot", f"class values smaller than num_classes={num_classes}", f"class {hi}",
                           "num_classes=-1 infers it as the largest class + 1")
        return (ids[..., None] == self.xp.arange(int(num_classes))).astype("int64")


def one_hot(tensor, num_classes=-1):
    """int64 one-hot rows for int64 class ids: shape (*tensor.shape, num_classes), as
    torch.nn.functional.one_hot. ``num_classes=-1`` takes the largest class + 1."""
    return OneHot(num_classes).apply(tensor)


__all__ = ["embedding"]  # one_hot stays out of the top level, as in torch
