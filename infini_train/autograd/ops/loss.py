"""Losses, as torch computes them: cross_entropy (class indices or class probabilities, with class weights and
label smoothing), nll_loss, mse_loss and binary_cross_entropy_with_logits; reductions 'mean', 'sum', 'none'.

The class losses take logits / log-probabilities (N, C), (C,) or (N, C, d1, ...) with targets (N,), () or
(N, d1, ...) and work on (rows, C) internally. cross_entropy computes exp(x) (shifted by the row max only where
it would overflow) and its row sums once in forward; backward turns that stash into the gradient in place
(unless the graph is retained), folding the division by the row sum into a per-row scale, so softmax is never
recomputed. For class-index targets the gradient of row i is

    scale_i * (softmax_i * prob_coef_i - (eps / C) * w - onehot(t_i) * target_coef_i)
    target_coef_i = (1 - eps) * w[t_i],   prob_coef_i = target_coef_i + (eps / C) * sum(w)

(w = 1 without class weights, eps = label_smoothing), which for the plain case is (softmax - onehot) * scale.
Per-row losses are formed and reduced in float64 (row-sized arrays only) and returned in the input's dtype.
"""
from __future__ import annotations

import contextlib
import warnings

import numpy as np

from ...backend import is_array_like
from ...kernels import registry
from ...tensor import Tensor
from ..double_backward import graph_handle, recomputed_grads
from ..function import Op, ignore_fp_errors, op_error, sum_to
from .softmax import exp_and_sum, logsumexp, row_dot, row_sum, subtract_wide, upcast

_REDUCTIONS = ("mean", "sum", "none")
_QUIET = contextlib.nullcontext()
_SHAPE_HINT = ("targets are (N,) for (N, C) inputs, () for (C,), (N, d1, ...) for (N, C, d1, ...); "
               "for (B, T, V) logits pass logits.view(-1, V) and targets.view(-1)")


def _check_reduction(op, reduction):
    if reduction not in _REDUCTIONS:
        raise op_error(op, f"reduction in {_REDUCTIONS}", repr(reduction))


def _is_float(a):
    return a.dtype.kind in "fV"  # V: bfloat16


def _promote(a, b):
    """The dtype of a loss between two arrays, as torch promotes: a float beats an integer, the wider float wins,
    and float16 with bfloat16 gives float32."""
    if not _is_float(b) or a.dtype == b.dtype:
        return a.dtype
    if not _is_float(a):
        return b.dtype
    if a.dtype.itemsize != b.dtype.itemsize:
        return a.dtype if a.dtype.itemsize > b.dtype.itemsize else b.dtype
    return np.dtype(np.float32)


def _reduce_total(total, count):
    """total / count for 'mean'; nan when count is 0 (no elements, every target ignored, or target weights
    summing to 0), as torch."""
    return total / count if count else total * float("nan")


