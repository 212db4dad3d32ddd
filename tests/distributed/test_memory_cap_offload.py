"""Optimizer state offloaded to disk under an address-space cap: the 50.6M-parameter model of test_memory_cap.py under
ZeRO-3 on 2 ranks holds 96 MB of parameters, 96 MB of gradients and 193 MB of AdamW moments per rank. Each rank capped
at its start-up address space plus 275 MB (RLIMIT_AS), plain ZeRO-3 x 2 fails (it needs about 350-400 MB more); with
``train.optimizer_offload=disk`` the moments live in out_dir/offload/rank<R>/ and the run trains, saves a sharded
checkpoint and resumes from it (it needs about 200 MB more), with the losses and checkpoint files of the in-memory
run, bit for bit."""
import json
import os
import subprocess
import sys

from tests.distributed.mpi_jobs import MPIEXEC, needs_mpiexec, output
from tests.distributed.test_memory_cap import MODEL
from tests.training.tiny_run import REPO, job_env, metrics

pytestmark = needs_mpiexec

ALLOWANCE_MB = 275
UNCAPPED_MB = 100_000


def _capped(data_dir, out, allowance, *extra):
    args = [MPIEXEC, "-n", "2", sys.executable, os.path.join(REPO, "tests", "distributed", "capped_train.py"),
            str(allowance), "--config", os.path.join(REPO, "configs", "gpt2_tiny.yaml"), f"out_dir={out}",
            f"data.train={data_dir}/train_*.bin", "data.val=null", "data.source=null", "train.val_loss_every=0",
            "train.sample_every=0", "train.batch_size=2", "train.sequence_length=32", "train.total_batch_size=128",
            "plot=false", "device=cpu", "parallel.zero_stage=3", *MODEL, *extra]
    return subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=REPO, env=job_env())


def _files(out, step):
    """{file: sha256} of checkpoint ``step``'s tensor files and metadata (state.json records them)."""
    with open(os.path.join(out, "checkpoints", f"step_{step:06d}", "state.json")) as f:
        return {name: info["sha256"] for name, info in json.load(f)["files"].items()}


def _losses(out):
    return [(r["step"], r["loss"], r["grad_norm"]) for r in metrics(out) if "loss" in r]


def test_zero3_with_the_optimizer_state_on_disk_trains_saves_and_resumes_where_in_memory_cannot(data_dir, tmp_path):
    proc = _capped(data_dir, tmp_path / "in_memory", ALLOWANCE_MB, "train.num_iterations=2")
    assert proc.returncode != 0, output(proc)
    assert "MemoryError" in proc.stderr or "aborting the job" in proc.stderr, output(proc)

    out = tmp_path / "offloaded"
    proc = _capped(data_dir, out, ALLOWANCE_MB, "train.num_iterations=2", "train.optimizer_offload=disk")
    assert proc.returncode == 0, output(proc)
    assert proc.stdout.count("address space capped") == 2
    assert "optimizer state 0.00 MB + 192.97 MB offloaded (disk)" in proc.stdout, output(proc)  # (each rank)
    assert not os.path.exists(out / "offload")  # the scratch files went with the run
    proc = _capped(data_dir, out, ALLOWANCE_MB, "train.num_iterations=3", "train.optimizer_offload=disk",
                   "resume=auto")
    assert proc.returncode == 0, output(proc)
    assert "at step 2" in proc.stdout, output(proc)

    reference = tmp_path / "reference"  # the same two runs in memory, without the cap
    for extra in (["train.num_iterations=2"], ["train.num_iterations=3", "resume=auto"]):
        proc = _capped(data_dir, reference, UNCAPPED_MB, *extra)
        assert proc.returncode == 0, output(proc)
    assert _losses(out) == _losses(reference) and [s for s, *_ in _losses(out)] == [0, 1, 2]
    for step in (2, 3):
        assert _files(out, step) == _files(reference, step), step
