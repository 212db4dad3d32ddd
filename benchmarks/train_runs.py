"""Running examples/gpt2/train.py from a benchmark: one BLAS thread per process, a clear exit when the run fails, and
the step records of its metrics.jsonl."""
from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def step_records(config, out, overrides, ranks=1):
    """Train with ``config`` and ``overrides`` into ``out`` (under mpiexec with ``ranks`` > 1); returns the
    metrics.jsonl records of the training steps (those with a loss and a step time)."""
    return train_run(config, out, overrides, ranks)[0]


def train_run(config, out, overrides, ranks=1):
    """``step_records``'s run: (its step records, what it printed)."""
    args = [sys.executable, os.path.join(REPO, "examples", "gpt2", "train.py"), "--config", config,
            f"out_dir={out}", *overrides]
    if ranks > 1:
        from tests.distributed.mpi_jobs import MPIEXEC

        args = [MPIEXEC, "-n", str(ranks), *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    proc = subprocess.run(args, capture_output=True, text=True, cwd=REPO, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"run failed: {' '.join(overrides)}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if "loss" in r and "ms" in r], proc.stdout
