"""Host threads for large element-wise work on CPU devices (torch's intra-op pool, ``set_num_threads``).

NumPy's ufuncs run on one core and release the GIL inside their loops, while its BLAS products already use
every core. Work that is many passes of ufuncs over large arrays and does not follow a product (the
optimizers' updates) is split into contiguous spans, one per thread, so it uses the cores the products use.
Right after a product, OpenBLAS's workers spin on the other cores for a while: an activation shared among
threads there measured no faster inside a model, so activations run in cache-sized blocks in one thread
(autograd/ops/blocked.py). Tasks handed to ``run`` must be pure array work: grad mode, autocast, the default
device and NumPy's errstate are thread-local and a pool thread has their defaults.

The thread count starts at ``OMP_NUM_THREADS`` when set (launchers set it to one per rank), else the cores
this process may run on. ``set_num_threads(n)`` sets it, and NumPy's OpenBLAS thread count with it.

OpenBLAS's workers spin for 2^28 cycles (about 0.1 s) after each product before they sleep, holding the other
cores that the optimizer's threads (and torch's, in a process running both) need: GPT-2 124M's AdamW step on two
cores measured 271 ms with that and 224 ms with 2^18 cycles (0.1 ms, still enough to keep back-to-back products
warm). OpenBLAS reads ``OPENBLAS_THREAD_TIMEOUT`` (log2 of the cycles) once, as NumPy loads it: importing
infini_train before NumPy sets it to 18 unless the environment already sets it.
"""
from __future__ import annotations

import ctypes
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

BLAS_SPIN_LOG2_CYCLES = "18"
if "numpy" not in sys.modules:
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", BLAS_SPIN_LOG2_CYCLES)

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
    runs = -(-size // align)
    parts = min(get_num_threads(), size // max(min_span, 1), runs)
    if parts <= 1:
        return [(0, size)]
    bounds = [min(size, align * (i * runs // parts)) for i in range(parts)] + [size]
    return list(zip(bounds[:-1], bounds[1:]))
