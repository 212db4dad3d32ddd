"""Run logging: rank-0 printing, metrics.jsonl (one JSON object per step) and the loss-curve PNG."""
from __future__ import annotations

import json
import os


class MetricsLog:
    """Appends one JSON object per line to ``out_dir/metrics.jsonl``. On resume, lines at or after the
    resumed step are dropped first, so the file reads like one uninterrupted run."""

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
            tmp = self.path + ".tmp"
            with open(tmp, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in kept)
            os.replace(tmp, self.path)

    def write(self, record):
        if self.enabled:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")


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
    train = [(r["step"], r["loss"]) for r in rows if "loss" in r]
    val = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
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
