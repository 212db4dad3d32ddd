"""Training checkpoints: tensors in safetensors, everything else in JSON. Never pickle.

Layout: ``out_dir/checkpoints/step_000100/`` holding ``model.safetensors``, ``optimizer.safetensors`` and
``state.json`` (step, run id, config, RNG states, data position, optimizer scalars, and the SHA-256 and size
of each tensor file, plus a SHA-256 of state.json's own content).

Durability: a checkpoint is written into a temporary directory; the tensor files and that directory are
fsynced before ``state.json`` (the completion marker) is written, then the directory is renamed into place and
its parent fsynced. A crash at any point leaves the previous checkpoints intact, and the temporary
directories a killed save leaves behind are removed by the next save. Directories and files honour the umask.
Loading verifies every recorded hash, so a truncated, missing or edited file is reported by name.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile

import numpy as np

from ..distributed.checkpoint.storage import file_digest
from .state_tree import _to_numpy, flatten_state, unflatten_state  # noqa: F401  (part of this module's interface)

CHECKPOINT_DIR = "checkpoints"
STEP_PATTERN = re.compile(r"^step_(\d{6,})$")
TMP_PREFIX = ".tmp-step_"
TENSOR_FILES = ("model.safetensors", "optimizer.safetensors")
DAMAGED_SUFFIX = ".damaged"  # a checkpoint found damaged, set aside (set_aside)


class CheckpointError(ValueError):
    """A checkpoint that is missing or cannot be read: names the path and what is wrong."""


def step_dir(out_dir, step):
    return os.path.join(out_dir, CHECKPOINT_DIR, f"step_{step:06d}")


def save_checkpoint(out_dir, step, model_state, optimizer_state, extra, keep_last=None, run_id=None):
    """Write checkpoint ``step`` atomically and durably; returns its directory. ``extra`` must be
    JSON-serialisable. ``keep_last`` prunes the oldest checkpoints of the same ``run_id`` only."""
    from safetensors.numpy import save_file

    root = os.path.join(out_dir, CHECKPOINT_DIR)
    os.makedirs(root, mode=_dir_mode(), exist_ok=True)
    remove_stale_temporaries(out_dir)
    final = step_dir(out_dir, step)
    tmp = tempfile.mkdtemp(dir=root, prefix=f"{TMP_PREFIX}{step:06d}-")
    os.chmod(tmp, _dir_mode())  # mkdtemp makes it 0700 whatever the umask
    try:
        model_arrays = {k: np.ascontiguousarray(_to_numpy(v)) for k, v in model_state.items()}
        save_file(_dedupe(model_arrays), os.path.join(tmp, "model.safetensors"))
        opt_arrays, opt_skeleton = flatten_state(optimizer_state)
        save_file(opt_arrays, os.path.join(tmp, "optimizer.safetensors"))
        files = {name: _fsync_and_describe(os.path.join(tmp, name)) for name in TENSOR_FILES}
        _fsync_dir(tmp)
        state = {"step": step, "run_id": run_id, "files": files, "optimizer": opt_skeleton,
                 "model_keys": list(model_arrays), **extra}
        state["state_sha256"] = _state_digest(state)
        with open(os.path.join(tmp, "state.json"), "w") as f:
            json.dump(state, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        if os.path.exists(final):
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if keep_last:
        for old in list_checkpoints(out_dir, run_id=run_id)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def _dir_mode():
    umask = os.umask(0)
    os.umask(umask)
    return 0o777 & ~umask


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_and_describe(path):
    os.chmod(path, _dir_mode() & 0o666)  # safetensors creates its files 0600 whatever the umask
    with open(path, "rb+") as f:
        os.fsync(f.fileno())
    return {"sha256": file_digest(path), "bytes": os.path.getsize(path)}


def _state_digest(state):
    body = {k: v for k, v in state.items() if k != "state_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def remove_stale_temporaries(out_dir):
    """Delete the temporary directories of saves that were killed midway (one writer per out_dir)."""
    root = os.path.join(out_dir, CHECKPOINT_DIR)
    if os.path.isdir(root):
        for name in os.listdir(root):
            if name.startswith(TMP_PREFIX):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def _dedupe(arrays):
    """safetensors refuses shared memory (tied weights): store a copy under each name."""
    seen = {}
    out = {}
    for k, v in arrays.items():
        key = (v.__array_interface__["data"][0], v.shape)
        out[k] = v.copy() if key in seen else v
        seen[key] = k
    return out


def set_aside(path):
    """Rename the damaged checkpoint ``path`` (step_XXXXXX) to ``step_XXXXXX.damaged`` (``.damaged-2``, ... when that
    is taken): out of list_checkpoints, so it neither counts toward train.keep_last (which would prune a good
    checkpoint in its place) nor is resumed or pruned, and kept for inspection. Returns the new path."""
    target, n = path + DAMAGED_SUFFIX, 2
    while os.path.exists(target):
        target, n = f"{path}{DAMAGED_SUFFIX}-{n}", n + 1
    os.replace(path, target)
    _fsync_dir(os.path.dirname(path))
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
        if m and os.path.exists(os.path.join(path, "state.json")):
            if run_id is not None and read_run_id(path) != run_id:
                continue
            found.append((int(m.group(1)), path))
    return [p for _, p in sorted(found)]


def read_run_id(path):
    """The run id recorded in a checkpoint's state.json (None when unreadable or absent)."""
    try:
        with open(os.path.join(path, "state.json")) as f:
            return json.load(f).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None