# ----------------------------------------------------------------------------------------- class losses
class _ClassLoss(Op):
    """Validation, the (N, C, d...) <-> (rows, C) layout, class weights and the reductions of the class losses."""

    op_name = ""

    def __init__(self, ignore_index=-100, reduction="mean"):
        _check_reduction(self.op_name, reduction)
        self.ignore_index = int(ignore_index)
        self.reduction = reduction

    def _num_classes(self, x):
        if not _is_float(x):
            raise op_error(self.op_name, "floating-point input", f"input of dtype {x.dtype}")
        if x.ndim == 0:
            raise op_error(self.op_name, "input of shape (C,), (N, C) or (N, C, d1, ...)", "a 0-d input")
        num_classes = x.shape[0] if x.ndim == 1 else x.shape[1]
        if num_classes == 0:
            raise op_error(self.op_name, "at least one class", f"input of shape {tuple(x.shape)}")
        return num_classes

    @staticmethod
    def _to_rows(a, num_classes):
        """(C,) -> (1, C); (N, C) stays; (N, C, d...) -> (N*d..., C)."""
        if a.ndim == 1:
            return a.reshape(1, -1)
        if a.ndim > 2:
            return a.reshape(a.shape[0], num_classes, -1).transpose(0, 2, 1).reshape(-1, num_classes)
        return a

    def _rows(self, x, target):
        """(N, C, d...) -> (N*d..., C) and target -> (N*d...,); validates dtypes, shapes and class indices."""
        op = self.op_name
        num_classes = self._num_classes(x)
        if not is_array_like(target) or target.dtype.kind not in "iu":
            got = f"targets of dtype {target.dtype}" if is_array_like(target) else f"targets {type(target)}"
            raise op_error(op, "integer class-index targets", got, "use target.long(); class probabilities "
                           "are float targets of the input's shape (cross_entropy only)")
        expect = () if x.ndim == 1 else (x.shape[0],) + tuple(x.shape[2:])
        if tuple(target.shape) != expect:
            raise op_error(op, f"target of shape {expect} for input of shape {tuple(x.shape)}",
                           f"target of shape {tuple(target.shape)}", _SHAPE_HINT)
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
        return self._to_rows(x, num_classes), safe_t, valid

    def _class_weights(self, weight, num_classes, dtype=None):
        """The (C,) class weights as an array, or None; ``dtype`` (if given) is the dtype they must have."""
        if weight is None:
            return None
        weight = self.xp.asarray(weight)
        if weight.shape != (num_classes,):
            raise op_error(self.op_name, f"a weight of shape ({num_classes},), one per class",
                           f"weight of shape {tuple(weight.shape)}")
        if not _is_float(weight) or (dtype is not None and weight.dtype != dtype):
            expected = "a floating weight" + (f" of the input's dtype {dtype}" if dtype is not None else "")
            raise op_error(self.op_name, expected, f"weight of dtype {weight.dtype}",
                           "cast it with weight.to(input.dtype)")
        return weight

    def _target_weights(self, weight, t, valid):
        """w[t] per row in float64 (0 where ignored); 'mean' then divides by their sum, as torch."""
        if weight is None:
            self.denominator = self.count
            return None
        row_weights = self.xp.where(valid, weight.astype(np.float64)[t], 0.0)
        self.denominator = row_weights.sum()
        return row_weights

    def _reduce(self, losses, target_shape):
        if self.reduction == "none":
            return losses.reshape(target_shape)
        total = losses.sum()
        return total if self.reduction == "sum" else _reduce_total(total, self.denominator)

    def _row_scale(self, g, valid, rows):
        """d(reduced loss) / d(loss of each row): g / denominator (mean), g (sum) or g per row (none); 0 where
        ignored. A zero denominator with rows left (all their weights 0) gives inf, and nan gradients as torch."""
        xp = self.xp
        g = upcast(g)
        if self.reduction == "none":
            g = g.reshape(-1)
        elif self.reduction == "mean":
            g = g / self.denominator if self.denominator else g * float("inf")
        if valid is None:
            return xp.broadcast_to(g, (rows,))
        return xp.where(valid, g, 0).astype(g.dtype, copy=False)

    def _unrows(self, grad, input_index=0):
        shape = self._input_shapes[input_index]
        if len(shape) > 2:
            n, c = shape[0], shape[1]
            return self.xp.ascontiguousarray(grad.reshape(n, -1, c).transpose(0, 2, 1)).reshape(shape)
        return grad.reshape(shape)


