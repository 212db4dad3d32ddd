"""Host threads: the thread count (ours and NumPy's BLAS), spans of work, the pool."""
import ctypes
import multiprocessing
import os
import subprocess
import sys
import threading

import pytest

import infini_train as it
from infini_train import host_threads


@pytest.fixture
def threads():
    """Set the host thread count for one test, then restore it (and the BLAS threads with it)."""
    before = host_threads.get_num_threads()
    yield host_threads.set_num_threads
    host_threads.set_num_threads(before)


def _blas_threads():
    for path in sorted({line.split()[-1] for line in open("/proc/self/maps") if "openblas" in line.lower()}):
        getter = getattr(ctypes.CDLL(path), "scipy_openblas_get_num_threads64_", None)
        if getter is not None:
            return getter()
    pytest.skip("numpy's BLAS is not scipy-openblas")


def test_set_num_threads_sets_ours_and_numpys_blas(threads):
    threads(1)
    assert it.get_num_threads() == 1 and _blas_threads() == 1
    threads(2)
    assert it.get_num_threads() == 2 and _blas_threads() == 2


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_set_num_threads_rejects_what_is_not_a_positive_int(bad):
    with pytest.raises(ValueError, match=r"set_num_threads: expected an int >= 1, got .*\nHINT"):
        it.set_num_threads(bad)


def test_the_default_follows_omp_num_threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert host_threads._default_num_threads() == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "")
    assert host_threads._default_num_threads() == len(os.sched_getaffinity(0))


def test_spans_cover_the_range_in_aligned_runs(threads):
    threads(3)
    parts = host_threads.spans(1000, 64, 100)
    assert parts == [(0, 320), (320, 640), (640, 1000)]  # 16 runs of 64 (the last 40): 5, 5, 6
    assert host_threads.spans(150, 64, 100) == [(0, 150)]  # too small to share
    threads(1)
    assert host_threads.spans(10 ** 6, 64, 100) == [(0, 10 ** 6)]


def test_run_returns_in_order_and_raises_after_every_task_ended(threads):
    threads(2)
    assert host_threads.run([lambda i=i: i * i for i in range(5)]) == [0, 1, 4, 9, 16]
    ended = []

    def fails():
        raise RuntimeError("task 1 failed")

    def slow():
        threading.Event().wait(0.2)
        ended.append("slow")

    with pytest.raises(RuntimeError, match="task 1 failed"):
        host_threads.run([slow, fails, slow])
    assert ended == ["slow", "slow"]


def _child_runs_tasks(queue):
    queue.put(host_threads.run([lambda: 1, lambda: 2]))


def test_a_forked_child_gets_its_own_pool(threads):
    threads(2)
    host_threads.run([lambda: 0, lambda: 0])  # the parent's pool exists
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child_runs_tasks, args=(queue,))
    child.start()
    child.join(30)
    assert child.exitcode == 0 and queue.get(timeout=5) == [1, 2]


@pytest.mark.parametrize("code, env, expected", [
    ("import infini_train", {}, "18"),  # before numpy: OpenBLAS's workers sleep after ~2^18 cycles
    ("import numpy, infini_train", {}, "unset"),  # numpy loaded OpenBLAS already: too late, left alone
    ("import infini_train", {"OPENBLAS_THREAD_TIMEOUT": "10"}, "10"),  # the user's own setting stays
])
def test_importing_infini_train_first_shortens_openblas_spinning(code, env, expected):
    base = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    out = subprocess.run([sys.executable, "-c", f"{code}; import os; "
                          "print(os.environ.get('OPENBLAS_THREAD_TIMEOUT', 'unset'))"],
                         env={**base, **env}, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == expected
