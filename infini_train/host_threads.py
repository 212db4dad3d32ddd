"""Host threads for large element-wise work on CPU devices (torch's intra-op pool, ``set_num_threads``).

NumPy's ufuncs run on one core and release the GIL inside their loops, while its BLAS products already use
every core. Work that is many passes of ufuncs over large arrays (the optimizers' updates) is split into
contiguous spans, one per thread, so it uses the cores the products use. Tasks handed to ``run`` must be
pure array work: grad mode, autocast, the default device and NumPy's errstate are thread-local and a pool
thread has their defaults.

The thread count starts at ``OMP_NUM_THREADS`` when set (launchers set it to one per rank), else the cores
this process may run on. ``set_num_threads(n)`` sets it, and NumPy's OpenBLAS thread count with it.
"""
from __future__ import annotations

import ctypes
import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

_lock = threading.Lock()
_num_threads = None  # resolved on first use
_pool = None
_pool_workers = 0
_pool_pid = None  # a forked child (data-loader workers) starts its own pool: the parent's threads are not there


def _default_num_threads():
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    if value.isdigit() and int(value) >= 1:
        return int(value)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def get_num_threads():
    """Threads that split large element-wise work on the host (1: everything runs in the calling thread)."""
    global _num_threads
    if _num_threads is None:
        _num_threads = _default_num_threads()
    return _num_threads


def set_num_threads(num_threads):
    """Use ``num_threads`` host threads for element-wise work, and as many in NumPy's OpenBLAS products."""
    global _num_threads, _pool
    if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(f"set_num_threads: expected an int >= 1, got {num_threads!r}\n"
                         "HINT: it.set_num_threads(1) runs every host computation on one core")
    with _lock:
        _num_threads = num_threads
        if _pool is not None:
            _pool.shutdown(wait=False)
            _pool = None
    _set_blas_threads(num_threads)


def _set_blas_threads(num_threads):
    """NumPy's bundled OpenBLAS (scipy-openblas) exports its thread setter; other BLAS builds keep their own."""
    try:
        with open("/proc/self/maps") as maps:
            libraries = {line.split()[-1] for line in maps if "openblas" in line.lower() and ".so" in line}
    except OSError:
        return False
    for path in sorted(libraries):
        try:
            library = ctypes.CDLL(path)
        except OSError:
            continue
        for name in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads"):
            setter = getattr(library, name, None)
            if setter is not None:
                setter(ctypes.c_int(num_threads))
                return True
    return False


def _executor(workers):
    global _pool, _pool_pid, _pool_workers
    with _lock:
        if _pool is None or _pool_pid != os.getpid() or _pool_workers < workers:
            if _pool is not None and _pool_pid == os.getpid():
                _pool.shutdown(wait=False)  # its threads end once their tasks have
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="infini_train-host")
            _pool_pid, _pool_workers = os.getpid(), workers
        return _pool


def run(tasks):
    """Run the callables in ``tasks`` at once (the first in this thread, the rest in the pool) and return their
    results in order; an exception in any task is raised here after every task has ended."""
    tasks = list(tasks)
    if len(tasks) <= 1:
        return [task() for task in tasks]
    futures = [_executor(len(tasks) - 1).submit(task) for task in tasks[1:]]
    results, error = [], None
    try:
        results.append(tasks[0]())
    except BaseException as exc:  # noqa: BLE001 - raised below, after the other tasks have ended
        error = exc
    for future in futures:
        try:
            results.append(future.result())
        except BaseException as exc:  # noqa: BLE001
            error = error or exc
    if error is not None:
        raise error
    return results


def spans(size, align, min_span):
    """Split ``range(size)`` into up to ``get_num_threads()`` contiguous (start, stop) spans of nearly equal
    whole numbers of ``align``-long runs (the last run may be short), each at least ``min_span`` long: one span
    when the work is too small to share."""
    parts = min(get_num_threads(), size // max(min_span, 1), -(-size // max(align, 1)))
    if parts <= 1:
        return [(0, size)]
    runs = -(-size // align)
    bounds = [min(size, align * (i * runs // parts)) for i in range(parts)] + [size]
    return list(zip(bounds[:-1], bounds[1:]))


# Elements per block of a kernel run by ``over_rows``: the few arrays of a block stay in cache across the
# kernel's passes. Shared among threads, a block must be larger: each ufunc call hands the GIL back and forth.
BLOCK = 1 << 15
THREADED_BLOCK = 1 << 17


def over_rows(kernel, arrays, row_elements=1):
    """Call ``kernel(*pieces)`` over matching blocks of rows (the leading axis) of ``arrays``, the blocks shared
    among the host threads: for row-wise kernels written as ``out=`` ufuncs over whole arrays (``row_elements``:
    the elements in one row of the widest array). Device arrays, and host work too small to split, run in one
    call over the whole arrays: the same kernel, the same bits."""
    rows = arrays[0].shape[0] if arrays[0].ndim else 0
    total = rows * row_elements
    if total < 2 * BLOCK or not isinstance(arrays[0], np.ndarray):
        kernel(*arrays)
        return
    shared = get_num_threads() > 1 and total >= 2 * THREADED_BLOCK
    block_rows = max(1, (THREADED_BLOCK if shared else BLOCK) // row_elements)
    parts = spans(rows, block_rows, block_rows) if shared else [(0, rows)]

    def run_span(start, stop):
        for begin in range(start, stop, block_rows):
            end = min(begin + block_rows, stop)
            kernel(*(a[begin:end] for a in arrays))

    run([functools.partial(run_span, start, stop) for start, stop in parts])


def elementwise(kernel, arrays):
    """``over_rows`` for element-wise kernels over same-shaped arrays: C-contiguous ones are split as flat runs
    of elements; others (strided, broadcast) run in one call."""
    if len({a.shape for a in arrays}) == 1 and all(a.flags.c_contiguous for a in arrays):
        over_rows(kernel, [a.reshape(-1) for a in arrays])
    else:
        kernel(*arrays)