class CrossEntropy(_ClassLoss):
    """cross_entropy against class indices, with optional class weights and label smoothing."""

    op_name = "cross_entropy"

    def __init__(self, ignore_index=-100, reduction="mean", label_smoothing=0.0):
        super().__init__(ignore_index, reduction)
        self.label_smoothing = label_smoothing

    def forward(self, logits, target, weight=None):
        xp = self.xp
        self._target_shape = tuple(target.shape)
        x, t, valid = self._rows(logits, target)
        num_classes = x.shape[1]
        w = self._class_weights(weight, num_classes, logits.dtype)
        xw = upcast(x)
        e, shift, s = exp_and_sum(xp, xw, 1)
        lse = logsumexp(xp, shift, s)
        # loss = logsumexp - x_target, in float64 so that two large terms (logits of 1e4) cancel exactly
        losses = lse[:, 0] - xw[xp.arange(x.shape[0]), t]
        row_weights = self._target_weights(w, t, valid)
        if row_weights is not None:
            losses *= row_weights
        eps = self.label_smoothing
        if eps > 0:
            # torch's smoothing term: sum_c w_c * -log_softmax(x)_c, from float32 log-probabilities as torch
            log_probs = subtract_wide(xp, xw, lse, out=xp.empty_like(xw))
            smooth = log_probs @ w.astype(xw.dtype) if w is not None else row_sum(xp, log_probs, 1)[:, 0]
            losses = (1 - eps) * losses - (eps / num_classes) * smooth.astype(np.float64)
        losses = xp.where(valid, losses, 0.0)
        self.stash(e, s, t, valid, row_weights, w)
        self.shift = shift  # (with e, the logits' values again, for a double backward)
        return xp.asarray(self._reduce(losses, target.shape)).astype(logits.dtype, copy=False)

    def backward(self, g):
        xp = self.xp
        e, s, t, valid, row_weights, w = self.stashed
        rows, num_classes = e.shape
        scale = self._row_scale(g, valid, rows)
        eps = self.label_smoothing
        grad = e if not self.retain_graph else e.copy()
        # with class weights summing to 0, inf scales give nan gradients, as torch
        with ignore_fp_errors(xp) if row_weights is not None else _QUIET:
            target_coef = scale if row_weights is None else scale * row_weights
            if eps > 0:
                target_coef = (1 - eps) * target_coef
                total_weight = num_classes if w is None else float(w.astype(np.float64).sum())
                prob_coef = target_coef + scale * (eps / num_classes * total_weight)
            else:
                prob_coef = target_coef
            grad *= (prob_coef / s[:, 0])[:, None]  # softmax = e / s, times the row's coefficient
            if eps > 0:
                smooth = (scale * (eps / num_classes)).astype(grad.dtype)[:, None]
                grad -= smooth if w is None else smooth * w.astype(grad.dtype)
            grad[xp.arange(rows), t] -= target_coef
        return self._unrows(grad).astype(g.dtype, copy=False), None, None

    def setup_context(self, inputs, output):
        # only the logits' place in the graph, not their memory (the largest activation of a language model): a
        # double backward rebuilds their values from the stashed exp and row shift
        self.save_for_backward(graph_handle(inputs[0]))

    def backward_graph(self, g):
        (handle,) = self.saved_tensors
        return recomputed_grads(self, self._composite, (handle,), g)[0], None, None

    def _composite(self, handle):
        """The loss in differentiable ops (log_softmax, a gather of the targets, weights, smoothing, reduction),
        on the logits rebuilt as log(e) + shift (their handle carries the gradient, not the values)."""
        e, _, t, valid, row_weights, w = self.stashed
        xp, dev = self.xp, handle.device
        num_classes = e.shape[1]
        rows = _rows_graph(handle, num_classes)
        with ignore_fp_errors(xp):
            values = xp.log(e) + (self.shift if self.shift is not None else 0)
        x = rows - rows.detach() + Tensor._make(values.astype(rows.dtype), dev)
        log_probs = x.log_softmax(-1)
        losses = -log_probs[Tensor._make(xp.arange(x.shape[0]), dev), Tensor._make(t, dev)]
        if row_weights is not None:
            losses = losses * Tensor._make(row_weights.astype(x.dtype), dev)
        eps = self.label_smoothing
        if eps > 0:
            smooth = (log_probs * Tensor._make(w.astype(x.dtype), dev)).sum(-1) if w is not None else log_probs.sum(-1)
            losses = (1 - eps) * losses - (eps / num_classes) * smooth
        losses = losses * Tensor._make(valid.astype(x.dtype), dev)
        if self.reduction == "none":
            return losses.reshape(self._target_shape)
        total = losses.sum()
        return total if self.reduction == "sum" else total / float(self.denominator)


