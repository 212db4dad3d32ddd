"""Writing a checkpoint, in either format, as one procedure: rank 0 makes a temporary directory beside the
checkpoints, the format's files are written into it (a sharded checkpoint: by every rank, each its own shard, with no
gather; the whole format: by rank 0, from the consolidated state), then rank 0 fsyncs them, writes state.json (the
completion marker: step, run id, format, each file's size and SHA-256, the optimizer's param groups and the run's
own state) and renames the directory into place. A crash at any point leaves the previous checkpoints intact;
``keep_last`` then prunes the run's oldest ones.
"""
from __future__ import annotations

import os
import shutil
import tempfile

from .. import distributed as dist
from ..distributed import checkpoint as dcp
from . import whole_files
from .directory import (CHECKPOINT_DIR, TMP_PREFIX, describe_file, dir_mode, fsync_dir, prune,
                        remove_stale_temporaries, step_dir, write_state_file)
from .tree import flatten_state, to_numpy
from .verify import SHARDED


def make_temporary(out_dir, step, group=None):
    """The temporary directory checkpoint ``step`` is written into: made by rank 0 of ``group`` beside the
    checkpoints (after removing those of killed saves), its path shared with the other ranks (a collective)."""
    rank = group.rank if group is not None else 0
    tmp = None
    if rank == 0:
        root = os.path.join(out_dir, CHECKPOINT_DIR)
        os.makedirs(root, mode=dir_mode(), exist_ok=True)
        remove_stale_temporaries(out_dir)
        tmp = tempfile.mkdtemp(dir=root, prefix=f"{TMP_PREFIX}{step:06d}-")
        os.chmod(tmp, dir_mode())  # mkdtemp makes it 0700 whatever the umask
    if group is not None and group.size > 1:
        paths = [None] * group.size
        dist.all_gather_object(paths, tmp, group)
        tmp = paths[0]
    return tmp


def commit(out_dir, step, tmp, files, record, keep_last=None, run_id=None, fmt=None):
    """Rank 0 completes checkpoint ``step``: fsyncs ``tmp``, writes state.json (step, run id, format, ``files``, then
    ``record``), renames it into place and prunes the run's oldest checkpoints. Returns the step directory."""
    fsync_dir(tmp)
    head = {"step": step, "run_id": run_id, **({"format": fmt} if fmt is not None else {})}
    write_state_file(tmp, {**head, "files": files, **record})
    fsync_dir(tmp)
    final = step_dir(out_dir, step)
    if os.path.exists(final):
        shutil.rmtree(final)
    os.replace(tmp, final)
    fsync_dir(os.path.dirname(final))
    prune(out_dir, keep_last, run_id)
    return final


def write_checkpoint(out_dir, step, fill, record, keep_last=None, run_id=None, group=None, fmt=None):
    """Write checkpoint ``step`` of ``out_dir``; returns its directory on rank 0 of ``group``, None elsewhere.
    ``fill(directory)`` writes the tensor files into the temporary directory and returns state.json's ``files``
    (on rank 0): it is called on every rank of ``group`` (a collective), or with ``group`` None on this rank alone.
    ``record``: the rest of state.json (rank 0's; JSON-serialisable), after ``step``, ``run_id``, ``format`` (``fmt``:
    "sharded", or None for the whole format, which records none) and ``files``."""
    rank = group.rank if group is not None else 0
    tmp = make_temporary(out_dir, step, group)
    try:
        files = fill(tmp)
        if rank != 0:
            return None
        return commit(out_dir, step, tmp, files, record, keep_last, run_id, fmt)
    except BaseException:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def sharded_files(directory, metadata):
    """state.json's ``files`` of a sharded checkpoint (rank 0, once every shard and metadata.json are written)."""
    files = {name: {"sha256": info["sha256"], "bytes": info["bytes"]} for name, info in metadata["files"].items()}
    files[dcp.METADATA] = describe_file(os.path.join(directory, dcp.METADATA))
    for name in files:
        os.chmod(os.path.join(directory, name), dir_mode() & 0o666)
    return files


def write_sharded(out_dir, step, entries, record, group, keep_last=None, run_id=None):
    """A sharded checkpoint of ``entries`` (this rank's {entry: LocalPieces}) written by every rank of ``group``:
    ``shard<R>.safetensors`` and ``metadata.json`` (it.distributed.checkpoint) beside state.json."""

    def fill(directory):
        metadata = dcp.save(entries, directory, group)
        return sharded_files(directory, metadata) if group.rank == 0 else None

    return write_checkpoint(out_dir, step, fill, record, keep_last, run_id, group, fmt=SHARDED)


def write_whole(out_dir, step, files, infos, read, record, keep_last=None, run_id=None):
    """A whole-format checkpoint written by this rank alone: ``files``, ``infos`` and ``read`` as
    whole_files.write_files takes them."""

    def fill(directory):
        whole_files.write_files(directory, files, infos, read)
        return {name: describe_file(os.path.join(directory, name)) for name in files}

    return write_checkpoint(out_dir, step, fill, record, keep_last, run_id)


def write_whole_directory(out, files, infos, read, record, step, run_id):
    """A whole-format checkpoint directory at ``out`` that is no run's step directory (a consolidated checkpoint):
    written beside it and renamed into place; ``out`` must not exist or be an empty directory. Arguments as
    write_whole's and write_checkpoint's."""
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(out)}.tmp")
    os.chmod(tmp, dir_mode())  # mkdtemp makes it 0700 whatever the umask; run checkpoints honour it
    try:
        whole_files.write_files(tmp, files, infos, read)
        described = {name: describe_file(os.path.join(tmp, name)) for name in files}
        fsync_dir(tmp)
        write_state_file(tmp, {"step": step, "run_id": run_id, "files": described, **record})
        if os.path.isdir(out):
            os.rmdir(out)  # empty (the caller checked)
        os.replace(tmp, out)
        fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def save_checkpoint(out_dir, step, model_state, optimizer_state, extra, keep_last=None, run_id=None):
    """Write checkpoint ``step`` of a one-process state in the whole format: ``model_state`` {name: array or
    Tensor}, ``optimizer_state`` an optimizer state dict (torch's layout), ``extra`` the run's JSON-serialisable
    state. ``keep_last`` prunes the oldest checkpoints of the same ``run_id`` only. Returns the step directory."""
    model_arrays = {k: to_numpy(v) for k, v in model_state.items()}
    opt_arrays, skeleton = flatten_state(optimizer_state)
    arrays = {**{("model", k): v for k, v in model_arrays.items()}, **{("optimizer", k): v
                                                                        for k, v in opt_arrays.items()}}
    files = {whole_files.MODEL_FILE: {k: ("model", k) for k in model_arrays},
             whole_files.OPTIMIZER_FILE: {k: ("optimizer", k) for k in opt_arrays}}
    record = {"optimizer": skeleton, "model_keys": list(model_arrays), **extra}
    return write_whole(out_dir, step, files, whole_files.infos_of(arrays), arrays.__getitem__, record, keep_last,
                       run_id)


__all__ = ["make_temporary", "commit", "write_checkpoint", "sharded_files", "write_sharded", "write_whole",
           "write_whole_directory", "save_checkpoint"]
