"""Where a run starts: fresh, or from a verified checkpoint; and which checkpoints belong to the run.

- ``resume=auto``: the newest checkpoint in out_dir that verifies; damaged or incomplete ones are skipped with a
  warning naming them and why, and set aside (``step_XXXXXX.damaged``) so that pruning never counts them toward
  ``train.keep_last`` and deletes a good checkpoint instead. Only an out_dir with no checkpoints at all starts
  fresh: when checkpoints exist and none verifies, the run stops with one error listing each and why, and touches
  nothing (a requeued job must not train from step 0 over a finished run's files).
- ``resume=PATH`` (a step directory, its state.json, or an out_dir): that checkpoint, which must verify.
- no resume: a fresh run, refused when out_dir already holds another run's checkpoints (pruning by step alone
  would delete the new run's checkpoints and keep the old run's higher-numbered ones).

Every run has an id recorded in its checkpoints; a resumed run keeps it, and pruning touches only its own.
Rank 0 verifies (hashing each file once) and broadcasts its choice; the other ranks follow it.
"""
from __future__ import annotations

import os
import sys
import uuid

import numpy as np

from .. import distributed as dist
from ..models import registry
from .. import run_state
from ..run_state.directory import step_of
from .config import ConfigError
from .config.resume_changes import check_config_changes  # noqa: F401  (the run's entry: resume.check_config_changes)


def _warn(message):
    print(f"warning: {message}", file=sys.stderr, flush=True)


def choose_checkpoint(cfg):
    """The checkpoint directory this run resumes from (verified on rank 0), or None to start fresh."""
    path = _choose_on_rank0(cfg) if dist.get_rank() == 0 else None
    if dist.get_world_size() > 1:
        from ..tensor import Tensor

        step = Tensor(np.array([-1 if path is None else step_of(path)], np.int64))
        dist.broadcast(step, src=0)
        step = int(step.numpy()[0])
        if dist.get_rank() != 0 and step >= 0:
            path = (run_state.step_dir(cfg.out_dir, step) if cfg.resume == "auto"
                    else run_state.resolve_checkpoint(cfg.resume))
    return path


def _choose_on_rank0(cfg):
    if cfg.resume == "auto":  # the newest that verifies; newer damaged ones set aside
        return run_state.newest_to_resume(cfg.out_dir, _warn)
    if cfg.resume:
        path = run_state.resolve_checkpoint(cfg.resume)
        run_state.verify_checkpoint(path)
        return path
    existing = run_state.list_checkpoints(cfg.out_dir)
    if existing:
        raise ConfigError(
            f"out_dir: {cfg.out_dir} already holds {len(existing)} checkpoint(s) of an earlier run (newest "
            f"{os.path.basename(existing[-1])})\nHINT: pass resume=auto to continue that run, choose another "
            "out_dir, or move its checkpoints/ away to start over there")
    return None


def _run_key(arch, field):
    """The run config key (``model.n_layer``) that sets the model config's ``field`` (LLaMA's ``n_layers``): the
    config class names the fields whose key differs (RUN_KEYS: a key, or several)."""
    if field == "arch":
        return "model.arch"
    keys = getattr(registry.model_class(arch)[1], "RUN_KEYS", {}).get(field, field)
    return "/".join(f"model.{k}" for k in ((keys,) if isinstance(keys, str) else keys))


def run_id_of(state):
    """The run id to keep: the checkpoint's (a resumed run), or a new one."""
    return (state or {}).get("run_id") or uuid.uuid4().hex


def check_same_model(state, arch, model_config, path):
    """A resumed run must build the model its checkpoint was trained with."""
    saved = state.get("model_config") or {}
    differ = {k: (saved[k], v) for k, v in model_config.items() if k in saved and saved[k] != v}
    if state.get("arch", registry.DEFAULT_ARCH) != arch:
        differ = {"arch": (state.get("arch", registry.DEFAULT_ARCH), arch), **differ}
    if differ:
        listing = "; ".join(dict.fromkeys(f"{_run_key(arch, k)}: checkpoint {a!r}, config {b!r}"
                                          for k, (a, b) in differ.items()))
        run_config = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(path))), "config.yaml")
        raise ConfigError(f"resume: checkpoint {path} was trained with another model shape ({listing})\n"
                          f"HINT: resume with the run's own config ({run_config}), or start a new run in another "
                          "out_dir")