class SoftCrossEntropy(_ClassLoss):
    """cross_entropy against class probabilities: a float target of the input's shape (soft labels)."""

    op_name = "cross_entropy"

    def __init__(self, reduction="mean", label_smoothing=0.0):
        super().__init__(-100, reduction)
        self.label_smoothing = label_smoothing

    def forward(self, logits, target, weight=None):
        xp = self.xp
        num_classes = self._num_classes(logits)
        w = self._class_weights(weight, num_classes)
        x = upcast(self._to_rows(logits, num_classes))
        probs = self._to_rows(target, num_classes)
        eps = self.label_smoothing
        if eps > 0:
            probs = probs * (1 - eps) + eps / num_classes
        e, shift, s = exp_and_sum(xp, x, 1)
        log_probs = subtract_wide(xp, x, logsumexp(xp, shift, s), out=xp.empty_like(x))
        weighted = probs * w if w is not None else probs  # w_c * p_c
        losses = -row_dot(xp, weighted, log_probs, 1)[:, 0].astype(np.float64)
        self.denominator = x.shape[0]  # 'mean' averages over rows, whatever the weights
        self.stash(e, s, weighted, probs, log_probs, w)
        self.shift = shift  # (with e, the logits' values again, for a double backward)
        out_dtype = _promote(logits, target)
        return xp.asarray(self._reduce(losses, logits.shape[:1] + logits.shape[2:] if logits.ndim > 1 else ())
                          ).astype(out_dtype, copy=False)

    def backward(self, g):
        xp = self.xp
        e, s, weighted, probs, log_probs, w = self.stashed
        need_x, need_target = self.needs_input_grad[:2]
        need_weight = len(self.needs_input_grad) > 2 and self.needs_input_grad[2]
        scale = self._row_scale(g, None, e.shape[0])[:, None]
        grad_x = grad_target = grad_weight = None
        if need_x:  # d/dx = scale * (softmax * sum_c(w_c p_c) - w * p)
            grad_x = e if not self.retain_graph else e.copy()
            grad_x *= scale * row_sum(xp, weighted, 1) / s
            grad_x -= weighted * scale
            grad_x = self._unrows(grad_x, 0)
        if need_target:
            keep = 1 - self.label_smoothing if self.label_smoothing > 0 else 1.0
            grad = log_probs * (-keep * scale)
            grad_target = self._unrows(grad if w is None else grad * w, 1)
        if need_weight:
            grad_weight = -(probs * log_probs * scale).sum(axis=0)
        return grad_x, grad_target, grad_weight

    def setup_context(self, inputs, output):
        # the logits by a storage-free handle (their values come back from the stashed exp and shift), the target
        # and weight as they are
        self.save_for_backward(graph_handle(inputs[0]), *inputs[1:])

    def backward_graph(self, g):
        return recomputed_grads(self, self._composite, self.saved_tensors, g)

    def _composite(self, handle, target, weight=None):
        """The loss in differentiable ops: -sum_c w_c p_c log_softmax(x)_c per row, then the reduction."""
        e = self.stashed[0]
        xp, dev, num_classes = self.xp, handle.device, e.shape[1]
        with ignore_fp_errors(xp):
            values = xp.log(e) + (self.shift if self.shift is not None else 0)
        rows = _rows_graph(handle, num_classes)
        x = rows - rows.detach() + Tensor._make(values.astype(rows.dtype), dev)
        probs = _rows_graph(target, num_classes)
        eps = self.label_smoothing
        if eps > 0:
            probs = probs * (1 - eps) + eps / num_classes
        if weight is not None:
            probs = probs * weight
        losses = -(probs * x.log_softmax(-1)).sum(-1)
        if self.reduction == "none":
            return losses.reshape(tuple(handle.shape[:1]) + tuple(handle.shape[2:]) if handle.ndim > 1 else ())
        return losses.sum() if self.reduction == "sum" else losses.sum() / float(self.denominator)


