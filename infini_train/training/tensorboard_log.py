"""TensorBoard scalars of a run (``tensorboard: true``): out_dir/tb/ event files written through tensorboardX.

``RunLog`` stands where the loop writes its per-step record: it passes the record to ``metrics.jsonl``
(MetricsLog) and, when the run asks for it, writes the scalars below at the record's step. Rank 0 alone writes.
Every record is flushed, so a killed run loses nothing already logged; the writer is closed when the loop ends,
stops or fails (``with log:``).

Each start opens a new event file. It begins with a purge marker at the step the run starts from (0 for a
fresh run, the checkpoint's step on resume), so TensorBoard hides what an earlier attempt logged at or after
that step, exactly as metrics.jsonl drops those lines, and the series reads like one uninterrupted run.
"""
from __future__ import annotations

import os

from .config import ConfigError

SCALARS = {  # record key -> TensorBoard tag
    "loss": "train/loss",
    "val_loss": "val/loss",
    "lr": "train/lr",
    "grad_norm": "train/grad_norm",
    "tokens_per_s": "train/tokens_per_s",
    "mfu": "train/mfu",
    "loss_scale": "train/loss_scale",
    "aux_loss": "train/aux_loss",  # MoE runs (moe_metrics): the load-balancing loss, the busiest expert's load over
    "expert_load_max": "train/expert_load_max",  # the mean, and the experts no token reached
    "experts_idle": "train/experts_idle",
    "mtp_loss": "train/mtp_loss",  # DeepSeek-V3 with multi-token prediction (mtp_metrics)
}


def summary_writer_class():
    """tensorboardX's SummaryWriter, or a ConfigError naming the ``tensorboard`` key when it is not installed."""
    try:
        from tensorboardX import SummaryWriter
    except ImportError as exc:
        raise ConfigError(f"tensorboard: true needs the tensorboardX package, which could not be imported ({exc})\n"
                          "HINT: pip install 'infini_train[tensorboard]', or set tensorboard=false") from None
    return SummaryWriter


class TensorBoardLog:
    """Scalars at each record's step into ``out_dir/tb``; ``resume_step`` None for a fresh run."""

    def __init__(self, out_dir, resume_step=None):
        SummaryWriter = summary_writer_class()
        self.logdir = os.path.join(out_dir, "tb")
        os.makedirs(self.logdir, exist_ok=True)
        start = int(resume_step or 0)
        # tensorboardX names files by the second and host only: the suffix keeps a quick restart from
        # overwriting the previous file and sorts the files of one second in start order
        self.writer = SummaryWriter(self.logdir, purge_step=start, filename_suffix=f".step{start:08d}.{os.getpid()}")

    def write(self, record):
        step = int(record["step"])
        for key, tag in SCALARS.items():
            value = record.get(key)
            if value is not None:
                self.writer.add_scalar(tag, float(value), global_step=step)
        self.writer.flush()

    def close(self):
        self.writer.close()


class RunLog:
    """The loop's per-step log: metrics.jsonl, plus TensorBoard when ``tensorboard`` is set (rank 0 only).

    Every rank checks that tensorboardX imports, so a missing package is one ConfigError on all ranks at the start.
    """

    def __init__(self, metrics_log, out_dir, tensorboard, resume_step=None, enabled=True):
        self.metrics = metrics_log
        self.tensorboard = None
        if tensorboard:
            summary_writer_class()
            if enabled:
                self.tensorboard = TensorBoardLog(out_dir, resume_step)

    def write(self, record):
        self.metrics.write(record)
        if self.tensorboard is not None:
            self.tensorboard.write(record)

    def close(self):
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
