"""The straggler report: each step split into compute, communication wait and data wait; the window's slowest rank
against the median, printed past the threshold and always recorded; the test hooks' parsing; a world of one times
nothing. Multi-rank runs (a delayed rank named in every window; a hang ending the job with every rank's stack):
tests/training/test_straggler_runs.py."""
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

import infini_train as it
from infini_train import distributed as dist
from infini_train.distributed.work import Work
from infini_train.training import stragglers
from infini_train.training.config import ConfigError
from tests.distributed.pending_group import PendingGroup
from infini_train.training.stragglers import OFF, StepWatch, describe, hang_rank, slow_rank, step_watch, summarize


def _rows(*busy, comm=0.0, data=0.0):
    """(wall, comm wait, data wait) per rank whose busy time (wall less comm wait) is ``busy``."""
    return [(b + comm, comm, data) for b in busy]


def test_the_slowest_rank_is_compared_with_the_median_of_every_rank():
    rows = [(1.0, 0.7, 0.01), (1.0, 0.72, 0.02), (1.0, 0.05, 0.1), (1.0, 0.69, 0.0)]  # rank 2 works 0.95 s
    record = summarize(rows, 10, 19)
    assert record["rank"] == 2 and record["step_s"] == pytest.approx(0.95)
    assert record["median_s"] == pytest.approx(np.median([0.3, 0.28, 0.95, 0.31]))  # (0.3 + 0.31) / 2
    assert record["compute_s"] == pytest.approx(0.85) and record["data_wait_s"] == pytest.approx(0.1)
    assert record["comm_wait_s"] == pytest.approx(0.05) and record["wall_s"] == pytest.approx(1.0)
    assert record["others_comm_wait_s"] == pytest.approx(0.7)  # the median of the others' waits
    assert record["ratio"] == pytest.approx(0.95 / 0.305, rel=1e-5)
    assert record["steps"] == [10, 19] and record["flagged"]
    assert describe(record) == ("straggler: rank 2 step 0.950 s vs median 0.305 s (compute 0.850 s, data wait 0.100 s: "
                                "compute dominates; the others wait 0.700 s for it in communication), mean of "
                                "steps 11-20")


def test_the_line_is_printed_only_past_the_threshold_and_the_gap():
    at = stragglers.THRESHOLD
    assert summarize(_rows(1.0, 1.0, 1.0 * at), 0, 0)["flagged"]  # exactly 1.2x the median
    assert not summarize(_rows(1.0, 1.0, 0.99 * at), 0, 0)["flagged"]
    tiny = summarize(_rows(0.010, 0.010, 0.018), 4, 4)  # 1.8x, but 8 ms: tiny steps jitter so
    assert tiny["rank"] == 2 and not tiny["flagged"] and describe(tiny) == ""
    even = summarize(_rows(0.5, 0.5), 0, 0)
    assert not even["flagged"] and even["ratio"] == 1.0


def test_data_wait_dominates_when_the_rank_waits_for_its_batches():
    record = summarize([(1.0, 0.8, 0.0), (1.0, 0.0, 0.7), (1.0, 0.8, 0.0)], 5, 5)
    assert record["rank"] == 1 and record["data_wait_s"] == pytest.approx(0.7)
    assert "data wait 0.700 s: data wait dominates" in describe(record) and "mean of step 6)" not in describe(record)
    assert describe(record).endswith("mean of step 6")


def test_a_two_rank_world_and_a_silent_world():
    assert summarize(_rows(0.0, 0.0), 0, 0)["ratio"] is None  # nothing measured: no division by zero
    two = summarize(_rows(0.1, 0.5), 0, 0)
    assert two["rank"] == 1 and two["median_s"] == pytest.approx(0.3) and two["flagged"]


def test_the_hooks_parse_and_refuse_clearly():
    assert slow_rank(4, {"INFINI_TRAIN_SLOW_RANK": "3:0.2"}) == (3, 0.2)
    assert slow_rank(4, {}) is None and slow_rank(4, {"INFINI_TRAIN_SLOW_RANK": ""}) is None
    assert hang_rank(2, {"INFINI_TRAIN_HANG_RANK": "1:3"}) == (1, 3, stragglers.HANG_SECONDS)
    assert hang_rank(2, {"INFINI_TRAIN_HANG_RANK": "1:3:20"}) == (1, 3, 20.0)
    for value in ("3", "3:x", "4:0.1", "-1:0.1", "1:-2", "1:0.1:2", "1:nan"):
        with pytest.raises(ConfigError) as info:
            slow_rank(4, {"INFINI_TRAIN_SLOW_RANK": value})
        msg = str(info.value)
        assert msg.startswith("INFINI_TRAIN_SLOW_RANK: expected RANK:SECONDS") and f"got {value!r}" in msg, msg
        assert "RANK in [0, 4)" in msg and "HINT" in msg
    with pytest.raises(ConfigError, match=r"INFINI_TRAIN_HANG_RANK: expected RANK:STEP\[:SECONDS\].*got '1:2.5'"):
        hang_rank(2, {"INFINI_TRAIN_HANG_RANK": "1:2.5"})
    with pytest.raises(ConfigError, match="INFINI_TRAIN_HANG_RANK: expected .* got '2:1'"):
        hang_rank(2, {"INFINI_TRAIN_HANG_RANK": "2:1"})


