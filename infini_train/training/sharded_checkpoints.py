"""Run checkpoints in the sharded format (``train.checkpoint_format: sharded``): the step directory holds every
rank's ``shard<R>.safetensors`` and ``metadata.json`` (it.distributed.checkpoint) beside ``state.json``, which
records each file's size and SHA-256 (so verification, ``resume=auto`` skipping a damaged checkpoint and pruning
work as for whole checkpoints), ``"format": "sharded"`` and the optimizer's param groups by parameter name.

Writing: rank 0 makes the temporary directory, every rank writes its shard into it with no gather, then rank 0 writes
state.json and renames the directory into place (the previous checkpoints stay intact until then). Reading in one
process (sharded_state.whole_state) assembles the whole model and optimizer state, as a one-process checkpoint holds it.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile


from .. import distributed as dist
from ..distributed import checkpoint as dcp
from . import checkpoints as ckpt

FORMAT = "sharded"


def is_sharded(state):
    return state.get("format") == FORMAT


def save_sharded_checkpoint(out_dir, step, sharded, extra, keep_last=None, run_id=None, group=None):
    """Write checkpoint ``step`` of ``sharded`` (a ShardedState) with every rank of ``group`` (collective); returns
    the step directory on rank 0, None elsewhere. ``extra``: rank 0's JSON-serialisable run state."""
    group = group or dist.default_group()
    tmp = None
    if group.rank == 0:
        root = os.path.join(out_dir, ckpt.CHECKPOINT_DIR)
        os.makedirs(root, mode=ckpt._dir_mode(), exist_ok=True)
        ckpt.remove_stale_temporaries(out_dir)
        tmp = tempfile.mkdtemp(dir=root, prefix=f"{ckpt.TMP_PREFIX}{step:06d}-")
        os.chmod(tmp, ckpt._dir_mode())
    paths = [None] * group.size
    dist.all_gather_object(paths, tmp, group)
    tmp = paths[0]
    try:
        metadata = sharded.save(tmp, group)
        if group.rank != 0:
            return None
        files = {name: {"sha256": info["sha256"], "bytes": info["bytes"]} for name, info in metadata["files"].items()}
        files[dcp.METADATA] = ckpt._fsync_and_describe(os.path.join(tmp, dcp.METADATA))
        for name in files:
            os.chmod(os.path.join(tmp, name), ckpt._dir_mode() & 0o666)
        ckpt._fsync_dir(tmp)
        state = {"step": step, "run_id": run_id, "format": FORMAT, "files": files,
                 "optimizer": {"param_groups": sharded.param_groups()}, "model_keys": sharded.model_keys(), **extra}
        state["state_sha256"] = ckpt._state_digest(state)
        with open(os.path.join(tmp, "state.json"), "w") as f:
            json.dump(state, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        ckpt._fsync_dir(tmp)
        final = ckpt.step_dir(out_dir, step)
        if os.path.exists(final):
            shutil.rmtree(final)
        os.replace(tmp, final)
        ckpt._fsync_dir(os.path.dirname(final))
    except BaseException:
        if group.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if keep_last:
        for old in ckpt.list_checkpoints(out_dir, run_id=run_id)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    return final


__all__ = ["save_sharded_checkpoint", "is_sharded", "FORMAT"]
