"""A run's state and its checkpoint files: one home, below the run (infini_train.training), on top of
it.distributed.checkpoint (sharded save / load, resharding). Three things are called "checkpoint" in this package's
neighbourhood: ``it.utils.checkpoint`` is activation recomputation (torch's name), ``it.distributed.checkpoint`` the
sharded tensor format (torch.distributed.checkpoint's), and this package a run's checkpoints (the step directories
under ``out_dir/checkpoints``).

The run calls one object::

    state = RunState(model, optimizer, dims, zero_stage, lora, experts)   # model unwrapped; dims: the layout
    path = state.save(out_dir, step, "sharded" | "whole", record, keep_last, run_id)   # collective
    saved = state.load(path)          # either format, written under any layout; returns its state.json
    positions = state.data_positions(loader); state.load_data_position(loader, saved["data"])
    model_state, optimizer_state = state.gather()    # the whole state on rank 0 (what the whole format holds)

State is a set of named entries (entries.py), each with its placement on this rank: whole, a tensor-parallel shard,
a pipeline stage's own names, a ZeRO (or fully_shard) flat piece, an expert-parallel rank's experts, a LoRA run's
adapters. The sharded format writes every rank's entries with no gather; the whole format is their consolidation
(gathered onto rank 0, gather.py) in the one-process files (whole_files.py). One writer (writer.py) makes the step
directory of either; one reader (reader.py) fills any layout's entries from either, a whole checkpoint read as the
sharded format's one-rank case. The whole model's param groups by name (param_groups.py, over
it.optim.param_groups) number the optimizer state in both.

Files and directories (directory.py, verify.py): ``list_checkpoints``, ``latest_checkpoint``, ``resolve_checkpoint``,
``verify_checkpoint``, ``verified_checkpoint`` (a run's newest good one), ``newest_to_resume`` (resume=auto: damaged
ones set aside), ``read_state``; in one process ``load_checkpoint`` (model and optimizer state dicts, either format),
``load_model_checkpoint`` (inference: the model's files only), ``mapped_model_checkpoint`` (read box by box),
``save_checkpoint`` (a one-process state in the whole format). A LoRA run's base weights are pinned by reference and
digest (lora_base.py). ``python -m infini_train.tools.consolidate`` writes a sharded checkpoint in the whole format
with this package alone.
"""
from .directory import (CheckpointError, latest_checkpoint, list_checkpoints, read_state, resolve_checkpoint,
                        set_aside, step_dir)
from .reader import load_checkpoint, load_model_checkpoint, mapped_model_checkpoint
from .state import FORMATS, RunState
from .tree import flatten_state, unflatten_state
from .verify import is_sharded, newest_to_resume, verified_checkpoint, verify_checkpoint
from .writer import save_checkpoint

__all__ = ["RunState", "FORMATS", "CheckpointError", "list_checkpoints", "latest_checkpoint", "resolve_checkpoint",
           "read_state", "step_dir", "set_aside", "verify_checkpoint", "verified_checkpoint", "newest_to_resume",
           "is_sharded", "load_checkpoint", "load_model_checkpoint", "mapped_model_checkpoint", "save_checkpoint",
           "flatten_state", "unflatten_state"]
