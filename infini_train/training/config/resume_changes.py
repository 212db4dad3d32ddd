"""What a resumed run changes of the config its checkpoint was trained with (the checkpoint's state.json keeps it).

Every differing key is listed when the run starts. A change that cannot alter what the steps compute (where the run
writes, how often it logs, validates, samples and saves, how many checkpoints it keeps, how long it runs) or that
only changes the layout it runs under (ranks, device, micro-batch split, checkpoint format: a checkpoint resumes under
any layout) is listed for information. Any other change (learning rate, global batch, seed, data, precision, ...)
would make the resumed run another run than the one its checkpoints recorded, so it is refused unless
``resume_allow_changes: true`` says it is meant. The model and LoRA sections are checked against the checkpoint
first (resume.check_same_model, lora_run.check_same_lora), so a difference left there is one that resolves to the
same model and adapters.

Each resume keeps its own config beside the run's first one (RunConfig.save_resolved: config.resume-<step>.yaml).
"""
from __future__ import annotations

import copy
import json
import os
import sys

from ... import distributed as dist
from .schema import RunConfig, _flatten, _rename_sections
from .sections import ConfigError

NOT_COMPARED = ("resume", "resume_allow_changes")  # how this start was asked for, not what the run trains
# key, or section prefix ending in ".", -> why changing it leaves the steps' values as the checkpoint's run had them
UNCHANGED_VALUES = {
    "out_dir": "where the run writes",
    "plot": "reporting", "tensorboard": "reporting", "train.log_every": "reporting", "train.peak_flops": "reporting",
    "train.straggler_report": "reporting",
    "profile.": "profiling", "numerics.": "the numerics checker only observes",
    "data.val": "validation", "train.val_loss_every": "validation", "train.val_max_steps": "validation",
    "train.sample_every": "samples", "train.sample_length": "samples",
    "train.save_every": "checkpoints", "train.keep_last": "checkpoints", "train.checkpoint_format": "checkpoints",
    "train.checkpoint_async": "checkpoints",
    "train.num_iterations": "the run's length; the learning-rate schedule follows the new length from here",
    "train.skip_nonfinite": "how many non-finite steps are skipped before the run stops",
    "train.initial_loss_scale": "the checkpoint's loss scale wins on resume",
    "data.source": "only whether a missing corpus is built",
    "parallel.": "the layout: the checkpoint is resharded", "device": "the layout", "backend": "the layout",
    "train.recompute": "the layout: activations recomputed instead of kept",
    "train.optimizer_offload": "where the optimizer state lives: the same values in memory, on the host or on disk",
    "model.": "resolves to the checkpoint's model", "lora.": "resolves to the checkpoint's LoRA settings",
}


def config_changes(saved, cfg):
    """[(dotted key, the checkpoint's value, the config's value)] of every setting that differs; ``saved``: the
    checkpoint's ``config`` (RunConfig.to_dict() when it was written). A key the checkpoint predates counts as its
    default then; a key since removed is not compared."""
    saved = copy.deepcopy(saved)
    _rename_sections(saved)
    old, defaults = _flatten(saved), _flatten(RunConfig().to_dict())
    new = _flatten(json.loads(json.dumps(cfg.to_dict())))  # as JSON keeps it: tuples are lists
    return [(key, old.get(key, defaults.get(key)), value) for key, value in new.items()
            if key not in NOT_COMPARED and old.get(key, defaults.get(key)) != value]


def why_unchanged(key, saved, cfg):
    """Why changing ``key`` from the checkpoint's config ``saved`` leaves the steps' values as they were, or None
    when the change alters them."""
    for prefix, why in UNCHANGED_VALUES.items():
        if key == prefix or (prefix.endswith(".") and key.startswith(prefix)):
            return why
    total = cfg.train.total_batch_size
    if key == "train.batch_size" and total and (saved.get("train") or {}).get("total_batch_size") == total:
        return f"the layout: the same {total} tokens per step in other micro-batches"
    return None


def check_config_changes(state, cfg, path):
    """List what the config changes of checkpoint ``path``'s (rank 0 prints it) and refuse the changes that would
    alter the run unless ``resume_allow_changes`` is set; returns the changes (config_changes)."""
    saved = (state or {}).get("config")
    if not isinstance(saved, dict):
        return []  # (a checkpoint that recorded no config: nothing to compare)
    changes = config_changes(saved, cfg)
    fine = [(k, a, b, why_unchanged(k, saved, cfg)) for k, a, b in changes]
    refused = [f"{k}: checkpoint {a!r}, config {b!r}" for k, a, b, why in fine if why is None]
    listed = [f"{k}: checkpoint {a!r}, config {b!r} ({why})" for k, a, b, why in fine if why is not None]
    if refused and not cfg.resume_allow_changes:
        also = "\nalso changed, which keeps the run:\n  " + "\n  ".join(listed) if listed else ""
        run_config = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(path))), "config.yaml")
        raise ConfigError(f"resume: checkpoint {path} was trained with another config; resuming under these changes "
                          "would continue another run than the one it recorded:\n  " + "\n  ".join(refused) + also +
                          f"\nHINT: resume with the run's own config ({run_config}), set resume_allow_changes=true to "
                          "continue under these changes on purpose, or start a new run in another out_dir")
    if dist.get_rank() == 0:
        if listed:
            print(f"resume: the config differs from checkpoint {path}'s:\n  " + "\n  ".join(listed), flush=True)
        if refused:
            print(f"warning: resume: continuing under a changed config (resume_allow_changes=true); from checkpoint "
                  f"{path} on the run differs from the one it recorded:\n  " + "\n  ".join(refused),
                  file=sys.stderr, flush=True)
    return changes


__all__ = ["config_changes", "why_unchanged", "check_config_changes", "UNCHANGED_VALUES"]
