"""Per-step router statistics of a mixture-of-experts run (Qwen3-MoE, Mixtral): the load-balancing loss and how
evenly the tokens spread over the experts, for metrics.jsonl and the step line. Other models get None from
``moe_metrics_for`` and pay nothing.

A forward hook on the model (on each chunk of a pipeline stage) reads, after every training forward (grad enabled: not
evaluation or sampling), the model's ``aux_loss`` (before the coefficient; the last chunk's) and each sparse layer's
``tokens_per_expert``. ``collect()`` after the
step gives the step's values over its micro-batches, the data-parallel ranks and the pipeline stages (one all-reduce
over the world), so a parallel run logs what the one-process run with the same global batch logs:

- ``aux_loss``: the mean load-balancing loss of the step's micro-batches;
- ``expert_load_max``: over the sparse layers, the largest (most tokens an expert got) / (mean per expert); 1 is an
  even spread, num_experts / top_k the worst;
- ``experts_idle``: (layer, expert) pairs that got no token in the step;
- DeepSeek-MoE models (routers with an ``e_score_correction_bias``), after the step's bias update:
  ``correction_bias_absmax`` and ``correction_bias_mean_abs``, the largest and the mean |bias| over the sparse layers'
  experts (each layer's from its pipeline stage).
"""
from __future__ import annotations

import numpy as np

from .. import distributed as dist
from ..autograd.grad_mode import is_grad_enabled
from ..tensor import Tensor


class MoEMetrics:
    """``chunks``: the mixture-of-experts modules this rank runs (the model, or its pipeline stage's chunks)."""

    def __init__(self, chunks, dims, expert=1):
        self.dims, self.expert = dims, expert
        config = chunks[0].config
        sparse = [layer for layer in range(config.n_layers) if config.sparse_layer(layer)]
        self.row = {layer: i for i, layer in enumerate(sparse)}  # the whole model's sparse layers, in order
        self.num_experts = config.num_experts
        self._reset()
        self.handles = [chunk.register_forward_hook(self._after_forward) for chunk in chunks]
        self.routers = {}  # sparse layer -> its router, for the DeepSeek-MoE ones (correction biases)
        for chunk in chunks:
            for layer, block in chunk.numbered_blocks():
                gate = getattr(block.mlp, "gate", None) if layer in self.row else None
                if gate is not None and "e_score_correction_bias" in gate._buffers:
                    self.routers[layer] = gate
        self.biased = chunks[0].sequence_balanced  # a DeepSeek-MoE model (on every stage, with or without layers)

    def _reset(self):
        self.aux_sum, self.forwards = 0.0, 0
        self.counts = np.zeros((len(self.row), self.num_experts), np.int64)

    def _after_forward(self, chunk, args, output):
        if not is_grad_enabled():
            return
        if chunk.last and chunk.aux_loss is not None:
            self.aux_sum += float(chunk.aux_loss.item())
            self.forwards += 1
        for layer, block in chunk.numbered_blocks():
            if layer in self.row:  # expert parallelism: every expert's count over the expert group (each of its
                # E ranks holds it)
                mlp = block.mlp
                self.counts[self.row[layer]] += mlp.tokens_per_expert if self.expert == 1 else \
                    mlp.group_tokens_per_expert

    def collect(self):
        """The step's {aux_loss, expert_load_max, experts_idle} (and the correction biases' summary), the same on
        every rank; starts the next step's."""
        aux, counts = self.aux_sum / max(self.forwards, 1), self.counts.astype(np.float64)
        biases = np.zeros(counts.shape)
        for layer, gate in self.routers.items():
            biases[self.row[layer]] = gate.e_score_correction_bias.numpy()
        if self.dims.world > 1:  # the last stage's losses, every stage's layers, every data rank's tokens
            parts = [[self.aux_sum, self.forwards], counts.ravel()] + ([biases.ravel()] if self.biased else [])
            both = Tensor(np.concatenate(parts))
            dist.all_reduce(both, "sum")
            total = both.numpy()
            dims = self.dims  # tensor ranks without sequence parallelism route the same tokens
            copies = self.expert * (dims.tp_size if dims.tensor_parallel and not dims.sequence_parallel else 1)
            aux = float(total[0]) / max(float(total[1]), 1.0)
            counts = total[2:2 + counts.size].reshape(counts.shape) / copies
            if self.biased:  # every rank of a layer's pipeline stage holds the same bias
                biases = total[2 + counts.size:].reshape(counts.shape) / (dims.world // dims.pp_size)
        self._reset()
        mean = counts.mean(axis=1)
        load = float(np.max(counts.max(axis=1) / np.where(mean > 0, mean, 1.0)))
        record = {"aux_loss": aux, "expert_load_max": load, "experts_idle": int((counts == 0).sum())}
        if self.biased:
            record.update(correction_bias_absmax=float(np.abs(biases).max()),
                          correction_bias_mean_abs=float(np.abs(biases).mean()))
        return record

    @staticmethod
    def describe(record):
        """The step line's part: `` | aux 0.0123 | load max/mean 1.42 | idle experts 0``."""
        return (f" | aux {record['aux_loss']:.4f} | load max/mean {record['expert_load_max']:.2f} | idle experts "
                f"{record['experts_idle']}")


def moe_metrics_for(model, dims, expert=1):
    """MoEMetrics of a mixture-of-experts model (whole or a pipeline stage; ``expert``: the expert-parallel size),
    else None (one isinstance check)."""
    from ..models.moe_lm import moe_chunks

    chunks = moe_chunks(model)
    return MoEMetrics(chunks, dims, expert) if chunks else None


__all__ = ["MoEMetrics", "moe_metrics_for"]