class NLLLoss(_ClassLoss):
    op_name = "nll_loss"

    def forward(self, log_probs, target, weight=None):
        xp = self.xp
        self._target_shape = tuple(target.shape)
        x, t, valid = self._rows(log_probs, target)
        w = self._class_weights(weight, x.shape[1], log_probs.dtype)
        picked = upcast(x[xp.arange(x.shape[0]), t])
        losses = xp.where(valid, -picked, 0).astype(picked.dtype, copy=False)
        row_weights = self._target_weights(w, t, valid)
        if row_weights is not None:
            losses = losses * row_weights
        self.stash(t, valid, x.shape, row_weights)
        return xp.asarray(self._reduce(losses, target.shape)).astype(log_probs.dtype, copy=False)

    def backward(self, g):
        xp = self.xp
        t, valid, rows_shape, row_weights = self.stashed
        scale = self._row_scale(g, valid, rows_shape[0])
        grad = xp.zeros(rows_shape, scale.dtype)
        with ignore_fp_errors(xp) if row_weights is not None else _QUIET:
            grad[xp.arange(rows_shape[0]), t] = -scale if row_weights is None else -scale * row_weights
        return self._unrows(grad).astype(g.dtype, copy=False), None, None

    def setup_context(self, inputs, output):
        self.save_for_backward(graph_handle(inputs[0]))  # the loss is linear in the input: no values needed

    def backward_graph(self, g):
        (handle,) = self.saved_tensors
        return recomputed_grads(self, self._composite, (handle,), g)[0], None, None

    def _composite(self, handle):
        """-log_probs[row, target] (weighted, ignored rows dropped), reduced: linear, so the handle's placeholder
        values never matter."""
        t, valid, rows_shape, row_weights = self.stashed
        xp, dev = self.xp, handle.device
        rows = _rows_graph(handle, rows_shape[1])
        scale = valid.astype(rows.dtype) if row_weights is None else row_weights.astype(rows.dtype)
        losses = -rows[Tensor._make(xp.arange(rows_shape[0]), dev), Tensor._make(t, dev)] * Tensor._make(scale, dev)
        if self.reduction == "none":
            return losses.reshape(self._target_shape)
        total = losses.sum()
        return total if self.reduction == "sum" else total / float(self.denominator)


def _rows_graph(a, num_classes):
    """_ClassLoss._to_rows on Tensors: (C,) -> (1, C); (N, C, d...) -> (N*d..., C)."""
    if a.ndim == 1:
        return a.reshape(1, -1)
    if a.ndim > 2:
        return a.reshape(a.shape[0], num_classes, -1).transpose(1, 2).reshape(-1, num_classes)
    return a


# ----------------------------------------------------------------------------------- elementwise losses
class _ElementLoss(Op):
    """Reductions of a per-element loss; ``operands()`` gives the saved inputs back (Tensors or constants)."""

    op_name = ""

    def __init__(self, reduction="mean"):
        _check_reduction(self.op_name, reduction)
        self.reduction = reduction

    def _reduce(self, losses, dtype):
        if self.reduction == "none":
            return losses.astype(dtype, copy=False)
        total = losses.sum(dtype=np.float64)
        if self.reduction == "mean":
            total = _reduce_total(total, losses.size)
        return self.xp.asarray(total).astype(dtype)

    def _reduce_graph(self, losses):
        """The reduction on Tensors (double backward's recomputation)."""
        if self.reduction == "none":
            return losses
        return losses.sum() if self.reduction == "sum" else losses.mean()

    def _element_scale(self, g, size):
        g = upcast(g)
        return g / size if self.reduction == "mean" else g

    def setup_context(self, inputs, output):
        self.save_for_backward(*[a if isinstance(a, Tensor) else None for a in inputs])
        self.consts = tuple(None if isinstance(a, Tensor) else a for a in inputs)

    def operands(self):
        return tuple(s if s is not None else c for s, c in zip(self.saved_arrays, self.consts))


