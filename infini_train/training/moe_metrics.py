"""Per-step router statistics of a mixture-of-experts run (Qwen3-MoE, Mixtral): the load-balancing loss and how
evenly the tokens spread over the experts, for metrics.jsonl and the step line. Other models get None from
``moe_metrics_for`` and pay nothing.

A forward hook on the model reads, after every training forward (grad enabled: not evaluation or sampling), the
model's ``aux_loss`` (before the coefficient) and each sparse layer's ``tokens_per_expert``. ``collect()`` after the
step gives the step's values over its micro-batches and the data-parallel ranks (one all-reduce), so a data-parallel
run logs what the one-process run with the same global batch logs:

- ``aux_loss``: the mean load-balancing loss of the step's micro-batches;
- ``expert_load_max``: over the sparse layers, the largest (most tokens an expert got) / (mean per expert); 1 is an
  even spread, num_experts / top_k the worst;
- ``experts_idle``: (layer, expert) pairs that got no token in the step.
"""
from __future__ import annotations

import numpy as np

from .. import distributed as dist
from ..autograd.grad_mode import is_grad_enabled
from ..tensor import Tensor


class MoEMetrics:
    def __init__(self, model, dims, expert=1):
        self.dims, self.expert = dims, expert
        self.num_layers = len(model.moe_layers())
        self.num_experts = model.config.num_experts
        self._reset()
        self.handle = model.register_forward_hook(self._after_forward)

    def _reset(self):
        self.aux_sum, self.forwards = 0.0, 0
        self.counts = np.zeros((self.num_layers, self.num_experts), np.int64)

    def _after_forward(self, model, args, output):
        if not is_grad_enabled() or model.aux_loss is None:
            return
        self.aux_sum += float(model.aux_loss.item())
        self.forwards += 1
        for i, layer in enumerate(model.moe_layers()):
            # expert parallelism: every expert's count over the expert group (each of its E ranks holds it)
            self.counts[i] += layer.tokens_per_expert if self.expert == 1 else layer.group_tokens_per_expert

    def collect(self):
        """The step's {aux_loss, expert_load_max, experts_idle}, the same on every rank; starts the next step's."""
        aux, counts = self.aux_sum / max(self.forwards, 1), self.counts.astype(np.float64)
        if self.dims.grad_size > 1:
            both = Tensor(np.concatenate([[aux], counts.ravel()]))
            dist.all_reduce(both, "sum", group=self.dims.grad_group)
            total = both.numpy()
            aux, counts = float(total[0]) / self.dims.grad_size, total[1:].reshape(counts.shape) / self.expert
        self._reset()
        mean = counts.mean(axis=1)
        load = float(np.max(counts.max(axis=1) / np.where(mean > 0, mean, 1.0)))
        return {"aux_loss": aux, "expert_load_max": load, "experts_idle": int((counts == 0).sum())}

    @staticmethod
    def describe(record):
        """The step line's part: `` | aux 0.0123 | load max/mean 1.42 | idle experts 0``."""
        return (f" | aux {record['aux_loss']:.4f} | load max/mean {record['expert_load_max']:.2f} | idle experts "
                f"{record['experts_idle']}")


def moe_metrics_for(model, dims, expert=1):
    """MoEMetrics of a mixture-of-experts model (``expert``: the expert-parallel size), else None (one isinstance
    check)."""
    from ..models.moe_lm import MoECausalLM

    return MoEMetrics(model, dims, expert) if isinstance(model, MoECausalLM) else None


__all__ = ["MoEMetrics", "moe_metrics_for"]
