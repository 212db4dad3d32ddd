"""Where this rank sits in a run's process mesh (``parallel.pipeline`` x data parallel x ``parallel.tensor``), and
the parts of a step that depend on it: per-rank seeds, the loss average, the gradient sums between ranks that
hold parts or copies of one tensor, and clipping by the whole model's norm.

With ``parallel.tensor = parallel.pipeline = 1`` there is no mesh: the data-parallel group is the world, exactly as
before model parallelism existed, so such runs (and their checkpoints and resumes) are unchanged.
"""
from __future__ import annotations

import numpy as np

from .. import backend
from .. import distributed as dist
from ..models.attention import TP_RANDOM
from ..nn.parallel.grad_norm import clip_grad_norm_model_parallel_
from ..nn.parallel.tensor_parallel import all_reduce_grads
from ..nn.utils import clip_grad_norm_
from ..tensor import Tensor


def step_seed(seed, rank, step, *more):
    """The seed of one step's randomness (dropout) on one data-parallel rank: different per rank, and a
    function of the step alone, so a resumed run draws exactly what the uninterrupted run drew. ``more``
    distinguishes further streams (the tensor-parallel shards' own)."""
    return int(np.random.SeedSequence([seed, rank, step, *more]).generate_state(1)[0])


class Layout:
    """``Layout(tensor=1, sequence=False, pipeline=1, virtual=1, schedule="1f1b")``: this rank's coordinates and
    groups (``tp_group`` / ``pp_group`` None without tensor / pipeline parallelism)."""

    def __init__(self, tensor=1, sequence=False, pipeline=1, virtual=1, schedule="1f1b"):
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.tp_size, self.sequence_parallel = int(tensor), bool(sequence)
        self.pp_size, self.virtual, self.schedule = int(pipeline), int(virtual), schedule
        self.zero_stage = 0  # set by the run: how pipeline runs reduce gradients over the data-parallel group
        self.tp_group = self.pp_group = self.embedding_group = None
        self.tp_rank = self.pp_rank = 0
        if self.tp_size == 1 and self.pp_size == 1:
            self.mesh = None
            self.dp_group = dist.default_group()
            self.dp_rank, self.dp_size = self.rank, self.world
            return
        from ..distributed.mesh import ProcessMesh

        self.mesh = mesh = ProcessMesh(tensor=self.tp_size, pipeline=self.pp_size)
        self.dp_group, self.dp_rank, self.dp_size = mesh.data_group, mesh.dp_rank, mesh.dp_size
        if self.tp_size > 1:
            self.tp_group, self.tp_rank = mesh.tensor_group, mesh.tp_rank
        if self.pp_size > 1:
            self.pp_group, self.pp_rank, self.embedding_group = mesh.pipeline_group, mesh.pp_rank, mesh.embedding_group

    @property
    def tensor_parallel(self):
        return self.tp_size > 1

    @property
    def pipeline_parallel(self):
        return self.pp_size > 1

    def describe(self):
        parts = []
        if self.pipeline_parallel:
            chunks = f", {self.virtual} chunks per stage" if self.virtual > 1 else ""
            parts.append(f"pipeline {self.pp_size} ({self.schedule}{chunks})")
        parts.append(f"data parallel {self.dp_size}")
        if self.tensor_parallel:
            parts.append(f"tensor parallel {self.tp_size}" + (" with sequence parallel" if self.sequence_parallel
                                                              else ""))
        return " x ".join(parts)

    def seed_step(self, seed, step):
        """Seed the step's random streams: the default one per data-parallel rank (the same on every rank of a
        tensor group: masks of replicated activations agree), the shards' one per (data, tensor) rank."""
        backend.manual_seed(step_seed(seed, self.dp_rank, step))
        if self.tensor_parallel:
            backend.seed_fork(TP_RANDOM, step_seed(seed, self.dp_rank, step, 1 + self.tp_rank))

    def mean_over_data(self, value):
        """The average of a float over the data-parallel ranks (the tensor ranks of a group hold the same)."""
        if self.dp_size == 1:
            return value
        mean = Tensor(np.array([value], np.float64))
        dist.all_reduce(mean, "avg", group=self.dp_group)
        return float(mean.numpy()[0])

    def finish_gradients(self, model, optimizer):
        """Sum over the ranks that hold parts or copies of one tensor the gradients each computed part of: the
        tied embedding's copies on the first and last pipeline stage, and (with sequence parallelism) the layer
        norms' and row-parallel biases' over the tensor group. Pipeline runs then average the gradients over the
        data-parallel group (no DDP reduces them during backward); elsewhere DDP already did, and under ZeRO the
        sequence-parallel sums cover the pieces this rank owns."""
        if self.pipeline_parallel:
            if self.embedding_group is not None:
                all_reduce_grads([p.grad for p in model.shared_embedding_params() if p.grad is not None],
                                 self.embedding_group)
            if self.sequence_parallel:
                all_reduce_grads(_sequence_parallel_grads(model), self.tp_group)
            if self.dp_size > 1:
                if hasattr(optimizer, "reduce_gradients"):
                    optimizer.reduce_gradients(shard=self.zero_stage == 2)
                else:
                    grads = [p.grad for p in model.parameters() if p.grad is not None]
                    all_reduce_grads(grads, self.dp_group)
                    for g in grads:
                        g.array /= self.dp_size
            return
        if not self.sequence_parallel:
            return
        if hasattr(optimizer, "owned_grads"):
            grads = [g for p, g in optimizer.owned_grads() if getattr(p, "sequence_parallel", False)]
        else:
            grads = _sequence_parallel_grads(model)
        all_reduce_grads(grads, self.tp_group)

    def clip(self, params, optimizer, max_norm):
        """Clip by the whole model's gradient norm; returns it as a float."""
        if hasattr(optimizer, "clip_grad_norm_"):  # ZeRO: the norm over every data-parallel rank's shard
            return float(optimizer.clip_grad_norm_(max_norm, tensor_group=self.tp_group,
                                                   pipeline_group=self.pp_group).item())
        if self.mesh is not None:
            return float(clip_grad_norm_model_parallel_(params, max_norm, self.tp_group, self.pp_group).item())
        return float(clip_grad_norm_(params, max_norm).item())


def _sequence_parallel_grads(model):
    return [p.grad for p in model.parameters() if getattr(p, "sequence_parallel", False) and p.grad is not None]


__all__ = ["Layout", "step_seed"]
