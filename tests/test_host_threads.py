"""Host threads: large element-wise work split among threads gives the bits of one call on the whole arrays."""
import ctypes
import multiprocessing
import threading

import numpy as np
import pytest

import infini_train as it
from infini_train import host_threads

BIG = 3 * host_threads.THREADED_BLOCK + 1234  # several threaded blocks and a ragged last one


@pytest.fixture
def threads():
    """Set the host thread count for one test, then restore it (and the BLAS threads with it)."""
    before = host_threads.get_num_threads()

    def set_threads(n):
        host_threads.set_num_threads(n)

    yield set_threads
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
    assert host_threads._default_num_threads() == len(__import__("os").sched_getaffinity(0))


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


def _kernel(x, out):
    np.multiply(x, x, out=out)
    out *= 0.25
    np.tanh(out, out=out)
    out += x


@pytest.mark.parametrize("n", [1, 2, 3])
def test_elementwise_gives_the_bits_of_one_whole_call_and_shares_the_work(threads, n):
    threads(n)
    x = np.random.default_rng(0).standard_normal(BIG).astype(np.float32)
    whole = np.empty_like(x)
    _kernel(x, whole)
    seen = []

    def recorded(*pieces):
        seen.append((threading.get_ident(), pieces[0].size))
        _kernel(*pieces)

    out = np.empty_like(x)
    host_threads.elementwise(recorded, (x, out))
    np.testing.assert_array_equal(out, whole)
    assert sum(size for _, size in seen) == BIG and len(seen) > 1
    assert len(host_threads.spans(BIG, host_threads.THREADED_BLOCK, host_threads.THREADED_BLOCK)) == n
    # the first span runs in this thread, the others in the pool (which may run two spans in one thread)
    assert min(n, 2) <= len({ident for ident, _ in seen}) <= n


def test_over_rows_splits_rows_and_leaves_strided_or_small_work_whole(threads):
    threads(2)
    rng = np.random.default_rng(1)
    rows = rng.standard_normal((4096, 200)).astype(np.float32)
    sums = np.empty((4096, 1), np.float32)
    calls = []

    def row_sums(block, block_sums):
        calls.append(block.shape[0])
        np.sum(block, axis=1, keepdims=True, out=block_sums)

    host_threads.over_rows(row_sums, (rows, sums), row_elements=200)
    np.testing.assert_array_equal(sums, rows.sum(axis=1, keepdims=True))
    assert sum(calls) == 4096 and max(calls) <= host_threads.THREADED_BLOCK // 200 + 1 and len(calls) > 2
    calls.clear()
    host_threads.over_rows(row_sums, (rows[:8], sums[:8]), row_elements=200)  # 1,600 elements: one call
    assert calls == [8]
    strided = rows[:, :100].T.copy().T  # Fortran order: not C-contiguous
    out = np.empty_like(strided)
    def negate(a, b):
        calls.append("whole")
        np.negative(a, out=b)

    host_threads.elementwise(negate, (strided, out))
    assert calls[-1] == "whole"
    np.testing.assert_array_equal(out, -strided)


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
