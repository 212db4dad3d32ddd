"""Where this rank sits in a run's process mesh (``parallel.pipeline`` x data parallel x ``parallel.tensor``): its
coordinates and groups, per-rank seeds and the loss average. What the layout changes in the model, its gradients and
its clipping is the model spec's plan (models/parallelize.py).

With ``parallel.tensor = parallel.pipeline = 1`` there is no mesh: the data-parallel group is the world, exactly as
before model parallelism existed, so such runs (and their checkpoints and resumes) are unchanged.
"""
from __future__ import annotations

import numpy as np

from .. import backend
from .. import distributed as dist
from ..models.attention import TP_RANDOM
from ..nn.parallel.pipeline_schedules import ScheduleError, check_schedule
from ..tensor import Tensor
from .config import ConfigError


def step_seed(seed, rank, step, *more):
    """The seed of one step's randomness (dropout) on one data-parallel rank: different per rank, and a
    function of the step alone, so a resumed run draws exactly what the uninterrupted run drew. ``more``
    distinguishes further streams (the tensor-parallel shards' own)."""
    return int(np.random.SeedSequence([seed, rank, step, *more]).generate_state(1)[0])


class ParallelDims:
    """``ParallelDims(tensor=1, sequence=False, pipeline=1, virtual=1, schedule="1f1b", context=1, expert=1,
    context_method="ring", context_a2a=1, replicate=1)``: the run's parallel sizes and this rank's coordinates and
    groups in them (``tp_group`` / ``pp_group`` / ``cp_group`` None without tensor / pipeline / context parallelism).
    Gradients are averaged over ``grad_group``: the data-parallel group, times the context group under context
    parallelism. ``expert``: the expert-parallel size (its groups are models/expert_layout.py's). ``context_method``
    (ring | ulysses | hybrid) is how attention runs over the context group: ``cp_a2a_group`` is its all-to-all group
    (ulysses: the context group; hybrid: groups of ``context_a2a`` consecutive context ranks), ``cp_ring_group``
    hybrid's ring across them. ``replicate`` > 1 (HSDP, with ZeRO-3): the grad group as that many replicas, each
    sharding over its own ranks (``shard_mesh``: fully_shard's HybridShardMesh; ``shard_group``: the ranks a shard is
    split over)."""

    def __init__(self, tensor=1, sequence=False, pipeline=1, virtual=1, schedule="1f1b", context=1, expert=1,
                 context_method="ring", context_a2a=1, replicate=1):
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.replicate = int(replicate)
        self._setup_mesh(tensor, sequence, pipeline, virtual, schedule, context, expert, context_method, context_a2a)
        self.shard_mesh = self.shard_group = self.grad_group
        if self.replicate > 1:
            from ..distributed.fsdp import HybridShardMesh

            try:
                self.shard_mesh = HybridShardMesh.build(self.replicate, self._grad_groups())
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            self.shard_group = self.shard_mesh.shard_group

    def _grad_groups(self):
        """Every grad group of the world (lists of world ranks, data-parallel order), alike on every rank."""
        if self.mesh is None:
            return [list(range(self.world))]
        from ..distributed.mesh import mesh_groups

        kind = "grad" if self.cp_size > 1 else "data"
        return [ranks for k, ranks in mesh_groups(tensor=self.tp_size, data=self.dp_size, pipeline=self.pp_size,
                                                  context=self.cp_size) if k == kind]

    def _setup_mesh(self, tensor, sequence, pipeline, virtual, schedule, context, expert, context_method,
                    context_a2a):
        self.expert_size = int(expert)  # the experts split over groups of this many data-parallel ranks
        self.tp_size, self.sequence_parallel = int(tensor), bool(sequence)
        self.pp_size, self.virtual, self.schedule = int(pipeline), int(virtual), schedule
        self.cp_size = int(context)
        self.cp_method = context_method if self.cp_size > 1 else "ring"
        self.cp_a2a = {"ring": 1, "ulysses": self.cp_size, "hybrid": int(context_a2a)}[self.cp_method]
        self.tp_group = self.pp_group = self.embedding_group = self.cp_group = None
        self.cp_a2a_group = self.cp_ring_group = None
        self.tp_rank = self.pp_rank = self.cp_rank = 0
        if self.tp_size == 1 and self.pp_size == 1 and self.cp_size == 1:
            self.mesh = None
            self.dp_group = self.grad_group = dist.default_group()
            self.dp_rank, self.dp_size = self.rank, self.world
            return
        from ..distributed.mesh import ProcessMesh

        self.mesh = mesh = ProcessMesh(tensor=self.tp_size, pipeline=self.pp_size, context=self.cp_size,
                                       context_a2a=self.cp_a2a if self.cp_method == "hybrid" else 1)
        self.dp_group, self.dp_rank, self.dp_size = mesh.data_group, mesh.dp_rank, mesh.dp_size
        self.grad_group = mesh.grad_group
        if self.cp_size > 1:
            self.cp_group, self.cp_rank = mesh.context_group, mesh.cp_rank
            if self.cp_method == "ulysses":
                self.cp_a2a_group = mesh.context_group
            elif self.cp_method == "hybrid":
                self.cp_a2a_group, self.cp_ring_group = mesh.context_a2a_group, mesh.context_ring_group
        if self.tp_size > 1:
            self.tp_group, self.tp_rank = mesh.tensor_group, mesh.tp_rank
        if self.pp_size > 1:
            self.pp_group, self.pp_rank, self.embedding_group = mesh.pipeline_group, mesh.pp_rank, mesh.embedding_group

    def group_names(self):
        """{world ranks of a group: its role} for this rank's groups (the more specific role where two coincide)."""
        roles = [("world", dist.default_group()), ("data", self.dp_group),
                 ("data x context", self.grad_group if self.cp_size > 1 else None), ("pipeline", self.pp_group),
                 ("embedding", self.embedding_group), ("context", self.cp_group), ("tensor", self.tp_group)]
        if self.cp_method == "hybrid":
            roles += [("context all-to-all", self.cp_a2a_group), ("context ring", self.cp_ring_group)]
        if self.replicate > 1:
            roles += [("shard", self.shard_group), ("replicate", self.shard_mesh.replicate_group)]
        return {tuple(group.ranks): name for name, group in roles if group is not None}

    @property
    def tensor_parallel(self):
        return self.tp_size > 1

    @property
    def pipeline_parallel(self):
        return self.pp_size > 1

    @property
    def context_parallel(self):
        return self.cp_size > 1

    @property
    def context_layout(self):
        """The context method in words: ``ring``, ``ulysses`` or ``hybrid: all-to-all 2 x ring 2``."""
        if self.cp_method == "hybrid":
            return f"hybrid: all-to-all {self.cp_a2a} x ring {self.cp_size // self.cp_a2a}"
        return self.cp_method

    @property
    def grad_size(self):
        """The ranks gradients are averaged over (data x context)."""
        return self.dp_size * self.cp_size

    def describe(self):
        parts = []
        if self.pipeline_parallel:
            chunks = f", {self.virtual} chunks per stage" if self.virtual > 1 else ""
            parts.append(f"pipeline {self.pp_size} ({self.schedule}{chunks})")
        parts.append(f"data parallel {self.dp_size}" + (f" (HSDP: {self.replicate} replicas x shards of "
                                                         f"{self.shard_group.size})" if self.replicate > 1 else ""))
        if self.expert_size > 1:
            parts.append(f"expert parallel {self.expert_size}")
        if self.context_parallel:
            parts.append(f"context parallel {self.cp_size} ({self.context_layout})")
        if self.tensor_parallel:
            parts.append(f"tensor parallel {self.tp_size}" + (" with sequence parallel" if self.sequence_parallel
                                                              else ""))
        return " x ".join(parts)

    def check_schedule(self, micro_batches):
        """A ConfigError when the pipeline schedule cannot run ``micro_batches`` (the gradient-accumulation steps) per
        step over this layout's stages; nothing without pipeline parallelism."""
        if not self.pipeline_parallel:
            return
        try:
            check_schedule(self.schedule, self.pp_size, self.virtual, micro_batches)
        except ScheduleError as exc:
            raise ConfigError(str(exc)) from None

    def seed_step(self, seed, step):
        """Seed the step's random streams: the default one per data-parallel rank (the same on every rank of a
        tensor group: masks of replicated activations agree), the shards' one per (data, tensor) rank."""
        backend.manual_seed(step_seed(seed, self.dp_rank, step))
        if self.tensor_parallel:
            backend.seed_fork(TP_RANDOM, step_seed(seed, self.dp_rank, step, 1 + self.tp_rank))

    def mean_over_data(self, value):
        """The average of a float over the data-parallel ranks and, under context parallelism, the context ranks
        (each holds the loss of its share of the sequence; the tensor ranks of a group hold the same)."""
        if self.grad_size == 1:
            return value
        mean = Tensor(np.array([value], np.float64))
        dist.all_reduce(mean, "avg", group=self.grad_group)
        return float(mean.numpy()[0])

    def sum_over_data(self, count):
        """The sum of an integer over the data-parallel ranks and, under context parallelism, the context ranks."""
        if self.grad_size == 1:
            return int(count)
        total = Tensor(np.array([count], np.int64))
        dist.all_reduce(total, "sum", group=self.grad_group)
        return int(total.numpy()[0])


__all__ = ["ParallelDims", "step_seed"]
