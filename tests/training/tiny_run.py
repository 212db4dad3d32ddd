"""Helpers for tests that run the training script on a tiny GPT-2 and a small stdlib corpus (seconds per run)."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np

from infini_train.data.corpus import prepare_shards, stdlib_documents
from infini_train.run_state import list_checkpoints, load_checkpoint
from tests.processes import processes

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(REPO, "examples", "gpt2", "train.py")
CONFIG = os.path.join(REPO, "configs", "gpt2_tiny.yaml")


def make_data(directory):
    prepare_shards(stdlib_documents(300_000), str(directory), "byte")
    return directory


def tiny_args(data_dir, out_dir, *extra):
    return [f"out_dir={out_dir}", f"data.train={data_dir}/train_*.bin", f"data.val={data_dir}/val_*.bin",
            "data.source=null", "model.n_layer=2", "model.n_embd=64", "model.n_head=2", "model.block_size=32",
            "train.batch_size=4", "train.sequence_length=32", "train.total_batch_size=128", "train.warmup_iters=2",
            "train.val_loss_every=5", "train.val_max_steps=2", "train.sample_every=0", "train.log_every=1",
            "plot=false", "device=cpu", *extra]


def command(args, ranks=1, config=CONFIG):
    base = [sys.executable, TRAIN, "--config", config, *args]
    if ranks == 1:
        return base
    from tests.distributed.mpi_jobs import MPIEXEC
    return [MPIEXEC, "-n", str(ranks), *base]


def job_env(**extra):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def run(args, check=True, ranks=1, env=None, config=CONFIG):
    proc = subprocess.run(command(args, ranks, config), capture_output=True, text=True, timeout=300, cwd=REPO,
                          env=env or job_env())
    if check and proc.returncode != 0:
        raise AssertionError(f"train.py failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def losses_by_step(out_dir):
    """{step: training loss} of a run's metrics.jsonl."""
    return {r["step"]: r["loss"] for r in metrics(out_dir) if "loss" in r}


def grad_norms(out_dir):
    """The gradient norm of every logged step of a run, in order."""
    return [r["grad_norm"] for r in metrics(out_dir) if "grad_norm" in r]


def values(out_dir, key):
    """The values of ``key`` in a run's metrics.jsonl records that have it, in order (a numpy array)."""
    return np.array([r[key] for r in metrics(out_dir) if key in r])


def assert_close_weights(out_dir, ref_dir, rtol, atol):
    """The final checkpoints of two runs hold the same names, in order, with weights within the tolerances."""
    mine, _, _ = load_checkpoint(list_checkpoints(out_dir)[-1])
    ref, _, _ = load_checkpoint(list_checkpoints(ref_dir)[-1])
    assert list(mine) == list(ref)
    for name in ref:
        np.testing.assert_allclose(np.asarray(mine[name]), np.asarray(ref[name]), rtol=rtol, atol=atol, err_msg=name)


def reference_runs(make_dir, train):
    """``reference(*extra)``: the output directory of the one-process run ``train(out, *extra)``, run once per
    ``extra`` (``make_dir()``: a fresh directory, e.g. a module fixture's tmp_path_factory.mktemp)."""
    runs = {}

    def reference(*extra):
        if extra not in runs:
            runs[extra] = make_dir()
            train(runs[extra], *extra)
        return runs[extra]
    return reference


def metrics(out_dir):
    """The step and validation records of metrics.jsonl (not the run's closing memory record)."""
    return [r for r in all_records(out_dir) if "memory" not in r]


def all_records(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def same_run(a, b):
    """Two runs ended identically: every logged loss and validation loss, and the final weights, bitwise."""
    def values(out):
        return [(r["step"], r.get("loss"), r.get("val_loss"), r.get("grad_norm")) for r in metrics(out)]

    assert values(a) == values(b)
    wa, oa, sa = load_checkpoint(list_checkpoints(a)[-1])
    wb, ob, sb = load_checkpoint(list_checkpoints(b)[-1])
    assert sa["step"] == sb["step"]
    for k in wa:
        np.testing.assert_array_equal(wa[k], wb[k], err_msg=k)


def rank_pids(marker):
    """PIDs of the python processes whose command line contains ``marker`` (the ranks of one job)."""
    python, marker = os.path.basename(sys.executable).encode(), marker.encode()
    return sorted(pid for pid, argv, _ in processes() if argv[0].endswith(python) and marker in b" ".join(argv))


def signal_after_steps(proc, out_dir, steps, number=signal.SIGTERM, pid=None, timeout=120):
    """Wait until ``steps`` metrics lines exist, then send ``number`` to ``pid`` (default: the process itself)."""
    path = os.path.join(out_dir, "metrics.jsonl")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before step {steps}")
        if os.path.exists(path):
            with open(path) as f:
                if sum(1 for _ in f) >= steps:
                    break
        time.sleep(0.02)
    os.kill(pid or proc.pid, number)
