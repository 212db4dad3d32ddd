"""The per-step multi-token prediction loss of a DeepSeek-V3 run with ``model.num_nextn_predict_layers`` > 0
(models/deepseek_v3/mtp.py), for metrics.jsonl and the step line; other runs get None from ``mtp_metrics_for``.

A forward hook on each chunk holding the MTP modules (the model, or the last pipeline stage's last chunk) reads the
chunk's ``mtp_loss`` (the mean over the depths, before ``train.mtp_loss_weight``) after every training forward (grad
enabled). ``collect()`` gives ``mtp_loss``: the mean over the step's micro-batches and data-parallel ranks, summed over
the world (one all-reduce, every rank), so a parallel run logs what the one-process run with the same global batch
logs."""
from __future__ import annotations

import numpy as np

from .. import distributed as dist
from ..autograd.grad_mode import is_grad_enabled
from ..tensor import Tensor


class MTPMetrics:
    def __init__(self, chunks, dims):
        self.dims, self.loss_sum, self.forwards = dims, 0.0, 0
        self.handles = [c.register_forward_hook(self._after_forward) for c in chunks if "mtp" in c._modules]

    def _after_forward(self, chunk, args, output):
        if is_grad_enabled() and chunk.training and chunk.mtp_loss is not None:
            self.loss_sum += float(chunk.mtp_loss.item())
            self.forwards += 1

    def collect(self):
        """{"mtp_loss": the step's mean}, the same on every rank; starts the next step's."""
        total = np.array([self.loss_sum, self.forwards], np.float64)
        if self.dims.world > 1:
            both = Tensor(total)
            dist.all_reduce(both, "sum")
            total = both.numpy()
            if self.dims.tensor_parallel:  # (each tensor rank of a stage computed the same loss)
                total = total / self.dims.tp_size
        self.loss_sum, self.forwards = 0.0, 0
        return {"mtp_loss": float(total[0]) / max(float(total[1]), 1.0)}

    @staticmethod
    def describe(record):
        return f" | mtp {record['mtp_loss']:.4f}"


def mtp_metrics_for(model, dims):
    """MTPMetrics of a model with multi-token prediction modules (whole or a pipeline stage), else None."""
    from ..models.pipeline_lm import stage_chunks

    if not getattr(model.config, "num_nextn_predict_layers", 0):
        return None
    return MTPMetrics(stage_chunks(model), dims)


__all__ = ["MTPMetrics", "mtp_metrics_for"]
