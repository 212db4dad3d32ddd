"""launch/slurm.sbatch on a real (one-machine) Slurm cluster: a run trained to completion, then the same run taken
through every way a job stops (a task killed, scancel --signal=USR1, scontrol requeue, the time limit) ending
bitwise equal to it; and each way the script can start the ranks (srun with MPICH or Open MPI, mpirun with either).
Each test is whole in itself (its own cluster on whichever pytest worker runs it)."""
import json
import os
import re
import signal
import time

import pytest

from tests.cluster.slurm_jobs import (assert_bitwise_equal, checkpoint_steps, final_weights, job, log_path, log_text,
                                      rank_pid, slurm, submit, train_args, wait_for)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

# A step of this model takes ~6 ms on 2 ranks: 1200 steps leave time to stop the run four times (after a new
# checkpoint each time) and to resume it; while slurmctld's time-limit check comes round (every 30 s) the ranks are
# paused so that the run is still going when the warning arrives
STEPS = 1200
SAVE_EVERY = 100
FINISHED, RUNNING, PENDING = "COMPLETED", "RUNNING", "PENDING"


def ended(cluster_env, job_id):
    state = job(cluster_env, job_id)["JobState"]
    return None if state in (PENDING, RUNNING, "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD") else state


def finished_run(env, log_dir, args, timeout=120, **script_env):
    """sbatch the script and wait for the job to complete: (job id, its log)."""
    job_id = submit(env, log_dir, args, **script_env)
    state = wait_for(lambda: ended(env, job_id), timeout, f"job {job_id} to end",
                     lambda: log_text(log_dir, job_id)[-3000:])
    log = log_text(log_dir, job_id)
    assert state == FINISHED, log[-3000:]
    return job_id, log


