"""DDP and the training script on real 2-rank jobs under mpiexec. The process-group layer itself is tested in
test_process_group.py, test_collectives.py, test_failures.py and test_nccl.py."""
import os
import re
import subprocess
import sys

import pytest

from tests.distributed.mpi_jobs import MPIEXEC, OPEN_MPI, needs_mpiexec

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
pytestmark = [needs_mpiexec, pytest.mark.layouts]


def mpirun(n, *args, timeout=120):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONPATH=REPO)
    return subprocess.run([MPIEXEC, "-n", str(n), sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO)


def test_ddp_equals_single_process_no_sync_and_unused_parameters():
    proc = mpirun(2, os.path.join(HERE, "worker_ddp.py"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rank 0 DDP OK" in proc.stdout and "rank 1 DDP OK" in proc.stdout


def test_train_script_on_two_ranks_matches_one_rank_with_twice_the_batch(tmp_path):
    import json

    import numpy as np

    from infini_train.data.corpus import prepare_shards, stdlib_documents
    from tests.training.tiny_run import TRAIN, tiny_args

    data = tmp_path / "data"
    prepare_shards(stdlib_documents(200_000), str(data), "byte")
    cfg = os.path.join(REPO, "configs", "gpt2_tiny_ddp.yaml")
    common = ["train.num_iterations=4", "train.save_every=2", "train.val_loss_every=2"]
    # validation: val_max_steps batches of batch_size sequences, here 2 x 4 on both (4 x 2 over the two ranks)
    two = mpirun(2, TRAIN, "--config", cfg, *tiny_args(data, tmp_path / "two", *common, "train.batch_size=2",
                                                        "train.val_max_steps=4"), timeout=300)
    assert two.returncode == 0, two.stdout[-2000:] + two.stderr[-2000:]
    library = "Open MPI" if OPEN_MPI else "MPICH"  # the MPI the ranks loaded
    assert re.search(rf"world 2 = DP2, fp32, cpu \(mpi, {library} [\d.]+\)", two.stdout), two.stdout
    one = subprocess.run([sys.executable, TRAIN, "--config", cfg, *tiny_args(data, tmp_path / "one", *common)],
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert one.returncode == 0, one.stderr[-2000:]

    def rows(name):
        with open(tmp_path / name / "metrics.jsonl") as f:
            return [json.loads(line) for line in f]

    a, b = rows("two"), rows("one")
    np.testing.assert_allclose([r["loss"] for r in a if "loss" in r], [r["loss"] for r in b if "loss" in r], rtol=1e-5)
    np.testing.assert_allclose([r["val_loss"] for r in a if "val_loss" in r],
                               [r["val_loss"] for r in b if "val_loss" in r], rtol=1e-5)
    assert os.path.isdir(tmp_path / "two" / "checkpoints" / "step_000004")  # rank 0 wrote it
    # resume under DDP continues from the checkpoint
    again = mpirun(2, TRAIN, "--config", cfg, *tiny_args(data, tmp_path / "two", "train.num_iterations=6",
                                                          "train.save_every=2", "train.batch_size=2",
                                                          "resume=auto"), timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resumed from" in again.stdout and "step_000004" in again.stdout
