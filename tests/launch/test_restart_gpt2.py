"""The real thing: tiny GPT-2 on 2 ranks under launch/run.sh --max-restarts 1, one rank SIGKILLed after a checkpoint;
the relaunched job (resume=auto) must end with weights bitwise equal to an uninterrupted run's."""
import os
import signal

import numpy as np
import pytest

from infini_train.data.corpus import prepare_shards, stdlib_documents
from tests.processes import parent_pids, processes
from tests.launch.jobs import (RANK_VARIABLES, REPO, launcher_env, needs_mpiexec, output, run_sh, start_run_sh,
                               wait_until)

pytestmark = [pytest.mark.slow, needs_mpiexec]
STEPS = 12


def train_args(data_dir, out_dir):
    # the default tiny model (4 layers, 256 wide: ~0.3 s a step on 2 ranks of a 2-core machine) leaves about a
    # second between two checkpoints in which to kill a rank; 12 steps, a checkpoint every 4
    return ["examples/gpt2/train.py", "--config", os.path.join(REPO, "configs", "gpt2_tiny.yaml"),
            f"out_dir={out_dir}", f"data.train={data_dir}/train_*.bin", f"data.val={data_dir}/val_*.bin",
            "data.source=null", "train.batch_size=8", "train.sequence_length=64", "train.total_batch_size=1024",
            f"train.num_iterations={STEPS}", "train.save_every=4", "train.val_loss_every=0", "train.sample_every=0",
            "train.log_every=1", "plot=false", "device=cpu"]


def descendants(pid):
    children = {}
    for child, parent in parent_pids().items():
        children.setdefault(parent, []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def rank_pid(launcher_pid, rank):
    """The pid of the train.py process of ``rank`` started (through mpirun and its daemon) by launcher_pid."""
    under = set(descendants(launcher_pid))
    for pid, argv, environ in processes(environ=True):
        if pid in under and b"examples/gpt2/train.py" in argv and any(f"{v}={rank}".encode() in environ
                                                                      for v in RANK_VARIABLES):
            return pid
    return None


def final_weights(out_dir):
    from infini_train.run_state import load_checkpoint
    return load_checkpoint(os.path.join(out_dir, "checkpoints", f"step_{STEPS:06d}"))[0]  # sharded: 2 ranks


def test_a_rank_killed_after_a_checkpoint_is_relaunched_and_ends_bitwise_equal_to_an_uninterrupted_run(tmp_path):
    data = tmp_path / "data"
    prepare_shards(stdlib_documents(300_000), str(data), "byte")
    env = launcher_env(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")

    reference = run_sh("-n", "2", *train_args(data, tmp_path / "reference"), timeout=120, env=env)
    assert reference.returncode == 0, output(reference)

    out = tmp_path / "killed"
    proc = start_run_sh("-n", "2", "--max-restarts", "1", *train_args(data, out), env=env)
    try:
        first = out / "checkpoints" / "step_000004" / "state.json"  # state.json last: the checkpoint is complete
        wait_until(first.exists, timeout=90, what="the step-4 checkpoint", proc=proc)
        victim = rank_pid(proc.pid, 1)
        assert victim is not None, "rank 1's train.py process was not found under run.sh"
        os.kill(victim, signal.SIGKILL)
        finished_before_the_kill = (out / "checkpoints" / f"step_{STEPS:06d}").exists()
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    report = f"--- rc {proc.returncode}\n--- stdout\n{stdout[-4000:]}\n--- stderr\n{stderr[-4000:]}"
    assert proc.returncode == 0, report
    assert not finished_before_the_kill, "the run was too fast: rank 1 was killed after its last step"
    restarts = [line for line in stderr.splitlines() if "] restart " in line]
    assert len(restarts) == 1 and "restart 1/1 after exit status" in restarts[0], report
    assert "after exit status 0" not in restarts[0] and "after exit status 75" not in restarts[0], report
    assert restarts[0].rstrip().endswith("resume=auto"), report  # the relaunch continues from a checkpoint

    expected, got = final_weights(tmp_path / "reference"), final_weights(out)
    assert sorted(got) == sorted(expected)
    for name in expected:
        assert got[name].dtype == expected[name].dtype and got[name].shape == expected[name].shape, name
        assert np.array_equal(got[name].view(np.uint8), expected[name].view(np.uint8)), f"{name} differs"