def test_sbatch_trains_to_completion_and_every_way_a_job_stops_resumes_bitwise(slurm_cluster, data_dir, tmp_path):
    env = slurm_cluster

    # 0. Undisturbed, to the end: the log (<job name>-<job id>.out where the job ran, as the README says), the
    #    metrics and the checkpoints.
    reference = tmp_path / "uninterrupted"
    reference.mkdir()
    job_id, log = finished_run(env, reference, train_args(data_dir, reference / "run", STEPS, SAVE_EVERY))
    fields = job(env, job_id)
    assert fields["ExitCode"] == "0:0" and fields["Restarts"] == "0", fields
    assert os.path.basename(log_path(reference, job_id)) == f"infini-train-gpt2-{job_id}.out"
    assert f"job {job_id} (restart 0): 2 ranks on" in log, log
    assert re.search(r"world 2 = DP2, fp32, cpu \(mpi, MPICH [\d.]+\)", log), log  # srun --mpi=pmi2: the wheel
    assert f"step {STEPS:5d}/{STEPS}" in log and f"step_{STEPS:06d}" in log, log
    with open(reference / "run" / "metrics.jsonl") as f:
        assert [r["step"] for r in map(json.loads, f) if "loss" in r] == list(range(STEPS))
    assert checkpoint_steps(reference / "run")[-1] == STEPS

    out_dir, args = tmp_path / "run", train_args(data_dir, tmp_path / "run", STEPS, SAVE_EVERY)

    def state_of(job_id):
        return lambda: f"{job(env, job_id)}\n--- log\n{log_text(tmp_path, job_id)[-3000:]}"

    def checkpoint_after(step, job_id):
        return wait_for(lambda: [s for s in checkpoint_steps(out_dir) if s > step], 120,
                        f"a checkpoint after step {step}", state_of(job_id))[0]

    def running_start(job_id, restarts):
        wait_for(lambda: job(env, job_id)["JobState"] == RUNNING and job(env, job_id)["Restarts"] == str(restarts),
                 120, f"start {restarts} of job {job_id}", state_of(job_id))

    def requeued(job_id, restarts, before, timeout=90):
        """Wait until the job has been requeued ``restarts`` times; the stop must have checkpointed its step, at or
        after ``before`` (the newest step saved before the stop was asked for: a stop that lands at the step boundary
        of that very save writes the same step again)."""
        wait_for(lambda: job(env, job_id)["Restarts"] == str(restarts), timeout, f"requeue {restarts} of {job_id}",
                 state_of(job_id))
        wait_for(lambda: "(exit 75)" in log_text(tmp_path, job_id).split(f"(restart {restarts - 1})")[-1], 30,
                 "the batch script to report the stop", state_of(job_id))
        stops = re.findall(r"stopped by \S+ after (\d+) of \d+ steps, checkpoint \S+step_(\d+)",
                           log_text(tmp_path, job_id).split(f"(restart {restarts - 1})")[-1])
        assert stops, "the stop wrote no checkpoint"
        step, saved = (int(v) for v in stops[-1])
        assert step == saved >= before and saved in checkpoint_steps(out_dir), (stops, before)

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
    before = checkpoint_steps(out_dir)[-1]
    slurm(env, "scancel", "--signal=USR1", second)
    requeued(second, 1, before)
    assert "stopped by SIGUSR1" in log_text(tmp_path, second), state_of(second)()

    # 3. scontrol requeue: SIGTERM to the job; the ranks checkpoint, Slurm requeues it.
    running_start(second, 1)
    checkpoint_after(checkpoint_steps(out_dir)[-1], second)
    before = checkpoint_steps(out_dir)[-1]
    slurm(env, "scontrol", "requeue", second)
    requeued(second, 2, before)

    # 4. The time limit: lowered to one minute while the job runs, Slurm sends the batch shell SIGUSR1 (the
    #    script's --signal=B:USR1@120) at its next check; the script passes it on and requeues the job. The ranks
    #    wait for it stopped (SIGSTOP): the signal is kept for them, and they take it when continued.
    running_start(second, 2)
    checkpoint_after(checkpoint_steps(out_dir)[-1], second)
    ranks = [rank_pid(second, rank) for rank in (0, 1)]
    assert None not in ranks, state_of(second)()
    before = checkpoint_steps(out_dir)[-1]
    for pid in ranks:
        os.kill(pid, signal.SIGSTOP)
    try:
        slurm(env, "scontrol", "update", f"JobId={second}", "TimeLimit=1")
        wait_for(lambda: "SIGUSR1 (time limit near)" in log_text(tmp_path, second).split("(restart 2)")[-1], 60,
                 "Slurm's warning before the time limit", state_of(second))
    finally:
        for pid in ranks:
            os.kill(pid, signal.SIGCONT)
    requeued(second, 3, before)
    last_start = log_text(tmp_path, second).split("(restart 2)")[-1]
    assert "SIGUSR1 (time limit near)" in last_start and "requeueing" in last_start, state_of(second)()
    slurm(env, "scontrol", "update", f"JobId={second}", "TimeLimit=10")

    # 5. The last start finishes the run: the same weights, bit for bit, as the run nothing stopped.
    state = wait_for(lambda: ended(env, second), 120, f"job {second} to finish", state_of(second))
    assert state == FINISHED, state_of(second)()
    log = log_text(tmp_path, second)
    assert log.count("resumed from") == 4, log[-3000:]  # the starts after each stop
    assert_bitwise_equal(final_weights(out_dir, STEPS), final_weights(reference / "run", STEPS))


# The other ways the script starts the ranks: each gives the weights of the default (srun --mpi=pmi2, MPICH) bit for
# bit (two ranks sum their gradients exactly, in any order and with either MPI).
SHORT = 40
LAUNCH_PATHS = {
    "srun --mpi=pmix, Open MPI": ({"SRUN_MPI": "pmix"}, "Open MPI"),
    "mpirun in the allocation, MPICH": ({"LAUNCHER": "mpirun"}, "MPICH"),
    "mpirun in the allocation, Open MPI": ({"LAUNCHER": "mpirun", "MPIRUN": "mpirun.openmpi"}, "Open MPI"),
}


def test_each_way_of_starting_the_ranks_trains_the_same_weights(slurm_cluster, open_mpi, data_dir, tmp_path):
    finished_run(slurm_cluster, tmp_path, train_args(data_dir, tmp_path / "srun-pmi2", SHORT, SHORT))
    expected = final_weights(tmp_path / "srun-pmi2", SHORT)
    for name, (script_env, library) in LAUNCH_PATHS.items():
        out_dir = tmp_path / re.sub(r"\W+", "-", name)
        _, log = finished_run(slurm_cluster, tmp_path, train_args(data_dir, out_dir, SHORT, SHORT), **script_env)
        assert re.search(rf"world 2 = DP2, fp32, cpu \(mpi, {library} [\d.]+\)", log), f"{name}\n{log[-3000:]}"
        assert_bitwise_equal(final_weights(out_dir, SHORT), expected)
