"""The precision checker in a run (``precision_check.level``): every rank records its training steps (not the
validation passes) into out_dir/precision/rank<R>.jsonl; a resumed run keeps the lines of the steps before it."""
from __future__ import annotations

import contextlib
import os

from ..utils.precision_check import PrecisionChecker


class _Off:
    """What a run holds when precision_check.level is 0: recording is a no-op."""

    def recording(self, step):
        return contextlib.nullcontext()

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def precision_file(out_dir, rank):
    return os.path.join(out_dir, "precision", f"rank{rank}.jsonl")


def precision_checker_for(cfg, model, rank, resume_step=None):
    """The run's checker on ``model`` (attached now, recording only inside ``recording(step)``), or a no-op."""
    level = cfg.precision_check.level
    if not level:
        return _Off()
    return PrecisionChecker(level, precision_file(cfg.out_dir, rank), rank=rank, model=model, active=False,
                            keep_before=resume_step).start()