def _cfg(tmp_path, report=True, log_every=2, iterations=5):
    return SimpleNamespace(out_dir=str(tmp_path), train=SimpleNamespace(straggler_report=report, log_every=log_every,
                                                                        num_iterations=iterations))


def test_one_process_without_hooks_times_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("INFINI_TRAIN_SLOW_RANK", raising=False)
    monkeypatch.delenv("INFINI_TRAIN_HANG_RANK", raising=False)
    watch = step_watch(_cfg(tmp_path), 0, 1)
    assert watch is OFF and watch.end_step(0, None) == {} and watch.describe({}) == ""
    with watch.timing(0):
        pass
    assert dist.get_hang_dir() is None and not (tmp_path / "hang").exists()


def _waiting_work(seconds):
    """A Work that completes ``seconds`` after it is made (its wait is communication wait)."""
    done = threading.Event()
    threading.Timer(seconds, done.set).start()
    return Work(None, "all_reduce", done.is_set)


def test_the_step_splits_into_compute_communication_wait_and_data_wait(tmp_path, monkeypatch):
    watch = StepWatch(_cfg(tmp_path).train, 0, report=True, slow=(0, 0.15))  # this rank is delayed 0.15 s
    gathered = []
    monkeypatch.setattr(dist, "all_gather", lambda parts, mine: gathered.append(mine.numpy().copy())
                        or [p.array.__setitem__(slice(None), mine.numpy()) for p in parts])
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    steps = []
    for step in range(3):
        with watch.timing(step):
            _waiting_work(0.1).wait()  # 0.1 s of communication wait
            time.sleep(0.05)  # 0.05 s of compute, besides the hook's 0.15 s
        steps.append(watch.end_step(step, SimpleNamespace(data_wait_s=0.02)))
    assert steps[1] == {} and len(gathered) == 2  # windows end at steps 0 and 2 (log_every 2)
    wall, comm, data = gathered[1]  # the mean of steps 1 and 2
    assert 0.09 <= comm <= 0.2, gathered
    assert data == pytest.approx(0.02)
    assert 0.29 <= wall <= 0.6, gathered
    record = steps[2]["straggler"]
    assert record["steps"] == [1, 2] and record["compute_s"] == pytest.approx(wall - comm - data, abs=1e-5)
    assert 0.17 <= record["compute_s"] <= 0.45  # the hook's 0.15 s and 0.05 s, less the (reported) 0.02 s of data


def test_the_straggler_record_is_left_out_when_the_report_is_off(tmp_path):
    watch = StepWatch(_cfg(tmp_path, report=False).train, 1, report=False, slow=(0, 0.5))
    t0 = time.monotonic()
    with watch.timing(0):
        pass
    assert time.monotonic() - t0 < 0.4  # the delay is rank 0's, this is rank 1
    assert watch.end_step(0, None) == {}


def test_a_collective_carries_its_sequence_number_and_bytes():
    group = PendingGroup()
    group.all_reduce(it.tensor(np.ones(1024, np.float32)), async_op=True)
    work = group.all_reduce(it.tensor(np.ones(4, np.float32)), async_op=True)
    assert group.sequence == 2 and work.launch.sequence == 2 and work.launch.nbytes == 16
    assert group.last_collective is work.launch and work.launch.describe() == "sequence 2 on this group, 16 B"
    assert group.key.startswith("0,1#")
    recv = group.irecv(it.tensor(np.zeros(8)), 1)
    assert group.sequence == 2 and recv.launch.peer == 1 and recv.launch.nbytes == 64  # transfers are not numbered
    assert recv.launch.describe() == "64 B" and group.last_transfer is recv.launch
    one = dist.SingleProcessGroup()
    one.all_reduce(it.ones(4))
    assert one.sequence == 0  # a group of one pays one size test: it cannot hang
