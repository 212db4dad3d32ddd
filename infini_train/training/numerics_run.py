"""The numerics checker in a run (``numerics.level``): every rank records its training steps (not the
validation passes) into out_dir/numerics/rank<R>.jsonl; a resumed run keeps the lines of the steps before it."""
from __future__ import annotations

import contextlib
import os

from .numerics import NumericsChecker


class _Off:
    """What a run holds when numerics.level is 0: recording is a no-op."""

    def recording(self, step):
        return contextlib.nullcontext()

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def numerics_file(out_dir, rank):
    return os.path.join(out_dir, "numerics", f"rank{rank}.jsonl")


def numerics_checker_for(cfg, model, rank, resume_step=None, scaler=None):
    """The run's checker on ``model`` (attached now, recording only inside ``recording(step)``), or a no-op;
    ``scaler``: the run's GradScaler (fp16-mixed), whose loss scale the gradients' entries are divided by."""
    level = cfg.numerics.level
    if not level:
        return _Off()
    return NumericsChecker(level, numerics_file(cfg.out_dir, rank), rank=rank, model=model, active=False,
                            keep_before=resume_step, loss_scale=scaler.get_scale if scaler is not None else None
                            ).start()
