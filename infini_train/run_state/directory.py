"""A run's checkpoint directories: ``out_dir/checkpoints/step_000100/``, complete when its ``state.json`` (the
completion marker) exists; found, resolved, set aside and pruned here, whatever format the files inside are in.

``state.json`` records the step, the run id, each file's size and SHA-256 and a SHA-256 of its own content. A save
writes into a temporary directory (``.tmp-step_000100-*``) renamed into place once complete; the temporary
directories a killed save leaves behind are removed by the next save. Directories and files honour the umask.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil

from ..distributed.checkpoint.storage import file_digest

CHECKPOINT_DIR = "checkpoints"
STEP_PATTERN = re.compile(r"^step_(\d{6,})$")
TMP_PREFIX = ".tmp-step_"
STATE_FILE = "state.json"
DAMAGED_SUFFIX = ".damaged"  # a checkpoint found damaged, set aside (set_aside)


class CheckpointError(ValueError):
    """A checkpoint that is missing or cannot be read: names the path and what is wrong."""


def step_dir(out_dir, step):
    return os.path.join(out_dir, CHECKPOINT_DIR, f"step_{step:06d}")


def dir_mode():
    """The mode new directories get under the umask (mkdtemp and safetensors ignore it; checkpoints honour it)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o777 & ~umask


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def describe_file(path):
    """Give ``path`` the umask's file mode, fsync it, and return its record in state.json (SHA-256 and size)."""
    os.chmod(path, dir_mode() & 0o666)
    with open(path, "rb+") as f:
        os.fsync(f.fileno())
    return {"sha256": file_digest(path), "bytes": os.path.getsize(path)}


def state_digest(state):
    """The SHA-256 state.json records of its own content (every key but ``state_sha256``)."""
    body = {k: v for k, v in state.items() if k != "state_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def write_state_file(directory, state):
    """Write ``state`` (its digest added) as ``directory``/state.json, fsynced: the completion marker."""
    state["state_sha256"] = state_digest(state)
    with open(os.path.join(directory, STATE_FILE), "w") as f:
        json.dump(state, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    return state


def remove_stale_temporaries(out_dir):
    """Delete the temporary directories of saves that were killed midway (one writer per out_dir)."""
    root = os.path.join(out_dir, CHECKPOINT_DIR)
    if os.path.isdir(root):
        for name in os.listdir(root):
            if name.startswith(TMP_PREFIX):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def set_aside(path):
    """Rename the damaged checkpoint ``path`` (step_XXXXXX) to ``step_XXXXXX.damaged`` (``.damaged-2``, ... when that
    is taken): out of list_checkpoints, so it neither counts toward train.keep_last (which would prune a good
    checkpoint in its place) nor is resumed or pruned, and kept for inspection. Returns the new path."""
    target, n = path + DAMAGED_SUFFIX, 2
    while os.path.exists(target):
        target, n = f"{path}{DAMAGED_SUFFIX}-{n}", n + 1
    os.replace(path, target)
    fsync_dir(os.path.dirname(path))
    return target


def list_checkpoints(out_dir, run_id=None):
    """Complete checkpoints (those with state.json) under out_dir, oldest first; only those of ``run_id``
    when it is given."""
    root = os.path.join(out_dir, CHECKPOINT_DIR)
    if not os.path.isdir(root):
        return []
    found = []
    for name in os.listdir(root):
        m = STEP_PATTERN.match(name)
        path = os.path.join(root, name)
        if m and os.path.exists(os.path.join(path, STATE_FILE)):
            if run_id is not None and read_run_id(path) != run_id:
                continue
            found.append((int(m.group(1)), path))
    return [p for _, p in sorted(found)]


def prune(out_dir, keep_last, run_id):
    """Delete all but the newest ``keep_last`` checkpoints of ``run_id`` (0 or None: keep every one)."""
    if keep_last:
        for old in list_checkpoints(out_dir, run_id=run_id)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)


def read_run_id(path):
    """The run id recorded in a checkpoint's state.json (None when unreadable or absent)."""
    try:
        with open(os.path.join(path, STATE_FILE)) as f:
            return json.load(f).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None


def latest_checkpoint(out_dir):
    found = list_checkpoints(out_dir)
    return found[-1] if found else None


def resolve_checkpoint(path_or_out_dir):
    """A checkpoint directory from a step directory, its state.json, or an out_dir (its newest checkpoint)."""
    path = os.fspath(path_or_out_dir)
    if os.path.basename(path) == STATE_FILE and os.path.isfile(path):
        path = os.path.dirname(path) or "."
    if os.path.exists(os.path.join(path, STATE_FILE)):
        return path
    if not os.path.exists(path):
        raise CheckpointError(f"no checkpoint found at {path}: the path does not exist\nHINT: pass a "
                              "checkpoints/step_XXXXXX directory, its state.json, or a run's out_dir")
    newest = latest_checkpoint(path)
    if newest is None:
        raise CheckpointError(f"no checkpoint found at {path}\nHINT: pass a checkpoints/step_XXXXXX directory or "
                              "a run's out_dir that contains one")
    return newest


def read_state(path):
    """The parsed state.json of a checkpoint directory (unverified: for a checkpoint already verified)."""
    with open(os.path.join(path, STATE_FILE)) as f:
        return json.load(f)


def step_of(path):
    """The step a checkpoint directory's state.json records."""
    return int(read_state(path)["step"])


__all__ = ["CheckpointError", "CHECKPOINT_DIR", "step_dir", "list_checkpoints", "latest_checkpoint",
           "resolve_checkpoint", "read_state", "read_run_id", "set_aside", "remove_stale_temporaries", "prune",
           "dir_mode", "fsync_dir", "describe_file", "state_digest", "write_state_file", "step_of"]
