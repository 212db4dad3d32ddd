"""Checking a checkpoint against the hashes its state.json recorded, and choosing the checkpoint to read: a named one
(which must verify), or a run's newest one that verifies, naming each newer one skipped and why."""
from __future__ import annotations

import json
import os

from ..distributed.checkpoint.storage import file_digest
from .directory import (STATE_FILE, STEP_PATTERN, CheckpointError, list_checkpoints, resolve_checkpoint, set_aside,
                        state_digest)

SHARDED = "sharded"  # state.json's "format" of a sharded checkpoint (absent: the whole format)


def is_sharded(state):
    """Whether a checkpoint's parsed state.json is of the sharded format."""
    return state.get("format") == SHARDED


def verify_checkpoint(path, model_only=False):
    """Check a checkpoint directory against the hashes in its state.json; returns the parsed state. Raises
    CheckpointError naming the file and what is wrong (missing, truncated, edited, unreadable). ``model_only``
    (inference): only the files holding the model, model.safetensors (a sharded checkpoint's shards hold model and
    optimizer entries alike: every one)."""
    state_path = os.path.join(path, STATE_FILE)
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
    if recorded is not None and recorded != state_digest(state):
        raise CheckpointError(f"checkpoint {path} is damaged: state.json was edited (its content no longer "
                              "matches the SHA-256 recorded in it)")
    model_file_only = model_only and not is_sharded(state)
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


def checkpoint_candidates(path):
    """(named, checkpoints to try, newest first) for ``path``: a step directory or its state.json is the one named
    checkpoint (it must verify); a run's out_dir gives every checkpoint in it. Raises CheckpointError for a missing
    path or an out_dir without checkpoints."""
    path = os.fspath(path)
    if os.path.basename(path) == STATE_FILE:
        path = os.path.dirname(path) or "."
    if not os.path.exists(path):
        resolve_checkpoint(path)  # raises: the path does not exist
    if STEP_PATTERN.match(os.path.basename(os.path.normpath(path))) or os.path.exists(os.path.join(path, STATE_FILE)):
        return True, [path]
    resolve_checkpoint(path)  # an out_dir without checkpoints: one clear error
    return False, list(reversed(list_checkpoints(path)))


def none_verified(path, named, failures, model_only):
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
    raise none_verified(candidates[0] if named else os.fspath(path), named, failures, model_only)


def newest_to_resume(out_dir, warn):
    """The newest checkpoint in ``out_dir`` that verifies (None when it holds none): ``resume=auto``. Each newer one
    that does not verify is set aside (set_aside), ``warn(message)`` saying why and where; when checkpoints exist and
    none verifies, one CheckpointError lists each and why, and nothing is touched."""
    found = list_checkpoints(out_dir)
    failures = []
    for path in reversed(found):
        try:
            verify_checkpoint(path)
        except CheckpointError as exc:
            failures.append((path, str(exc).split("\nHINT")[0]))
            continue
        for damaged, failure in failures:
            warn(f"resume=auto: skipping {failure}; {_set_aside(damaged)}")
        return path
    if found:
        listing = "\n  ".join(failure for _, failure in failures)
        raise CheckpointError(
            f"resume=auto: none of the {len(found)} checkpoint(s) in {out_dir} verifies, so there is nothing "
            f"to resume from and the run stops without touching them:\n  {listing}\nHINT: restore a good copy "
            "of one of them, pass resume=PATH to another run's checkpoint, or move checkpoints/ away to start "
            "over on purpose")
    return None


def _set_aside(path):
    """Move a damaged checkpoint out of the run's list (set_aside); says where, or why it stayed."""
    try:
        return (f"moved it to {set_aside(path)} so that train.keep_last does not count it (a good checkpoint "
                "would be pruned in its place)")
    except OSError as exc:
        return f"could not move it aside ({exc}), so train.keep_last still counts it"


def _verifies(path, model_only):
    try:
        verify_checkpoint(path, model_only=model_only)
        return True
    except CheckpointError:
        return False


__all__ = ["SHARDED", "is_sharded", "verify_checkpoint", "checkpoint_candidates", "verified_checkpoint",
           "newest_to_resume", "none_verified"]