def latest_checkpoint(out_dir):
    found = list_checkpoints(out_dir)
    return found[-1] if found else None


def resolve_checkpoint(path_or_out_dir):
    """A checkpoint directory from a step directory, its state.json, or an out_dir (its newest checkpoint)."""
    path = os.fspath(path_or_out_dir)
    if os.path.basename(path) == "state.json" and os.path.isfile(path):
        path = os.path.dirname(path) or "."
    if os.path.exists(os.path.join(path, "state.json")):
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
    with open(os.path.join(path, "state.json")) as f:
        return json.load(f)


def verify_checkpoint(path, model_only=False):
    """Check a checkpoint directory against the hashes in its state.json; returns the parsed state. Raises
    CheckpointError naming the file and what is wrong (missing, truncated, edited, unreadable). ``model_only``
    (inference): only the files holding the model, model.safetensors (a sharded checkpoint's shards hold model and
    optimizer entries alike: every one)."""
    state_path = os.path.join(path, "state.json")
    try:
        with open(state_path) as f:
            state = json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} is incomplete: state.json is missing") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {path} is damaged: state.json is unreadable ({exc})") from None
    if not isinstance(state, dict) or "step" not in state or "optimizer" not in state:
        raise CheckpointError(f"checkpoint {path} is damaged: state.json lacks its step or optimizer entries")
    recorded = state.get("state_sha256")
    if recorded is not None and recorded != _state_digest(state):
        raise CheckpointError(f"checkpoint {path} is damaged: state.json was edited (its content no longer "
                              "matches the SHA-256 recorded in it)")
    model_file_only = model_only and state.get("format") != "sharded"
    for name, expect in (state.get("files") or {}).items():
        if model_file_only and name != "model.safetensors":
            continue
        file_path = os.path.join(path, name)
        if not os.path.exists(file_path):
            raise CheckpointError(f"checkpoint {path} is damaged: {name} is missing")
        size = os.path.getsize(file_path)
        if size != expect["bytes"]:
            kind = "truncated" if size < expect["bytes"] else "longer than written"
            raise CheckpointError(f"checkpoint {path} is damaged: {name} is {kind} ({size} bytes, "
                                  f"{expect['bytes']} written)")
        if file_digest(file_path) != expect["sha256"]:
            raise CheckpointError(f"checkpoint {path} is damaged: {name} was modified (SHA-256 differs from "
                                  "the one recorded when it was written)")
    return state