class MSELoss(_ElementLoss):
    op_name = "mse_loss"

    def forward(self, x, target):
        if not (_is_float(x) or _is_float(target)):
            raise op_error(self.op_name, "a floating input or target", f"{x.dtype} and {target.dtype}",
                           "convert one with .float()")
        self.dtype = _promote(x, target)
        compute = upcast(np.empty(0, self.dtype)).dtype
        diff = x.astype(compute, copy=False) - target.astype(compute, copy=False)
        return self._reduce(diff * diff, self.dtype)

    def backward(self, g):
        x, target = self.operands()
        compute = upcast(np.empty(0, self.dtype)).dtype
        diff = x.astype(compute, copy=False) - target.astype(compute, copy=False)
        diff *= 2 * self._element_scale(g, diff.size)
        need_x, need_target = self.needs_input_grad
        shapes = self._input_shapes
        return (sum_to(diff, shapes[0]) if need_x else None), (sum_to(-diff, shapes[1]) if need_target else None)

    def backward_graph(self, g):
        def composite(x, target):
            diff = x - target
            return self._reduce_graph(diff * diff)

        return recomputed_grads(self, composite, self.operands(), g)


class BinaryCrossEntropyWithLogits(_ElementLoss):
    """loss = (1 - t) x - (1 + (pos_weight - 1) t) log(sigmoid(x)), times weight: torch's formula, with
    log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|)) so that no logit overflows."""

    op_name = "binary_cross_entropy_with_logits"

    def _check(self, x, target, weight, pos_weight):
        op = self.op_name
        if not _is_float(x) or not _is_float(target):
            raise op_error(op, "floating-point input and target", f"{x.dtype} and {target.dtype}",
                           "targets are probabilities in [0, 1]: convert them with .float()")
        if tuple(target.shape) != tuple(x.shape):
            raise op_error(op, f"a target of the input's shape {tuple(x.shape)}", f"target of shape "
                           f"{tuple(target.shape)}")
        for name, a in (("weight", weight), ("pos_weight", pos_weight)):
            if a is None:
                continue
            try:
                fits = np.broadcast_shapes(a.shape, x.shape) == tuple(x.shape)
            except ValueError:
                fits = False
            if not fits:
                raise op_error(op, f"a {name} that broadcasts to the input's shape {tuple(x.shape)}",
                               f"{name} of shape {tuple(a.shape)}",
                               "pos_weight is usually (C,) for (N, C) logits: one weight per class")

    def _compute(self, *arrays):
        compute = upcast(np.empty(0, self.dtype)).dtype
        return [None if a is None else self.xp.asarray(a).astype(compute, copy=False) for a in arrays]

    def forward(self, x, target, weight=None, pos_weight=None):
        xp = self.xp
        self._check(x, target, weight, pos_weight)
        self.dtype = _promote(x, target)
        x, target, weight, pos_weight = self._compute(x, target, weight, pos_weight)
        log_sig = xp.minimum(x, 0) - xp.log1p(xp.exp(-xp.abs(x)))
        self.stash(log_sig)
        log_weight = log_sig if pos_weight is None else log_sig * ((pos_weight - 1) * target + 1)
        losses = (1 - target) * x - log_weight
        if weight is not None:
            losses *= weight
        return self._reduce(losses, self.dtype)

    def backward(self, g):
        xp = self.xp
        x, target, weight, pos_weight = self._compute(*self.operands())
        (log_sig,) = self.stashed
        scale = self._element_scale(g, x.size)
        if weight is not None:
            scale = scale * weight
        need_x, need_target = self.needs_input_grad[:2]
        grad_x = grad_target = None
        if need_x:  # d/dx = (1 + (pw - 1) t) sigmoid(x) - pw t
            sig = xp.exp(log_sig)
            grad_x = sig - target if pos_weight is None else ((pos_weight - 1) * target + 1) * sig - pos_weight * target
            grad_x *= scale
        if need_target:  # d/dt = -x - (pw - 1) log(sigmoid(x))
            grad_target = -x if pos_weight is None else -x - (pos_weight - 1) * log_sig
            grad_target = grad_target * scale
        return grad_x, grad_target, None, None

    def backward_graph(self, g):
        def composite(x, target, weight=None, pos_weight=None):
            from .activations import softplus

            log_sig = -softplus(-x)
            log_weight = log_sig if pos_weight is None else log_sig * ((pos_weight - 1) * target + 1)
            losses = (1 - target) * x - log_weight
            return self._reduce_graph(losses * weight if weight is not None else losses)

        return recomputed_grads(self, composite, self.operands(), g)


