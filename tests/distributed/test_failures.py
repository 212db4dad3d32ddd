"""A failing rank ends the whole job within seconds; a collective that never completes raises a clear error."""
import time

import pytest

from tests.distributed.mpi_jobs import job_env, mpirun, needs_mpiexec, output

pytestmark = needs_mpiexec


@pytest.mark.parametrize("mode, message", [
    ("raise", "[rank 1] ValueError: rank 1 failed on purpose"),
    ("thread", "[rank 1] KeyError: 'rank 1 background thread failed on purpose'"),
])
def test_an_exception_on_one_rank_aborts_every_rank_quickly(mode, message):
    t0 = time.monotonic()
    proc = mpirun(2, "worker_failures.py", mode, timeout=60)
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0, output(proc)
    assert elapsed < 30, f"the job took {elapsed:.1f} s to end\n{output(proc)}"
    assert message in proc.stderr, output(proc)
    assert "aborting the job (2 ranks)" in proc.stderr
    assert "should not get here" not in proc.stdout  # rank 0 was ended inside its collective, not released


def test_a_collective_a_rank_never_joins_times_out_naming_it_and_the_ranks():
    t0 = time.monotonic()
    proc = mpirun(2, "worker_failures.py", "timeout", timeout=60)
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0, output(proc)
    assert elapsed < 30, f"the job took {elapsed:.1f} s to end\n{output(proc)}"
    # the async barrier's wait(timeout=1), caught by the script
    assert ("CAUGHT: barrier on group ranks [0, 1] (this is world rank 0, group rank 0; backend mpi) did not "
            "complete within 1 s") in proc.stdout, output(proc)
    # the sync all_reduce under init_process_group(timeout=2), uncaught: it aborts the job
    assert ("[rank 0] RuntimeError: all_reduce on group ranks [0, 1] (this is world rank 0, group rank 0; "
            "backend mpi) did not complete within 2 s") in proc.stderr, output(proc)
    assert "[rank 0] HINT: another rank of the group never joined this collective" in proc.stderr
    assert "INFINI_TRAIN_COLLECTIVE_TIMEOUT" in proc.stderr


def test_a_rank_that_calls_sys_exit_ends_the_job_within_the_grace_period():
    t0 = time.monotonic()
    proc = mpirun(2, "worker_failures.py", "exit", timeout=60, env=job_env(INFINI_TRAIN_EXIT_GRACE="2"))
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0, output(proc)
    assert elapsed < 20, f"the job took {elapsed:.1f} s to end\n{output(proc)}"
    assert "[rank 1] exited before the other ranks" in proc.stderr, output(proc)
    assert "should not get here" not in proc.stdout


def test_ranks_that_end_together_without_destroy_exit_cleanly():
    proc = mpirun(2, "worker_failures.py", "clean", timeout=60, env=job_env(INFINI_TRAIN_EXIT_GRACE="2"))
    assert proc.returncode == 0, output(proc)
    assert "rank 0 done" in proc.stdout and "rank 1 done" in proc.stdout and "aborting" not in proc.stderr


def test_a_rank_failing_inside_a_pipeline_transfer_ends_the_job_quickly():
    t0 = time.monotonic()
    proc = mpirun(2, "worker_failures.py", "pipeline", timeout=60)
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0, output(proc)
    assert elapsed < 30, f"the job took {elapsed:.1f} s to end\n{output(proc)}"
    assert "[rank 1] ConnectionError: rank 1 failed inside a pipeline transfer on purpose" in proc.stderr, output(proc)
    assert "should not get here" not in proc.stdout


def test_a_pipeline_peer_that_stops_makes_the_receive_time_out_naming_it():
    t0 = time.monotonic()
    proc = mpirun(2, "worker_failures.py", "pipeline-hang", timeout=60)
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0, output(proc)
    assert elapsed < 30, f"the job took {elapsed:.1f} s to end\n{output(proc)}"
    assert "[rank 0] RuntimeError: recv from 1 on group ranks [0, 1]" in proc.stderr, output(proc)
    assert "did not complete within 2 s" in proc.stderr
