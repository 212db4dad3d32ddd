"""RunState: everything a run saves and resumes, for every layout, through one object (see the package docstring)."""
from __future__ import annotations

import functools

import numpy as np

from .. import distributed as dist
from ..tensor import Tensor
from . import async_save, whole_files
from .directory import read_state
from .entries import RunEntries, WholeNames
from .gather import gather_whole
from .reader import SavedEntries
from .tree import unflatten_state
from .verify import SHARDED
from .writer import write_sharded, write_whole

FORMATS = ("whole", SHARDED)


def whole_names(model, dims, experts=None):
    """The one-process model's names for a layout whose ranks hold part of it (None otherwise): pipeline stages
    (``model`` a PipelinedLM) and expert parallelism (``experts``, which recorded them before splitting)."""
    canonical = model.canonical_names() if dims.pipeline_parallel else None
    if experts is not None:
        return WholeNames(experts.whole_state_names, experts.whole_groups, canonical)
    if dims.pipeline_parallel:
        return WholeNames(model.whole_state_names, model.whole_groups, canonical)
    return None


class RunState:
    """A run's model and optimizer state on this rank, and the loader positions of every rank: ``model`` (unwrapped:
    a PipelinedLM for pipeline stages), ``optimizer`` (a ZeroRedundancyOptimizer when ``zero_stage``), ``dims``
    (the layout: ``tensor_parallel``, ``tp_rank``, ``tp_size``, ``pipeline_parallel``, ``dp_rank``, ``dp_size``,
    ``world``), ``lora``: only the adapters are saved, ``experts``: the expert-parallel split (its
    ``whole_state_names`` and ``whole_groups``)."""

    def __init__(self, model, optimizer, dims, zero_stage=0, lora=False, experts=None):
        self.dims, self.model, self.optimizer = dims, model, optimizer
        tp_rank, tp_size = (dims.tp_rank, dims.tp_size) if dims.tensor_parallel else (0, 1)
        self.entries = RunEntries(model, optimizer, tp_rank, tp_size, bool(zero_stage), lora,
                                  whole_names(model, dims, experts))

    # ----------------------------------------------------------------------------------------- checkpoints
    def save(self, out_dir, step, fmt, record, keep_last=None, run_id=None, saver=None):
        """Write checkpoint ``step`` of ``out_dir`` in ``fmt`` ("sharded": every rank writes the pieces it holds;
        "whole": gathered on rank 0, which writes the one-process files); ``record``: the run's JSON-serialisable
        state for state.json (rank 0's). With ``saver`` (an AsyncSaver) the state is staged and written in the
        background (async_save.py). Collective; returns the step directory on rank 0, None elsewhere."""
        if fmt not in FORMATS:
            raise ValueError(f"RunState.save: expected a format in {FORMATS}, got {fmt!r}")
        entries = self.entries
        if fmt == SHARDED:
            groups = entries.param_groups()
            saved = {"optimizer": {"param_groups": groups}, "model_keys": entries.model_keys(), **record}
            write = write_sharded if saver is None else functools.partial(async_save.start_sharded, saver)
            return write(out_dir, step, entries.entries(), saved, dist.default_group(), keep_last, run_id)
        arrays = self._gather(saver.buffers if saver is not None else None)
        if arrays is None:
            return None
        files, skeleton = self._whole_layout(arrays)
        saved = {"optimizer": skeleton, "model_keys": entries.model_keys(), **record}
        if saver is not None:
            return async_save.start_whole(saver, out_dir, step, files, whole_files.infos_of(arrays), arrays, saved,
                                          keep_last, run_id)
        return write_whole(out_dir, step, files, whole_files.infos_of(arrays), arrays.__getitem__, saved, keep_last,
                           run_id)

    def load(self, path):
        """Fill the model and optimizer from the checkpoint directory ``path`` (either format, any layout's; already
        verified), each rank reading the parts it holds; returns its state.json."""
        state = read_state(path)
        saved = SavedEntries(path, state, self.entries.group_names())
        saved.load(self.entries.model_targets())
        kept = {}  # tensor by tensor: an offloaded optimizer state goes to its file before the next one is read
        for batch, holder, arrays in self.entries.optimizer_targets(saved.tensors):
            saved.load(batch)
            kept[id(holder)] = self.entries.keep_state(holder, arrays)
        self.entries.load_optimizer(kept, saved.group_options)
        return state

    def gather(self):
        """(model state {name: array}, optimizer state in torch's layout) of the whole model on rank 0, (None, None)
        elsewhere: what a whole checkpoint holds (collective)."""
        arrays = self._gather()
        if arrays is None:
            return None, None
        files, skeleton = self._whole_layout(arrays)
        model = {name: arrays[e] for name, e in files[whole_files.MODEL_FILE].items()}
        optimizer = unflatten_state(skeleton, {k: arrays[e] for k, e in files[whole_files.OPTIMIZER_FILE].items()})
        return model, optimizer

    def _gather(self, into=None):
        device = next(iter(self.model.parameters())).device
        return gather_whole(self.entries.entries(), dist.default_group(), device, into=into)

    def _whole_layout(self, arrays):
        tensors = {e: {"shape": list(a.shape)} for e, a in arrays.items()}
        return whole_files.layout(self.entries.model_keys(), self.entries.param_groups(), tensors,
                                  lambda e: arrays[e].item(), self.entries.numbering())

    # ------------------------------------------------------------------------------------ data positions
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


__all__ = ["RunState", "whole_names", "FORMATS"]
