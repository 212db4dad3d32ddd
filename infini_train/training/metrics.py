"""Run logging: rank-0 printing, metrics.jsonl (one JSON object per step) and the loss-curve PNG."""
from __future__ import annotations

import json
import math
import os

from ..atomic_file import write_text_atomically


def json_safe(record):
    """``record`` as strict JSON allows: a non-finite float value becomes null, and ``nonfinite`` maps its key to
    "nan", "inf" or "-inf" (json.dumps would write NaN / Infinity, which JSON parsers other than Python's reject)."""
    bad = {k: str(v) for k, v in record.items() if isinstance(v, float) and not math.isfinite(v)}
    if not bad:
        return record
    return {**{k: (None if k in bad else v) for k, v in record.items()}, "nonfinite": bad}


class MetricsLog:
    """Appends one JSON object per line to ``out_dir/metrics.jsonl`` (strict JSON: see ``json_safe``). On resume,
    lines at or after the resumed step are dropped first, so the file reads like one uninterrupted run. A record's
    "step" counts the steps trained before it (as checkpoints and resume do): the log's "step 1/30" is step 0."""

    def __init__(self, out_dir, resume_step=None, enabled=True):
        self.path = os.path.join(out_dir, "metrics.jsonl")
        self.enabled = enabled
        if not enabled:
            return
        os.makedirs(out_dir, exist_ok=True)
        if resume_step is None:
            open(self.path, "w").close()
        elif os.path.exists(self.path):
            kept = [line for line in read_metrics(self.path) if line.get("step", 0) < resume_step]
            write_text_atomically(self.path, "".join(json.dumps(json_safe(r), allow_nan=False) + "\n" for r in kept))

    def write(self, record):
        if self.enabled:
            with open(self.path, "a") as f:
                f.write(json.dumps(json_safe(record), allow_nan=False) + "\n")


def read_metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def plot_loss_curve(metrics_path, png_path):
    """Write a PNG of train (and val) loss against step; returns False when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = read_metrics(metrics_path)
    train = [(r["step"], r["loss"]) for r in rows if r.get("loss") is not None]
    val = [(r["step"], r["val_loss"]) for r in rows if r.get("val_loss") is not None]
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        ax.plot(*zip(*train), label="train loss", linewidth=1)
    if val:
        ax.plot(*zip(*val), "o-", label="val loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    tmp = png_path + ".tmp.png"
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, png_path)
    return True