def load_checkpoint(path, verify=True):
    """Returns (model_state {name: array}, optimizer_state, state dict from state.json), after verifying every
    file against the hashes recorded at save time (``verify=False``: already verified by the caller)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    path = resolve_checkpoint(path)
    state = verify_checkpoint(path) if verify else read_state(path)
    if state.get("format") == "sharded":  # assembled whole here (sharded_state.py)
        model_state, optimizer_state = _whole_sharded(path, state)
        state.pop("optimizer")
        return model_state, optimizer_state, state
    try:
        model_state = load_file(os.path.join(path, "model.safetensors"))
        opt_arrays = load_file(os.path.join(path, "optimizer.safetensors"))
    except (OSError, SafetensorError) as exc:
        raise CheckpointError(f"checkpoint {path} is unreadable: {exc}\nHINT: it may be incomplete or corrupted; "
                              "resume from an earlier one") from exc
    optimizer_state = unflatten_state(state.pop("optimizer"), opt_arrays)
    return model_state, optimizer_state, state


def checkpoint_candidates(path):
    """(named, checkpoints to try, newest first) for ``path``: a step directory or its state.json is the one named
    checkpoint (it must verify); a run's out_dir gives every checkpoint in it. Raises CheckpointError for a missing
    path or an out_dir without checkpoints."""
    path = os.fspath(path)
    if os.path.basename(path) == "state.json":
        path = os.path.dirname(path) or "."
    if not os.path.exists(path):
        resolve_checkpoint(path)  # raises: the path does not exist
    if STEP_PATTERN.match(os.path.basename(os.path.normpath(path))) or os.path.exists(os.path.join(path,
                                                                                                   "state.json")):
        return True, [path]
    resolve_checkpoint(path)  # an out_dir without checkpoints: one clear error
    return False, list(reversed(list_checkpoints(path)))


def _none_verified(path, named, failures, model_only):
    """The CheckpointError when no candidate verified: a named one's, with a hint at the run's newest good one; or
    one listing every checkpoint of the out_dir and why."""
    if named:
        run_dir = os.path.dirname(os.path.dirname(os.path.abspath(path)))
        good = [p for p in reversed(list_checkpoints(run_dir)) if _verifies(p, model_only)]
        hint = (f"use the newest good one, {good[0]}, or pass the run's out_dir to take it" if good
                else "resume training to write a new checkpoint, or restore a good copy")
        return CheckpointError(f"{failures[0]}\nHINT: {hint}")
    what = "has a model file that verifies" if model_only else "verifies"
    return CheckpointError(f"none of the {len(failures)} checkpoint(s) in {path} {what}:\n  " + "\n  ".join(failures)
                           + "\nHINT: restore a good copy of one of them")


def verified_checkpoint(path, model_only=False, warn=None):
    """(step directory, its verified state) of ``path``: a step directory or its state.json (which must verify), or
    a run's out_dir, whose newest checkpoint that verifies is taken, ``warn(message)`` naming each newer one skipped
    and why. ``model_only``: as verify_checkpoint. Raises CheckpointError naming every checkpoint tried and why."""
    named, candidates = checkpoint_candidates(path)
    failures = []
    for candidate in candidates:
        try:
            state = verify_checkpoint(candidate, model_only)
        except CheckpointError as exc:
            failures.append(str(exc))
            continue
        for skipped in failures:
            (warn or print)(f"skipping {skipped}; using {candidate}")
        return candidate, state
    raise _none_verified(candidates[0] if named else os.fspath(path), named, failures, model_only)


def load_model_checkpoint(path, warn=None):
    """(model_state, state) for inference: only state.json and model.safetensors are verified and read, so a
    damaged optimizer file does not matter. ``path``: a step directory (which must verify), its state.json, or a
    run's out_dir, whose newest checkpoint with a good model is used, ``warn(message)`` naming each one skipped.
    Raises CheckpointError naming every checkpoint tried and why."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    named, candidates = checkpoint_candidates(path)
    failures = []
    for candidate in candidates:
        try:
            state, model_state = _verified_model(candidate, load_file)
        except CheckpointError as exc:
            failures.append(str(exc))
        except (OSError, SafetensorError) as exc:
            failures.append(f"checkpoint {candidate} is unreadable: {exc}")
        else:
            for skipped in failures:
                (warn or print)(f"skipping {skipped}")
            state.pop("optimizer", None)
            return model_state, state
    raise _none_verified(candidates[0] if named else os.fspath(path), named, failures, model_only=True)


def mapped_model_checkpoint(path):
    """{name: array-like} of a checkpoint's model after verifying its model files, each tensor read box by box
    when indexed (MappedArray / SavedTensor), so a rank reads only the parts it keeps; and its state.json."""
    from ..distributed.checkpoint import CheckpointFormatError, read_metadata
    from ..distributed.checkpoint.whole_files import SavedTensor
    from ..safetensors_io import SafetensorsError, mapped_safetensors

    path = resolve_checkpoint(path)
    state = verify_checkpoint(path, model_only=True)
    try:
        if state.get("format") == "sharded":
            metadata = read_metadata(path)
            return {e[len("model/"):]: SavedTensor(path, e, metadata) for e in metadata["tensors"]
                    if e.startswith("model/")}, state
        return mapped_safetensors(os.path.join(path, "model.safetensors")), state
    except (CheckpointFormatError, SafetensorsError, OSError) as exc:
        raise CheckpointError(f"checkpoint {path} is unreadable: {exc}") from exc


def _verified_model(path, load_file):
    """(state, model state) of a checkpoint whose model verifies (a sharded one: every shard, each holding model
    and optimizer entries)."""
    state = verify_checkpoint(path, model_only=True)
    if state.get("format") == "sharded":
        return state, _whole_sharded(path, state, model_only=True)[0]
    return state, load_file(os.path.join(path, "model.safetensors"))


def _whole_sharded(path, state, model_only=False):
    from ..distributed.checkpoint import CheckpointFormatError
    from .sharded_state import whole_state

    try:
        return whole_state(path, state, model_only)
    except (CheckpointFormatError, OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {path} is unreadable: {exc}\nHINT: it may be incomplete or corrupted; "
                              "resume from an earlier one") from exc


def _verifies(path, model_only):
    try:
        verify_checkpoint(path, model_only=model_only)
        return True
    except CheckpointError:
        return False
