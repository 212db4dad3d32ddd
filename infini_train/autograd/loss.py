"""cross_entropy (fused log-softmax + NLL) and nll_loss over class-index targets.

Both take logits / log-probabilities (N, C), (C,) or (N, C, d1, ...) with targets (N,), () or (N, d1, ...), as
torch does, and work on (rows, C) internally. cross_entropy computes exp(x) (shifted by the row max only where
it would overflow) and its row sums once in forward; backward turns that stash into (softmax - onehot) * scale
in place (unless the graph is retained), folding the division by the row sum into the per-row scale, so
softmax is never recomputed. Per-row losses are formed and reduced in float64 (row-sized arrays only) and
returned in the logits' dtype.
"""
from __future__ import annotations

from .function import Op, op_error
from .softmax import exp_and_sum, logsumexp, upcast

_REDUCTIONS = ("mean", "sum", "none")
_SHAPE_HINT = ("targets are (N,) for (N, C) inputs, () for (C,), (N, d1, ...) for (N, C, d1, ...); "
               "for (B, T, V) logits pass logits.view(-1, V) and targets.view(-1)")


class _ClassLoss(Op):
    """Validation, the (N, C, d...) <-> (rows, C) layout and the reductions shared by both losses."""

    op_name = ""

    def __init__(self, ignore_index=-100, reduction="mean"):
        if reduction not in _REDUCTIONS:
            raise op_error(self.op_name, f"reduction in {_REDUCTIONS}", repr(reduction))
        self.ignore_index = int(ignore_index)
        self.reduction = reduction

    def _rows(self, x, target):
        """(N, C, d...) -> (N*d..., C) and target -> (N*d...,); validates dtypes, shapes and class indices."""
        op = self.op_name
        if x.dtype.kind not in "fV":
            raise op_error(op, "floating-point input", f"input of dtype {x.dtype}")
        if not hasattr(target, "dtype") or target.dtype.kind not in "iu":
            got = f"targets of dtype {target.dtype}" if hasattr(target, "dtype") else f"targets {type(target)}"
            raise op_error(op, "integer class-index targets", got, "use target.long(); class probabilities "
                           "as targets are not supported")
        if x.ndim == 0:
            raise op_error(op, "input of shape (C,), (N, C) or (N, C, d1, ...)", "a 0-d input")
        expect = () if x.ndim == 1 else (x.shape[0],) + tuple(x.shape[2:])
        if tuple(target.shape) != expect:
            raise op_error(op, f"target of shape {expect} for input of shape {tuple(x.shape)}",
                           f"target of shape {tuple(target.shape)}", _SHAPE_HINT)
        num_classes = x.shape[0] if x.ndim == 1 else x.shape[1]
        if num_classes == 0:
            raise op_error(op, "at least one class", f"input of shape {tuple(x.shape)}")
        if x.ndim == 1:
            x, target = x.reshape(1, -1), target.reshape(1)
        elif x.ndim > 2:
            x = x.reshape(x.shape[0], num_classes, -1).transpose(0, 2, 1).reshape(-1, num_classes)
        t = target.reshape(-1)
        valid = t != self.ignore_index
        out_of_range = (t < 0) | (t >= num_classes)
        out_of_range &= valid
        if out_of_range.any():
            bad = int(t[out_of_range][0])
            raise op_error(op, f"target values in [0, C) with C={num_classes} classes, or "
                           f"ignore_index={self.ignore_index}", f"target value {bad}",
                           "class indices (token ids) must be smaller than the number of classes (vocab_size)")
        self.count = int(valid.sum())
        safe_t = self.xp.where(valid, t, 0)
        return x, safe_t, valid

    def _reduce(self, losses, target_shape):
        if self.reduction == "none":
            return losses.reshape(target_shape)
        total = losses.sum()
        if self.reduction == "sum":
            return total
        return total / self.count if self.count else total * float("nan")  # all ignored: nan, like torch

    def _row_scale(self, g, valid):
        """d(reduced loss) / d(loss of each row): g / count (mean), g (sum) or g per row (none); 0 if ignored."""
        g = upcast(g)
        if self.reduction == "none":
            g = g.reshape(-1)
        elif self.reduction == "mean":
            g = g / self.count if self.count else g * 0
        return self.xp.where(valid, g, 0).astype(g.dtype, copy=False)

    def _unrows(self, grad):
        shape = self._input_shapes[0]
        if len(shape) > 2:
            n, c = shape[0], shape[1]
            return self.xp.ascontiguousarray(grad.reshape(n, -1, c).transpose(0, 2, 1)).reshape(shape)
        return grad.reshape(shape)


class CrossEntropy(_ClassLoss):
    op_name = "cross_entropy"

    def forward(self, logits, target):
        xp = self.xp
        x, t, valid = self._rows(logits, target)
        xw = upcast(x)
        e, shift, s = exp_and_sum(xp, xw, 1)
        # loss = logsumexp - x_target, in float64 so that two large terms (logits of 1e4) cancel exactly
        losses = logsumexp(xp, shift, s)[:, 0] - xw[xp.arange(x.shape[0]), t]
        losses = xp.where(valid, losses, 0.0)
        self.stash(e, s, t, valid)
        return xp.asarray(self._reduce(losses, target.shape)).astype(logits.dtype, copy=False)

    def backward(self, g):
        xp = self.xp
        e, s, t, valid = self.stashed
        scale = self._row_scale(g, valid)
        grad = e if not self.retain_graph else e.copy()
        grad *= (scale / s[:, 0])[:, None]  # softmax = e / s, times the row's scale
        grad[xp.arange(grad.shape[0]), t] -= scale
        return self._unrows(grad).astype(g.dtype, copy=False), None


class NLLLoss(_ClassLoss):
    op_name = "nll_loss"

    def forward(self, log_probs, target):
        xp = self.xp
        x, t, valid = self._rows(log_probs, target)
        picked = upcast(x[xp.arange(x.shape[0]), t])
        losses = xp.where(valid, -picked, 0).astype(picked.dtype, copy=False)
        self.stash(t, valid, x.shape)
        return xp.asarray(self._reduce(losses, target.shape)).astype(log_probs.dtype, copy=False)

    def backward(self, g):
        xp = self.xp
        t, valid, rows_shape = self.stashed
        scale = self._row_scale(g, valid)
        grad = xp.zeros(rows_shape, scale.dtype)
        grad[xp.arange(rows_shape[0]), t] = -scale
        return self._unrows(grad).astype(g.dtype, copy=False), None


def cross_entropy(logits, target, ignore_index=-100, reduction="mean"):
    """Cross-entropy of class-index targets: logits (N, C), (C,) or (N, C, d1, ...) with integer targets
    (N,), () or (N, d1, ...). Targets equal to ``ignore_index`` contribute nothing; 'mean' divides by the
    number of the others (nan when all are ignored, as torch); 'sum' adds; 'none' keeps target's shape."""
    return CrossEntropy(ignore_index, reduction).apply(logits, target)


def nll_loss(log_probs, target, ignore_index=-100, reduction="mean"):
    """Negative log-likelihood of class-index targets given log-probabilities (same layouts as cross_entropy)."""
    return NLLLoss(ignore_index, reduction).apply(log_probs, target)


__all__ = ["cross_entropy", "nll_loss"]
