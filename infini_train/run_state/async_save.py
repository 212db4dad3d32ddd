"""Asynchronous checkpoints (``train.checkpoint_async``), as torchtitan's async mode and Megatron's --async-save: at
the step boundary every rank copies what it writes into host staging buffers (pinned host memory for GPU arrays)
and hands the files to a background writer thread; training goes on while it writes.

What stays on the main thread is the collective part, at the boundary: the checkpoint's temporary directory and,
for the sharded format, the plan of which rank writes which box (it.distributed.checkpoint's plan_save); for the
whole format, the gather to rank 0. The writer threads do file I/O only, never a collective (a collective from a
second thread would race the training's on the same communicator), so completion is agreed through the shared
directory: each rank's writer leaves ``shard<R>.done`` (its file's size and SHA-256) or ``shard<R>.error`` beside
its shard, and rank 0's writer, once every rank's marker is there, writes metadata.json and state.json (the
completion marker) and renames the directory into place, then prunes (``keep_last``). Until then the checkpoint does
not exist: a job killed mid-write leaves the previous one as the newest, and the next save removes the temporary
directory.

At most one save is in flight: a new save, a stop signal and the end of the run wait for it (``wait``). A writer's
error is raised on its rank's main thread at the next step boundary (``check``), so the run ends with it; rank 0's
writer gives up on a rank whose marker does not come within the collective timeout and names it.
"""
from __future__ import annotations

import json
import os
import shutil
import threading
import time

import numpy as np

from .. import backend
from ..atomic_file import write_text_atomically
from ..distributed.checkpoint import storage as dcp
from ..distributed.work import resolve_timeout
from .directory import step_dir
from .verify import SHARDED
from .writer import commit, make_temporary, sharded_files, write_whole

DONE_SUFFIX, ERROR_SUFFIX = ".done", ".error"
DELAY_ENV = "INFINI_TRAIN_ASYNC_SAVE_DELAY"  # a test hook: "S" or "S@STEP", seconds a writer sleeps before it writes


def hook_delay(step):
    """The seconds INFINI_TRAIN_ASYNC_SAVE_DELAY asks the writer of ``step`` to wait (0 when unset or another step)."""
    spec = os.environ.get(DELAY_ENV, "").strip()
    if not spec:
        return 0.0
    seconds, _, at = spec.partition("@")
    try:
        seconds, at = float(seconds), int(at) if at else None
    except ValueError:
        raise ValueError(f"{DELAY_ENV}: expected seconds, or seconds@step (a test hook), got {spec!r}\n"
                         f"HINT: unset {DELAY_ENV}") from None
    return seconds if at is None or at == step else 0.0


def staged_copy(array, buffer=None):
    """A host copy of ``array`` that training can no longer change, in ``buffer`` when that is a host array of its
    shape and dtype (the previous save's: reused, so a save after the first neither allocates nor faults in new
    pages), else in new memory: pinned host memory for a GPU array whose dtype cupy knows, C-ordered for a host
    array."""
    reuse = buffer is not None and buffer.shape == array.shape and buffer.dtype == array.dtype
    if backend.is_cupy_array(array):
        cp = backend.cupy_module()
        try:
            host = buffer if reuse else np.frombuffer(cp.cuda.alloc_pinned_memory(max(array.nbytes, 1)),
                                                      np.dtype(array.dtype), array.size).reshape(array.shape)
            cp.asnumpy(cp.ascontiguousarray(array), out=host)
            return host
        except (TypeError, ValueError):  # a dtype cupy keeps as raw words (bfloat16): the backend's own copy
            return backend.to_device_array(array, backend.CPU).copy()
    if reuse:
        np.copyto(buffer, array)
        return buffer
    return np.array(array, copy=True, order="C")


def staged_bytes(arrays):
    return sum(int(a.nbytes) for a in arrays)


def marker(directory, rank, suffix):
    return os.path.join(directory, f"shard{rank:05d}{suffix}")


def write_marker(directory, rank, described=None, error=None):
    """This rank's writer is done: ``described`` (file name, bytes, SHA-256, or None for no file), or failed with
    ``error`` (text)."""
    if error is not None:
        write_text_atomically(marker(directory, rank, ERROR_SUFFIX), error)
    else:
        write_text_atomically(marker(directory, rank, DONE_SUFFIX), json.dumps(described))