# ------------------------------------------------------------------------------------------ public
def _check_class_weight(op, weight):
    if isinstance(weight, Tensor) and weight.requires_grad:
        raise op_error(op, "a weight that does not require grad", "weight with requires_grad=True",
                       "class weights are constants of the loss (as in torch): pass weight.detach()")


def _check_smoothing(label_smoothing):
    if label_smoothing > 1.0:
        raise op_error("cross_entropy", "label_smoothing between 0.0 and 1.0", f"label_smoothing={label_smoothing}")
    return max(float(label_smoothing), 0.0)  # torch applies none for values <= 0


def cross_entropy(logits, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    """Cross-entropy of logits (N, C), (C,) or (N, C, d1, ...), as torch.

    Class-index targets are integers of shape (N,), () or (N, d1, ...): targets equal to ``ignore_index``
    contribute nothing; ``weight`` (C,) scales each row's loss by its target's weight, and 'mean' divides by the
    sum of those weights (by the count of rows without weights; nan when all are ignored). Class-probability
    targets are floats of the input's shape (soft labels): 'mean' divides by the number of rows, and they get
    gradients too. ``label_smoothing`` eps mixes the target with the uniform distribution: (1 - eps) * target +
    eps / C. 'sum' adds; 'none' keeps the per-row losses in the target's layout."""
    eps = _check_smoothing(label_smoothing)
    if is_array_like(target) and _is_float(target) and tuple(target.shape) == tuple(logits.shape):
        if ignore_index >= 0:
            raise op_error("cross_entropy", "a negative ignore_index (unused) with class-probability targets",
                           f"ignore_index={ignore_index}", "ignore_index applies to class-index targets only")
        return SoftCrossEntropy(reduction, eps).apply(logits, target, weight)
    _check_class_weight("cross_entropy", weight)
    cls = CrossEntropy
    if weight is None and not eps and registry.use("fused_classifier"):  # a registry kernel (kernels/registry.py)
        from . import fused_classifier

        if fused_classifier.applies(logits):
            cls = fused_classifier.FusedCrossEntropy
    return cls(ignore_index, reduction, eps).apply(logits, target, weight)


def nll_loss(log_probs, target, weight=None, ignore_index=-100, reduction="mean"):
    """Negative log-likelihood of class-index targets given log-probabilities (layouts, ``weight``,
    ``ignore_index`` and reductions as cross_entropy's class-index form)."""
    _check_class_weight("nll_loss", weight)
    return NLLLoss(ignore_index, reduction).apply(log_probs, target, weight)


def mse_loss(input, target, reduction="mean"):
    """(input - target)^2, reduced; the two broadcast (with torch's warning when their shapes differ)."""
    if tuple(input.shape) != tuple(target.shape):
        warnings.warn(f"mse_loss: using a target size ({tuple(target.shape)}) that is different to the input size "
                      f"({tuple(input.shape)}); they will broadcast. Please ensure they have the same size.",
                      stacklevel=2)
    return MSELoss(reduction).apply(input, target)


def binary_cross_entropy_with_logits(input, target, weight=None, reduction="mean", pos_weight=None):
    """Sigmoid + binary cross-entropy in one stable op: -w [pos_weight t log(sigmoid(x)) + (1 - t) log(1 -
    sigmoid(x))]. ``target`` has the input's shape; ``weight`` and ``pos_weight`` (e.g. (C,) for (N, C), one per
    class) broadcast to it. Gradients flow to input and target, not to the weights (as torch)."""
    for name, w in (("weight", weight), ("pos_weight", pos_weight)):
        if isinstance(w, Tensor) and w.requires_grad:
            raise op_error("binary_cross_entropy_with_logits", f"a {name} that does not require grad",
                           f"{name} with requires_grad=True", f"pass {name}.detach() (torch does not differentiate it)")
    return BinaryCrossEntropyWithLogits(reduction).apply(input, target, weight, pos_weight)


__all__ = ["cross_entropy", "nll_loss", "mse_loss", "binary_cross_entropy_with_logits"]
