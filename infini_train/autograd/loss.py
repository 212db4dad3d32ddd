"""cross_entropy (fused log-softmax + NLL: the probabilities are computed once, in forward, and turned into
the gradient in backward) and nll_loss."""
from __future__ import annotations

from .function import Op, op_error

_REDUCTIONS = ("mean", "sum", "none")


def _rows(logits, target, op):
    """Move the class dim last and flatten: (N, C, d...) -> (N*d..., C); validates target's shape/dtype."""
    if target.dtype.kind not in "iu":
        raise op_error(op, "integer class-index targets", f"targets of dtype {target.dtype}", "use .long()")
    if logits.ndim == 1:
        expect = ()
    else:
        expect = (logits.shape[0],) + logits.shape[2:]
    if target.shape != expect:
        raise op_error(op, f"target of shape {expect} for input of shape {logits.shape}",
                       f"target of shape {target.shape}")
    if logits.ndim == 1:
        return logits.reshape(1, -1), target.reshape(1)
    if logits.ndim > 2:
        logits = logits.reshape(logits.shape[0], logits.shape[1], -1).transpose(0, 2, 1)
    return logits.reshape(-1, logits.shape[-1]), target.reshape(-1)


def _check_range(xp, target, valid, num_classes, op):
    picked = target[valid]
    if picked.size and (int(picked.min()) < 0 or int(picked.max()) >= num_classes):
        bad = int(picked.min()) if int(picked.min()) < 0 else int(picked.max())
        raise op_error(op, f"targets in [0, {num_classes}) or ignore_index", f"target {bad}",
                       "the data's token ids must fit the model's vocab_size")


class _ClassLoss(Op):
    def __init__(self, ignore_index=-100, reduction="mean"):
        if reduction not in _REDUCTIONS:
            raise op_error(self.op_name, f"reduction in {_REDUCTIONS}", repr(reduction))
        self.ignore_index = ignore_index
        self.reduction = reduction

    def _reduce(self, losses, out_shape, count):
        if self.reduction == "none":
            return losses.reshape(out_shape)
        total = losses.sum()
        return total / count if self.reduction == "mean" else total

    def _grad_scale(self, g, n_rows):
        """Per-row factor applied to d(loss_i): g / count for mean, g for sum, g_i for none."""
        if self.reduction == "none":
            return g.reshape(n_rows, 1)
        return g / self.count if self.reduction == "mean" else g

    def _unrows(self, grad, shape):
        if len(shape) > 2:
            n, c = shape[0], shape[1]
            return grad.reshape(n, -1, c).transpose(0, 2, 1).reshape(shape)
        return grad.reshape(shape)


class CrossEntropy(_ClassLoss):
    op_name = "cross_entropy"

    def forward(self, logits, target):
        xp = self.xp
        x2, t = _rows(logits, target, "cross_entropy")
        valid = t != self.ignore_index
        _check_range(xp, t, valid, x2.shape[1], "cross_entropy")
        rows = xp.arange(x2.shape[0])
        safe_t = xp.where(valid, t, 0)
        work = x2.astype("float32") if x2.dtype.itemsize < 4 else x2
        row_max = work.max(axis=1, keepdims=True)
        probs = work - row_max
        picked = probs[rows, safe_t]  # logit - max at the target
        xp.exp(probs, out=probs)
        sums = probs.sum(axis=1, keepdims=True)
        probs /= sums
        losses = xp.log(sums[:, 0]) - picked
        losses *= valid
        self.count = valid.sum()
        self.stash(probs, safe_t, valid)
        out_shape = target.shape if logits.ndim > 1 else ()
        return self._reduce(losses, out_shape, self.count).astype(logits.dtype, copy=False)

    def backward(self, g):
        probs, t, valid = self.stashed
        grad = probs if not self.retain_graph else probs.copy()
        rows = self.xp.arange(grad.shape[0])
        grad[rows, t] -= 1
        grad *= self._grad_scale(g, grad.shape[0]) * valid[:, None]
        return self._unrows(grad, self._input_shapes[0]).astype(g.dtype, copy=False), None


class NLLLoss(_ClassLoss):
    op_name = "nll_loss"

    def forward(self, log_probs, target):
        xp = self.xp
        x2, t = _rows(log_probs, target, "nll_loss")
        valid = t != self.ignore_index
        _check_range(xp, t, valid, x2.shape[1], "nll_loss")
        safe_t = xp.where(valid, t, 0)
        losses = -x2[xp.arange(x2.shape[0]), safe_t] * valid
        self.count = valid.sum()
        self.stash(safe_t, valid)
        out_shape = target.shape if log_probs.ndim > 1 else ()
        return self._reduce(losses, out_shape, self.count).astype(log_probs.dtype, copy=False)

    def backward(self, g):
        t, valid = self.stashed
        shape = self._input_shapes[0]
        n_rows = t.shape[0]
        grad = self.xp.zeros((n_rows, shape[1] if len(shape) > 1 else shape[0]), g.dtype)
        grad[self.xp.arange(n_rows), t] = -1
        grad *= self._grad_scale(g, n_rows) * valid[:, None]
        return self._unrows(grad, shape), None


def cross_entropy(logits, target, ignore_index=-100, reduction="mean"):
    """Cross-entropy of class-index targets: logits (N, C), (C,) or (N, C, d...). Targets equal to
    ``ignore_index`` contribute nothing; 'mean' divides by the number of the others."""
    return CrossEntropy(ignore_index, reduction).apply(logits, target)


def nll_loss(log_probs, target, ignore_index=-100, reduction="mean"):
    """Negative log-likelihood of class-index targets given log-probabilities."""
    return NLLLoss(ignore_index, reduction).apply(log_probs, target)


__all__ = ["cross_entropy", "nll_loss"]