def collect_markers(directory, world, timeout=None, poll=0.01):
    """Every rank's ``write_marker`` result, in rank order (rank 0's writer, after its own): waits for the markers,
    raises on a rank's error marker, or when some have not come within ``timeout`` seconds (default: the collective
    timeout). The markers are removed: the finished directory holds only the checkpoint's files."""
    timeout = resolve_timeout() if timeout is None else timeout
    deadline = time.monotonic() + timeout
    results = [None] * world
    pending = set(range(world))
    while pending:
        for rank in sorted(pending):
            failed = marker(directory, rank, ERROR_SUFFIX)
            if os.path.exists(failed):
                with open(failed) as f:
                    raise RuntimeError(f"asynchronous checkpoint {directory}: rank {rank}'s writer failed: {f.read()}")
            done = marker(directory, rank, DONE_SUFFIX)
            if os.path.exists(done):
                with open(done) as f:
                    described = json.load(f)
                results[rank] = tuple(described) if described is not None else None
                pending.discard(rank)
        if pending and time.monotonic() > deadline:
            raise RuntimeError(f"asynchronous checkpoint {directory}: ranks {sorted(pending)} did not finish writing "
                               f"their shards within {timeout:g} s\nHINT: a slow or full disk on their hosts? "
                               "INFINI_TRAIN_COLLECTIVE_TIMEOUT sets the wait")
        if pending:
            time.sleep(poll)
    for rank in range(world):
        os.remove(marker(directory, rank, DONE_SUFFIX))
    return results


def _lower_priority():
    """Give this (writer) thread a lower scheduling priority than training's: on Linux the nice value is per
    thread, so the writer takes what the training threads leave of the cores."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10))
    except (AttributeError, OSError):  # not Linux, or not permitted: the writer runs at the process's priority
        pass


class AsyncSaver:
    """One background writer per rank: ``start(step, job, staged)`` runs ``job()`` on a thread (after waiting for the
    previous one), ``wait()`` joins it and raises its error, ``check()`` raises a finished writer's error without
    waiting (one attribute test per step when none failed)."""

    def __init__(self):
        self.thread = None
        self.error = None
        self.step = None
        self.staged = 0  # bytes staged by the last save
        self.buffers = {}  # its staging buffers, {entry key: host array}, reused by the next save

    def start(self, step, job, staged):
        self.wait()
        self.step, self.staged = step, staged
        delay = hook_delay(step)

        def run():
            try:
                _lower_priority()
                time.sleep(delay)
                job()
            except BaseException as exc:  # kept for the main thread: check() / wait() raise it there
                self.error = exc

        self.thread = threading.Thread(target=run, name=f"checkpoint-writer-{step}", daemon=True)
        self.thread.start()

    def busy(self):
        return self.thread is not None and self.thread.is_alive()

    def check(self):
        if self.error is not None:
            self._raise()

    def wait(self):
        """Block until the save in flight is written (and, on rank 0, committed); raise its error."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        self.check()

    def _raise(self):
        error, self.error = self.error, None
        raise RuntimeError(f"asynchronous checkpoint of step {self.step} failed: {type(error).__name__}: "
                           f"{error}") from error


def start_sharded(saver, out_dir, step, entries, record, group, keep_last=None, run_id=None):
    """Stage this rank's part of a sharded checkpoint of ``entries`` and start writing it (as writer.write_sharded
    writes, file for file); collective at the boundary. Returns the step directory it will have (rank 0), None
    elsewhere."""
    tmp = make_temporary(out_dir, step, group)
    plan = dcp.plan_save(entries, group)
    staged = {key: staged_copy(view, saver.buffers.get(key)) for key, view in plan.mine.items()}
    saver.buffers = staged  # kept for the next save (one in flight: it waits for this one first)
    rank, world = group.rank, group.size

    def job():
        try:
            described = dcp.write_shard(tmp, rank, staged)
        except BaseException as exc:
            write_marker(tmp, rank, error=f"{type(exc).__name__}: {exc}")
            raise
        write_marker(tmp, rank, described)
        if rank != 0:
            return
        try:
            metadata = plan.metadata(collect_markers(tmp, world))
            dcp.write_metadata(tmp, metadata)
            commit(out_dir, step, tmp, sharded_files(tmp, metadata), record, keep_last, run_id, fmt=SHARDED)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    saver.start(step, job, staged_bytes(staged.values()))
    return step_dir(out_dir, step) if rank == 0 else None


def start_whole(saver, out_dir, step, files, infos, arrays, record, keep_last=None, run_id=None):
    """Start writing rank 0's gathered whole-format ``arrays`` (writer.write_whole's files): the gather assembled them
    in host memory of their own (the saver's buffers, reused), which is their staging. Returns the step directory it
    will have."""
    saver.buffers = arrays
    saver.start(step, lambda: write_whole(out_dir, step, files, infos, arrays.__getitem__, record, keep_last, run_id),
                staged_bytes(arrays.values()))
    return step_dir(out_dir, step)


__all__ = ["AsyncSaver", "start_sharded", "start_whole", "staged_copy", "staged_bytes", "write_marker",
           "collect_markers", "DELAY_ENV"]
