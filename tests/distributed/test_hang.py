"""Hang reports: a collective or transfer that times out makes every rank write its Python stacks and pending
collective to the hang directory, and the error names the ranks that never arrived; the job still ends within the
timeout plus a few seconds."""
import os
import re
import time

import numpy as np
import pytest

import infini_train as it
from infini_train import distributed as dist
from infini_train.distributed import hang
from tests.distributed.mpi_jobs import job_env, mpirun, needs_mpiexec, output
from tests.distributed.pending_group import PendingGroup


@pytest.fixture
def hang_dir(tmp_path):
    yield tmp_path / "hang"
    hang.stop()


def _wait_for(predicate, seconds=5.0):
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_the_watchdog_answers_new_requests_only(hang_dir):
    hang_dir.mkdir()
    (hang_dir / "request.rank1.1.1.1").write_text("{}")  # a previous job's
    assert dist.set_hang_dir(hang_dir, rank=0, world_size=2) == str(hang_dir)
    assert dist.get_hang_dir() == str(hang_dir)
    time.sleep(3 * hang.POLL_SECONDS)
    assert not (hang_dir / "rank0.txt").exists()
    (hang_dir / "request.rank1.2.2.1").write_text("{}")
    assert _wait_for(lambda: (hang_dir / "rank0.txt").exists())
    text = (hang_dir / "rank0.txt").read_text()
    state = hang.read_state(hang_dir / "rank0.txt")
    assert state["answered"] == ["request.rank1.2.2.1"] and state["rank"] == 0 and state["waiting"] is None
    assert "for the timed-out waits of rank 1" in text
    assert "pending collective: none" in text
    assert "Python stacks (faulthandler" in text and "in _watch" in text  # the watchdog thread's own stack
    assert "in test_the_watchdog_answers_new_requests_only" in text  # the main thread's
    dist.set_hang_dir(None)
    assert dist.get_hang_dir() is None


def test_a_timeout_writes_this_ranks_report_and_names_the_ranks_that_did_not_answer(hang_dir, monkeypatch):
    monkeypatch.setenv(hang.GRACE_ENV, "0.3")
    dist.set_hang_dir(hang_dir, rank=0, world_size=2)  # rank 1 does not exist: it never answers
    group = PendingGroup()
    work = group.all_reduce(it.tensor(np.ones(256, np.float32)), async_op=True)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as info:
        work.wait(timeout=0.2)
    assert time.monotonic() - t0 < 3
    msg = str(info.value)
    assert re.search(rf"did not complete within 0.2 s \(sequence {group.sequence} on this group, 1.0 KB\); ranks "
                     r"that did not answer within 0.3 s \(no stack: stuck outside Python, or gone\): \[1\]", msg), msg
    text = (hang_dir / "rank0.txt").read_text()
    assert "pending collective: all_reduce on group ranks [0, 1]" in text
    assert f"sequence {group.sequence} on that group, 1.0 KB, waiting for 0.2" in text
    state = hang.read_state(hang_dir / "rank0.txt")
    assert state["waiting"]["sequence"] == group.sequence and state["entered"][group.key] == group.sequence
    assert "in test_a_timeout_writes_this_ranks_report" in text
    assert [p.name for p in hang_dir.iterdir() if p.name.startswith("request.")] == state["answered"]


def test_without_a_hang_directory_the_error_gives_the_sequence_and_bytes_only(monkeypatch):
    hang.stop()
    group = PendingGroup()
    work = group.broadcast(it.tensor(np.ones(3)), async_op=True)
    with pytest.raises(RuntimeError, match=rf"did not complete within 0.1 s \(sequence {group.sequence} on this "
                                           r"group, 24 B\)\nHINT"):
        work.wait(timeout=0.1)


def test_the_grace_period_is_checked():
    os.environ[hang.GRACE_ENV] = "soon"
    try:
        with pytest.raises(ValueError, match=r"INFINI_TRAIN_HANG_GRACE: expected a number of seconds >= 0 .* got "
                                             r"'soon'\nHINT"):
            hang.resolve_grace()
    finally:
        del os.environ[hang.GRACE_ENV]


def _reports(directory, ranks):
    return {r: (directory / f"rank{r}.txt").read_text() for r in range(ranks)}


@needs_mpiexec
def test_a_rank_that_never_arrives_is_named_and_every_rank_leaves_its_stack(tmp_path):
    proc = mpirun(3, "worker_hang.py", "collective", str(tmp_path / "hang"), timeout=90)
    ended = time.time()
    assert proc.returncode != 0, output(proc)
    ready = [float(t) for t in re.findall(r"rank \d ready at ([\d.]+)", proc.stdout)]
    assert len(ready) == 3, output(proc)
    # from the collective that hangs to the end of the job: within the timeout (3 s) plus 10 s
    assert ended - max(ready) < 3 + 10, f"{ended - max(ready):.1f} s\n{output(proc)}"
    # both waiting ranks time out and name rank 2; the first to raise aborts the job
    assert re.search(r"\[rank [01]\] RuntimeError: all_reduce on group ranks \[0, 1, 2\] \(this is world rank "
                     r"[01], group rank [01]; backend mpi\) did not complete within 3 s \(sequence 2 on this group, "
                     r"4.0 KB\); ranks never arrived: \[2\] \(their stacks: \S+rank2.txt\)", proc.stderr), output(proc)
    assert "should not get here" not in proc.stdout
    reports = _reports(tmp_path / "hang", 3)
    assert "in asleep_in_user_code" in reports[2] and "pending collective: none" in reports[2]
    assert hang.read_state(tmp_path / "hang" / "rank2.txt")["entered"] == {"0,1,2#0": 1}
    for r in (0, 1):
        assert ("pending collective: all_reduce on group ranks [0, 1, 2] (this is world rank "
                f"{r}, group rank {r}; backend mpi): sequence 2 on that group, 4.0 KB") in reports[r], reports[r]
        assert "Python stacks (faulthandler" in reports[r] and "worker_hang.py\", line" in reports[r]


@needs_mpiexec
def test_a_receive_whose_sender_never_sends_names_it(tmp_path):
    proc = mpirun(3, "worker_hang.py", "transfer", str(tmp_path / "hang"), timeout=90,
                  env=job_env(INFINI_TRAIN_HANG_GRACE="3"))
    assert proc.returncode != 0, output(proc)
    assert re.search(r"\[rank 0\] RuntimeError: recv from 1 on group ranks \[0, 1, 2\] .* did not complete within 3 s "
                     r"\(64 B\); ranks never arrived: \[1\] \(their stacks: \S+rank1.txt\)", proc.stderr), output(proc)
    reports = _reports(tmp_path / "hang", 3)
    assert "in asleep_in_user_code" in reports[1] and "in asleep_in_user_code" in reports[2]
    assert "pending collective: recv from 1 on group ranks [0, 1, 2]" in reports[0]
