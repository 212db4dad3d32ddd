"""cross_entropy through the fused classifier kernels (kernels/classifier.py): class-index targets without class
weights or label smoothing, on a GPU. A registry kernel (kernels/registry.py): chosen when INFINI_TRAIN_KERNELS
selects it (by default: verified); for anything the kernels do not take, CrossEntropy's array code runs as before.

The forward keeps each row's max and sum of exponentials (float32) and the logits themselves (no exponentials: the
graph holds the logits anyway), the backward writes the logits' gradient in one pass. The per-row losses are float32
(the array code forms them in float64) and are reduced as the array code reduces them."""
from __future__ import annotations

import numpy as np

from ...kernels import classifier
from .loss import CrossEntropy
from .softmax import upcast


def applies(logits):
    """Whether the kernels may take these logits (checked again on the arrays in forward): on a GPU."""
    return logits.device.type == "cuda"


class FusedCrossEntropy(CrossEntropy):
    fused = False

    def forward(self, logits, target, weight=None):
        if weight is not None or self.label_smoothing > 0:
            return super().forward(logits, target, weight)
        xp = self.xp
        x, t, valid = self._rows(logits, target)
        if classifier.why_not(x, t) is not None or not classifier.ready(x.dtype):
            return super().forward(logits, target, weight)
        self._target_shape = tuple(target.shape)
        losses, row_max, row_sum = classifier.forward(xp, x, t, self.ignore_index)
        self.fused = True
        self._target_weights(None, t, valid)
        self.stash(x, row_max, row_sum, t, valid)
        losses = xp.where(valid, losses.astype(np.float64), 0.0)
        return xp.asarray(self._reduce(losses, target.shape)).astype(logits.dtype, copy=False)

    def backward(self, g):
        if not self.fused:
            return super().backward(g)
        x, row_max, row_sum, t, valid = self.stashed
        scale = self._row_scale(g, valid, x.shape[0])
        grad = classifier.backward(self.xp, x, t, row_max, row_sum, scale)
        return self._unrows(grad).astype(g.dtype, copy=False), None, None

    def backward_graph(self, g):
        if self.fused:  # the array code's stash (exponentials shifted by the row max), then its double backward
            x, row_max, row_sum, t, valid = self.stashed
            e = self.xp.exp(upcast(x) - row_max[:, None])
            self.stash(e, row_sum[:, None], t, valid, None, None)
            self.shift, self.fused = row_max[:, None], False
        return super().backward_graph(g)


__all__ = ["FusedCrossEntropy", "applies"]
