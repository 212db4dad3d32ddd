"""Training a model whose whole fp32 training state (parameters, gradients, AdamW's two moments: 16 bytes per
parameter, 809 MB here) is several times what each rank may use: under ZeRO-3 on 4 ranks, each capped at its
start-up address space plus 300 MB (RLIMIT_AS), the run trains, saves a sharded checkpoint and resumes from it;
plain data parallelism under the same cap cannot hold the model and fails."""
import sys

from infini_train.run_state import list_checkpoints
from tests.distributed.mpi_jobs import MPIEXEC, needs_mpiexec, output
from tests.training.tiny_run import REPO, job_env, metrics

pytestmark = needs_mpiexec

ALLOWANCE_MB = 300
MODEL = ["model.n_layer=16", "model.n_embd=512", "model.n_head=8", "model.block_size=32"]  # 50.6M parameters


def _capped(data_dir, out, *extra):
    import os
    import subprocess

    args = [MPIEXEC, "-n", "4", sys.executable, os.path.join(REPO, "tests", "distributed", "capped_train.py"),
            str(ALLOWANCE_MB), "--config", os.path.join(REPO, "configs", "gpt2_tiny.yaml"), f"out_dir={out}",
            f"data.train={data_dir}/train_*.bin", "data.val=null", "data.source=null", "train.val_loss_every=0",
            "train.sample_every=0", "train.batch_size=2", "train.sequence_length=32", "train.total_batch_size=256",
            "plot=false", "device=cpu", *MODEL, *extra]
    return subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=REPO, env=job_env())


def test_zero3_trains_saves_and_resumes_a_model_no_rank_could_hold(data_dir, tmp_path):
    out = tmp_path / "zero3"
    proc = _capped(data_dir, out, "parallel.zero_stage=3", "train.num_iterations=2")
    assert proc.returncode == 0, output(proc)
    assert proc.stdout.count("address space capped") == 4
    assert "parameters: 50,587,136 (all trainable); per rank " in proc.stdout
    assert [c.name for c in map(__import__("pathlib").Path, list_checkpoints(out))] == ["step_000002"]
    proc = _capped(data_dir, out, "parallel.zero_stage=3", "train.num_iterations=3", "resume=auto")
    assert proc.returncode == 0, output(proc)
    assert "at step 2" in proc.stdout, output(proc)
    assert [r["step"] for r in metrics(out) if "loss" in r] == [0, 1, 2]


def test_plain_data_parallelism_cannot_hold_it_under_the_same_cap(data_dir, tmp_path):
    proc = _capped(data_dir, tmp_path / "ddp", "parallel.zero_stage=0", "train.num_iterations=2")
    assert proc.returncode != 0, output(proc)
    assert "aborting the job" in proc.stderr, output(proc)
