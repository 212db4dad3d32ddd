"""launch/slurm.sbatch on a real (one-machine) Slurm cluster: a run to completion, then one run taken through every
way a job stops — a task killed, scancel --signal=USR1, scontrol requeue, the time limit — ending bitwise equal to
the uninterrupted run."""
import json
import os
import signal
import time

import pytest

from infini_train.data.corpus import prepare_shards, stdlib_documents
from tests.cluster.slurm_jobs import (assert_bitwise_equal, checkpoint_steps, final_weights, job, log_path, log_text,
                                      rank_pid, slurm, submit, train_args, wait_for)

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.xdist_group("slurm")]

# The time-limit stop needs the run to outlast one of slurmctld's 30-second time-limit checks after the limit is
# lowered; a step of this model takes ~6 ms on 2 ranks, so the run is ~40 s of steps.
STEPS = 7000
SAVE_EVERY = 250
FINISHED, RUNNING, PENDING = "COMPLETED", "RUNNING", "PENDING"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("slurm_data")
    prepare_shards(stdlib_documents(300_000), str(directory), "byte")
    return directory


@pytest.fixture(scope="module")
def uninterrupted(slurm_cluster, data_dir, tmp_path_factory):
    """A job that trains to the end undisturbed: (job id, log dir, out_dir)."""
    root = tmp_path_factory.mktemp("uninterrupted")
    out_dir = root / "run"
    job_id = submit(slurm_cluster, root, train_args(data_dir, out_dir, STEPS, SAVE_EVERY))
    state = wait_for(lambda: ended(slurm_cluster, job_id), 240, f"job {job_id} to end",
                     lambda: log_text(root, job_id)[-3000:])
    assert state == FINISHED, log_text(root, job_id)[-3000:]
    return job_id, root, out_dir


def ended(cluster_env, job_id):
    state = job(cluster_env, job_id)["JobState"]
    return None if state in (PENDING, RUNNING, "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD") else state


def test_sbatch_trains_the_tiny_config_on_two_tasks_to_completion(slurm_cluster, uninterrupted):
    job_id, log_dir, out_dir = uninterrupted
    fields = job(slurm_cluster, job_id)
    assert fields["ExitCode"] == "0:0" and fields["Restarts"] == "0", fields
    log = log_text(log_dir, job_id)  # where the README says: <job name>-<job id>.out in the directory given
    assert os.path.basename(log_path(log_dir, job_id)) == f"infini-train-gpt2-{job_id}.out"
    assert f"job {job_id} (restart 0): 2 ranks on" in log and "world 2 (mpi; data parallel 2)" in log, log
    assert f"step {STEPS:5d}/{STEPS}" in log and f"step_{STEPS:06d}" in log, log
    with open(out_dir / "metrics.jsonl") as f:
        steps = [r["step"] for r in map(json.loads, f) if "loss" in r]
    assert steps == list(range(STEPS))
    assert checkpoint_steps(out_dir)[-1] == STEPS


def test_every_way_a_job_stops_then_resumes_bitwise(slurm_cluster, data_dir, uninterrupted, tmp_path):
    out_dir, args = tmp_path / "run", train_args(data_dir, tmp_path / "run", STEPS, SAVE_EVERY)
    env = slurm_cluster

    def state_of(job_id):
        return lambda: f"{job(env, job_id)}\n--- log\n{log_text(tmp_path, job_id)[-3000:]}"

    def checkpoint_after(step, job_id):
        return wait_for(lambda: [s for s in checkpoint_steps(out_dir) if s > step], 120,
                        f"a checkpoint after step {step}", state_of(job_id))[0]

    def running_start(job_id, restarts):
        wait_for(lambda: job(env, job_id)["JobState"] == RUNNING and job(env, job_id)["Restarts"] == str(restarts),
                 120, f"start {restarts} of job {job_id}", state_of(job_id))

    def requeued(job_id, restarts, timeout=90):
        """Wait until the job has been requeued ``restarts`` times; the stop must have left a checkpoint."""
        before = checkpoint_steps(out_dir)[-1]
        wait_for(lambda: job(env, job_id)["Restarts"] == str(restarts), timeout, f"requeue {restarts} of {job_id}",
                 state_of(job_id))
        wait_for(lambda: "(exit 75)" in log_text(tmp_path, job_id).split(f"(restart {restarts - 1})")[-1], 30,
                 "the batch script to report the stop", state_of(job_id))
        assert checkpoint_steps(out_dir)[-1] > before, "the stop wrote no checkpoint"

    # 1. A task killed with SIGKILL: the other is ended within SRUN_WAIT (10 s) and the job fails, not requeued.
    first = submit(env, tmp_path, args)
    checkpoint_after(0, first)
    victim = rank_pid(first, 1)
    assert victim is not None, state_of(first)()
    killed_at = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    state = wait_for(lambda: ended(env, first), 60, f"job {first} to fail", state_of(first))
    assert state == "FAILED" and time.monotonic() - killed_at < 30, state_of(first)()
    assert job(env, first)["Restarts"] == "0"
    assert "not requeued" in log_text(tmp_path, first), state_of(first)()

    # 2. Resubmitted: resume=auto continues; scancel --signal=USR1 (to the ranks) stops it with a checkpoint, and
    #    the batch script requeues it.
    second = submit(env, tmp_path, args)
    running_start(second, 0)
    checkpoint_after(checkpoint_steps(out_dir)[-1], second)
    slurm(env, "scancel", "--signal=USR1", second)
    requeued(second, 1)
    assert "stopped by SIGUSR1" in log_text(tmp_path, second), state_of(second)()

    # 3. scontrol requeue: SIGTERM to the job; the ranks checkpoint, Slurm requeues it.
    running_start(second, 1)
    checkpoint_after(checkpoint_steps(out_dir)[-1], second)
    slurm(env, "scontrol", "requeue", second)
    requeued(second, 2)

    # 4. The time limit: lowered to one minute while the job runs, Slurm sends the batch shell SIGUSR1 (the
    #    script's --signal=B:USR1@120) at its next check; the script passes it on and requeues the job.
    running_start(second, 2)
    checkpoint_after(checkpoint_steps(out_dir)[-1], second)
    slurm(env, "scontrol", "update", f"JobId={second}", "TimeLimit=1")
    requeued(second, 3, timeout=120)
    last_start = log_text(tmp_path, second).split("(restart 2)")[-1]
    assert "SIGUSR1 (time limit near)" in last_start and "requeueing" in last_start, state_of(second)()
    slurm(env, "scontrol", "update", f"JobId={second}", "TimeLimit=10")

    # 5. The last start finishes the run: the same weights, bit for bit, as the run nothing stopped.
    state = wait_for(lambda: ended(env, second), 180, f"job {second} to finish", state_of(second))
    assert state == FINISHED, state_of(second)()
    log = log_text(tmp_path, second)
    assert log.count("resumed from") == 4, log[-3000:]  # the starts after each stop
    _, _, reference_dir = uninterrupted
    assert_bitwise_equal(final_weights(out_dir, STEPS), final_weights(reference_dir, STEPS))
