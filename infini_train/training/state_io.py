"""The run's state as a one-process run holds it, from any layout and back: what a checkpoint writes and a resume
reads. One object, chosen once from the layout when the run is built, so the loop saves and resumes the same way
for every layout (the seam that distributed checkpoints replace).

``gather()`` (collective) returns the whole model and optimizer state on rank 0 and (None, None) elsewhere;
``scatter(model_state, optimizer_state)`` loads whole state into this rank's part of the model and optimizer. The
loader positions of the data-parallel ranks travel the same way (``data_positions`` / ``load_data_position``).

- one process or data parallel: the local state is the whole state (rank 0's);
- tensor parallel: rank 0's tensor group gathers the split tensors (each rank keeps its shards on load);
- pipeline stages (and tensor shards within each): stage 0's tensor rank 0 gathers every stage's entries, by name;
- LoRA: only the adapters (whole) and their optimizer state; the base weights are pinned by reference.
ZeRO's sharded optimizer state is consolidated on rank 0 first in every case.
"""
from __future__ import annotations

import numpy as np

from .. import distributed as dist
from ..nn.lora import load_lora_state_dict, lora_state_dict
from ..nn.parallel.pipeline_state import gather_model_state, gather_optimizer_state, local_optimizer_state
from ..nn.parallel.whole_state import (load_whole_state_dict, shard_optimizer_state, shard_state_dict,
                                       whole_optimizer_state, whole_state_dict)
from ..tensor import Tensor


class StateIO:
    """Whole state for one process or data parallelism (the base of the per-layout variants)."""

    def __init__(self, dims, model, optimizer, zero_stage):
        self.dims, self.model, self.optimizer, self.zero_stage = dims, model, optimizer, zero_stage

    def gather(self):
        """(model state, optimizer state) of the whole model on rank 0, (None, None) elsewhere (collective)."""
        if self.zero_stage:
            self.optimizer.consolidate_state_dict(to=0)
        return self._gather_local()

    def _gather_local(self):
        if self.dims.rank != 0:
            return None, None
        return self.model.state_dict(), self.optimizer.state_dict()

    def scatter(self, model_state, optimizer_state):
        """Load whole state: each rank keeps its part."""
        self.model.load_state_dict(model_state)
        self.optimizer.load_state_dict(optimizer_state)

    def data_positions(self, loader):
        """Every data-parallel rank's loader position, in data-parallel order (collective; the tensor ranks and
        pipeline stages of a data-parallel rank read the same batches)."""
        mine = loader.state_dict()
        dims = self.dims
        if dims.world == 1 or getattr(loader, "global_position", False):  # (an SFT loader's: the same on every rank)
            return [mine]
        packed = Tensor(np.array([mine["shard"], mine["position"], dims.dp_rank, dims.tp_rank], np.int64))
        parts = [Tensor(np.zeros(4, np.int64)) for _ in range(dims.world)]
        dist.all_gather(parts, packed)
        by_dp = {int(p.numpy()[2]): p.numpy() for p in parts if int(p.numpy()[3]) == 0}
        return [{"shard": int(by_dp[r][0]), "position": int(by_dp[r][1])} for r in range(dims.dp_size)]

    def load_data_position(self, loader, positions):
        """This rank's position from ``data_positions``'s list (rank 0's when the data-parallel size changed)."""
        dims = self.dims
        loader.load_state_dict(positions[dims.dp_rank] if dims.dp_size == len(positions) else positions[0])


class TensorShardedState(StateIO):
    """Split tensors gathered whole over rank 0's tensor group; on load each rank slices its shards."""

    def _gather_local(self):
        if self.dims.dp_rank != 0:
            return None, None
        group = self.dims.tp_group  # a collective over rank 0's tensor group; only rank 0 keeps what it gathered
        return (whole_state_dict(self.model, group, to=0),
                whole_optimizer_state(self.optimizer.state_dict(), self.optimizer, group, to=0))

    def scatter(self, model_state, optimizer_state):
        group = self.dims.tp_group
        load_whole_state_dict(self.model, model_state, group)
        self.optimizer.load_state_dict(shard_optimizer_state(optimizer_state, self.optimizer, group))


class PipelineStagesState(StateIO):
    """Every stage's entries (each gathered whole over its tensor group first) sent to rank 0 by name; on load
    every stage keeps its entries of the whole model's state."""

    def _gather_local(self):
        dims, model = self.dims, self.model
        if dims.dp_rank != 0:
            return None, None
        model_state = gather_model_state(model, model.whole_state_names, dims.pp_group, dims.tp_group)
        optimizer_state = gather_optimizer_state(self.optimizer, self.optimizer.state_dict(), model.canonical_names(),
                                                 model.whole_groups, dims.pp_group, dims.tp_group)
        return model_state, optimizer_state

    def scatter(self, model_state, optimizer_state):
        model, group = self.model, self.dims.tp_group
        model.load_state_dict(shard_state_dict(model, model_state, group) if group is not None else model_state)
        self.optimizer.load_state_dict(local_optimizer_state(optimizer_state, self.optimizer,
                                                             model.canonical_names(), model.whole_groups, group))


class LoraAdapterState(StateIO):
    """A LoRA run's adapters, gathered whole over each tensor group, and their optimizer state; the base weights
    are not saved (the checkpoint pins them by reference)."""

    def _gather_local(self):
        dims = self.dims
        adapters = lora_state_dict(self.model, whole=True)  # a collective over each tensor group
        if dims.dp_rank != 0:
            return None, None
        optimizer_state = self.optimizer.state_dict()
        if dims.tensor_parallel:
            optimizer_state = whole_optimizer_state(optimizer_state, self.optimizer, dims.tp_group, to=0)
        return (adapters, optimizer_state) if dims.rank == 0 else (None, None)

    def scatter(self, model_state, optimizer_state):
        load_lora_state_dict(self.model, model_state)
        group = self.dims.tp_group
        self.optimizer.load_state_dict(shard_optimizer_state(optimizer_state, self.optimizer, group)
                                       if group is not None else optimizer_state)


def state_io_for(dims, model, optimizer, zero_stage, lora):
    """The StateIO of a run: ``model`` is the unwrapped model (a PipelinedLM for pipeline stages), ``dims`` the
    run's ParallelDims, ``lora`` whether only adapters train."""
    if lora:
        cls = LoraAdapterState
    elif dims.pipeline_parallel:
        cls = PipelineStagesState
    elif dims.tensor_parallel:
        cls = TensorShardedState
    else:
        cls = StateIO
    return cls(dims, model, optimizer, zero_stage)


__all__ = ["StateIO", "TensorShardedState", "PipelineStagesState", "LoraAdapterState", "state_io_for"]
