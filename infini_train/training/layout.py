"""Where this rank sits in a run's process mesh (``parallel.tensor`` x data parallel), and the parts of a step
that depend on it: per-rank seeds, the loss average, the sequence-parallel gradient sums and clipping.

With ``parallel.tensor = 1`` there is no mesh: the data-parallel group is the world, exactly as before tensor
parallelism existed, so such runs (and their checkpoints and resumes) are unchanged.
"""
from __future__ import annotations

import numpy as np

from .. import backend
from .. import distributed as dist
from ..models.gpt2 import TP_RANDOM
from ..nn.parallel.grad_norm import clip_grad_norm_tensor_parallel_
from ..nn.parallel.tensor_parallel import all_reduce_grads
from ..nn.utils import clip_grad_norm_
from ..tensor import Tensor


def step_seed(seed, rank, step, *more):
    """The seed of one step's randomness (dropout) on one data-parallel rank: different per rank, and a
    function of the step alone, so a resumed run draws exactly what the uninterrupted run drew. ``more``
    distinguishes further streams (the tensor-parallel shards' own)."""
    return int(np.random.SeedSequence([seed, rank, step, *more]).generate_state(1)[0])


class Layout:
    """``Layout(tensor=1, sequence=False)``: this rank's data-parallel and tensor-parallel coordinates and groups
    (``tp_group`` None without tensor parallelism)."""

    def __init__(self, tensor=1, sequence=False):
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.tp_size, self.sequence_parallel = int(tensor), bool(sequence)
        if self.tp_size == 1:
            self.mesh = None
            self.tp_group, self.tp_rank = None, 0
            self.dp_group = dist.default_group()
            self.dp_rank, self.dp_size = self.rank, self.world
        else:
            from ..distributed.mesh import ProcessMesh

            self.mesh = ProcessMesh(tensor=self.tp_size)
            self.tp_group, self.tp_rank = self.mesh.tensor_group, self.mesh.tp_rank
            self.dp_group, self.dp_rank, self.dp_size = self.mesh.data_group, self.mesh.dp_rank, self.mesh.dp_size

    @property
    def tensor_parallel(self):
        return self.tp_size > 1

    def describe(self):
        if not self.tensor_parallel:
            return f"data parallel {self.dp_size}"
        sp = " with sequence parallel" if self.sequence_parallel else ""
        return f"tensor parallel {self.tp_size}{sp} x data parallel {self.dp_size}"

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
        """Sum over the tensor group the gradients that are partial per sequence shard (layer norms and
        row-parallel biases under sequence parallelism); under ZeRO the pieces of them this rank owns."""
        if not self.sequence_parallel:
            return
        if hasattr(optimizer, "owned_grads"):
            grads = [g for p, g in optimizer.owned_grads() if getattr(p, "sequence_parallel", False)]
        else:
            grads = [p.grad for p in model.parameters() if getattr(p, "sequence_parallel", False)
                     and p.grad is not None]
        all_reduce_grads(grads, self.tp_group)

    def clip(self, params, optimizer, max_norm):
        """Clip by the whole model's gradient norm; returns it as a float."""
        if hasattr(optimizer, "clip_grad_norm_"):  # ZeRO: the norm over every data-parallel rank's shard
            return float(optimizer.clip_grad_norm_(max_norm, tensor_group=self.tp_group).item())
        if self.tensor_parallel:
            return float(clip_grad_norm_tensor_parallel_(params, max_norm, self.tp_group).item())
        return float(clip_grad_norm_(params, max_norm).item())


__all__ = ["Layout", "step_seed"]
