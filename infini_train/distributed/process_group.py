"""ProcessGroup, Work and ReduceOp, with the MPI backend (mpi4py on host arrays).

Collectives work in place on a Tensor's array, as torch.distributed does, and bump its version counter.
Every call is non-blocking underneath (MPI I* calls) and returns a Work; a sync call is the async call
plus ``wait()``, so both get the collective timeout, which turns a hang into an error naming the
collective and the ranks.
"""
from __future__ import annotations

import enum
import os
import time

import numpy as np

DEFAULT_TIMEOUT = float(os.environ.get("INFINI_TRAIN_COLLECTIVE_TIMEOUT", "300"))


class ReduceOp(enum.Enum):
    SUM = "sum"
    AVG = "avg"
    MAX = "max"
    MIN = "min"
    PRODUCT = "product"

    @classmethod
    def parse(cls, op):
        if isinstance(op, cls):
            return op
        try:
            return cls(str(op).lower())
        except ValueError:
            raise ValueError(f"ReduceOp: expected one of {[o.value for o in cls]}, got {op!r}") from None


class Work:
    """Handle of an asynchronous collective: ``wait()`` blocks (up to the timeout), ``is_completed()`` polls."""

    def __init__(self, test, finish=None, describe="collective", timeout=DEFAULT_TIMEOUT):
        self._test = test  # returns True once the operation completed
        self._finish = finish  # runs once after completion (copy back, divide for AVG)
        self._done = False
        self.describe = describe
        self.timeout = timeout

    def is_completed(self):
        if not self._done and self._test():
            self._complete()
        return self._done

    def _complete(self):
        self._done = True
        if self._finish is not None:
            self._finish()

    def wait(self, timeout=None):
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        sleep = 0.0
        while not self.is_completed():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.describe} did not complete within {timeout:.0f} s\n"
                                   "HINT: a peer rank may have died or skipped this collective; raise the limit "
                                   "with init_process_group(timeout=...) or INFINI_TRAIN_COLLECTIVE_TIMEOUT")
            time.sleep(sleep)
            sleep = min(sleep * 2 + 1e-5, 1e-3)
        return True


class CompletedWork(Work):
    def __init__(self, finish=None):
        super().__init__(lambda: True, finish)
        self.is_completed()


class ProcessGroup:
    """A set of ranks and the collectives among them. Subclasses implement the ``_i*`` primitives."""

    backend = "base"

    def __init__(self, ranks, rank, timeout=DEFAULT_TIMEOUT):
        self.ranks = list(ranks)  # global ranks in this group
        self.rank = rank  # this process's rank inside the group
        self.size = len(self.ranks)
        self.timeout = timeout

    def _work(self, name, test, finish=None):
        what = f"{name} on ranks {self.ranks} (rank {self.rank} of group, backend {self.backend})"
        return Work(test, finish, what, self.timeout)

    @staticmethod
    def _done(work, async_op):
        if async_op:
            return work
        work.wait()
        return None

    @staticmethod
    def _touch(*tensors):
        for t in tensors:
            t._version[0] += 1

    # collectives: thin wrappers doing validation, AVG, and sync/async
    def all_reduce(self, tensor, op=ReduceOp.SUM, async_op=False):
        op = ReduceOp.parse(op)
        self._touch(tensor)
        return self._done(self._iall_reduce(tensor, op), async_op)

    def broadcast(self, tensor, src=0, async_op=False):
        self._check_rank(src, "broadcast src")
        self._touch(tensor)
        return self._done(self._ibroadcast(tensor, src), async_op)

    def all_gather(self, tensor_list, tensor, async_op=False):
        if len(tensor_list) != self.size:
            raise ValueError(f"all_gather: expected a list of {self.size} output tensors, got {len(tensor_list)}")
        self._touch(*tensor_list)
        return self._done(self._iall_gather(tensor_list, tensor), async_op)

    def reduce_scatter(self, output, input_list, op=ReduceOp.SUM, async_op=False):
        if len(input_list) != self.size:
            raise ValueError(f"reduce_scatter: expected {self.size} input tensors, got {len(input_list)}")
        self._touch(output)
        return self._done(self._ireduce_scatter(output, input_list, ReduceOp.parse(op)), async_op)

    def reduce(self, tensor, dst=0, op=ReduceOp.SUM, async_op=False):
        self._check_rank(dst, "reduce dst")
        self._touch(tensor)
        return self._done(self._ireduce(tensor, dst, ReduceOp.parse(op)), async_op)

    def barrier(self, async_op=False):
        return self._done(self._ibarrier(), async_op)

    def send(self, tensor, dst, tag=0):
        self._check_rank(dst, "send dst")
        return self._done(self._isend(tensor, dst, tag), False)

    def recv(self, tensor, src, tag=0):
        self._check_rank(src, "recv src")
        self._touch(tensor)
        return self._done(self._irecv(tensor, src, tag), False)

    def isend(self, tensor, dst, tag=0):
        self._check_rank(dst, "isend dst")
        return self._isend(tensor, dst, tag)

    def irecv(self, tensor, src, tag=0):
        self._check_rank(src, "irecv src")
        self._touch(tensor)
        return self._irecv(tensor, src, tag)

    def _check_rank(self, r, what):
        if not 0 <= r < self.size:
            raise ValueError(f"{what}: expected a rank in [0, {self.size}) of group {self.ranks}, got {r}")


_MPI_OPS = {ReduceOp.SUM: "SUM", ReduceOp.AVG: "SUM", ReduceOp.MAX: "MAX", ReduceOp.MIN: "MIN",
            ReduceOp.PRODUCT: "PROD"}


class _HostBuffer:
    """A contiguous host array for MPI; copies back into the tensor when the operation finished."""

    def __init__(self, tensor, read=True):
        self.tensor = tensor
        arr = tensor.array
        self.on_host = isinstance(arr, np.ndarray) and arr.flags.c_contiguous and arr.dtype.kind in "fiub"
        if self.on_host:
            self.buf = arr
        else:
            host = arr.get() if hasattr(arr, "get") else np.asarray(arr)
            # bfloat16 and friends travel as float32
            self.buf = np.ascontiguousarray(host if host.dtype.kind in "fiub" else host.astype(np.float32))

    def finish(self, scale=None):
        if scale is not None:
            self.buf /= scale
        if not self.on_host:
            arr = self.tensor.array
            value = self.buf.astype(arr.dtype) if self.buf.dtype != arr.dtype else self.buf
            if hasattr(arr, "set"):
                arr.set(value)
            else:
                arr[...] = value


class MPIProcessGroup(ProcessGroup):
    backend = "mpi"

    def __init__(self, comm, ranks, timeout=DEFAULT_TIMEOUT):
        super().__init__(ranks, comm.Get_rank(), timeout)
        self.comm = comm
        from mpi4py import MPI
        self.MPI = MPI

    def _op(self, op):
        return getattr(self.MPI, _MPI_OPS[op])

    def _finisher(self, bufs, scale=None):
        def finish():
            for b in bufs:
                b.finish(scale)
        return finish

    def _iall_reduce(self, tensor, op):
        b = _HostBuffer(tensor)
        req = self.comm.Iallreduce(self.MPI.IN_PLACE, b.buf, op=self._op(op))
        scale = self.size if op is ReduceOp.AVG else None
        if scale is not None and b.buf.dtype.kind in "iub":
            raise ValueError("all_reduce: ReduceOp.AVG needs a floating tensor")
        return self._work("all_reduce", req.Test, self._finisher([b], scale))

    def _ibroadcast(self, tensor, src):
        b = _HostBuffer(tensor)
        req = self.comm.Ibcast(b.buf, root=src)
        return self._work("broadcast", req.Test, self._finisher([b]))

    def _iall_gather(self, tensor_list, tensor):
        src = _HostBuffer(tensor)
        out = np.empty((self.size,) + src.buf.shape, src.buf.dtype)
        req = self.comm.Iallgather(src.buf, out)

        def finish():
            for t, part in zip(tensor_list, out):
                b = _HostBuffer(t)
                b.buf[...] = part
                b.finish()
        return self._work("all_gather", req.Test, finish)

    def _ireduce_scatter(self, output, input_list, op):
        bufs = [_HostBuffer(t) for t in input_list]
        send = np.ascontiguousarray(np.stack([b.buf for b in bufs]))
        out = _HostBuffer(output)
        req = self.comm.Ireduce_scatter_block(send, out.buf, op=self._op(op))
        return self._work("reduce_scatter", req.Test, self._finisher([out], self.size if op is ReduceOp.AVG else None))

    def _ireduce(self, tensor, dst, op):
        b = _HostBuffer(tensor)
        if self.rank == dst:
            req = self.comm.Ireduce(self.MPI.IN_PLACE, b.buf, op=self._op(op), root=dst)
            finish = self._finisher([b], self.size if op is ReduceOp.AVG else None)
        else:
            req = self.comm.Ireduce(b.buf, None, op=self._op(op), root=dst)
            finish = None
        return self._work("reduce", req.Test, finish)

    def _ibarrier(self):
        return self._work("barrier", self.comm.Ibarrier().Test)

    def _isend(self, tensor, dst, tag):
        b = _HostBuffer(tensor)
        req = self.comm.Isend(b.buf, dest=dst, tag=tag)
        return self._work(f"send to {dst}", req.Test)

    def _irecv(self, tensor, src, tag):
        b = _HostBuffer(tensor)
        req = self.comm.Irecv(b.buf, source=src, tag=tag)
        return self._work(f"recv from {src}", req.Test, self._finisher([b]))


class SingleProcessGroup(ProcessGroup):
    """The world of one process (plain ``python script.py``): every collective is the identity."""

    backend = "single"

    def __init__(self, timeout=DEFAULT_TIMEOUT):
        super().__init__([0], 0, timeout)

    def _iall_reduce(self, tensor, op):
        return CompletedWork()

    def _ibroadcast(self, tensor, src):
        return CompletedWork()

    def _iall_gather(self, tensor_list, tensor):
        return CompletedWork(lambda: tensor_list[0].array.__setitem__(Ellipsis, tensor.array))

    def _ireduce_scatter(self, output, input_list, op):
        return CompletedWork(lambda: output.array.__setitem__(Ellipsis, input_list[0].array))

    def _ireduce(self, tensor, dst, op):
        return CompletedWork()

    def _ibarrier(self):
        return CompletedWork()

    def _isend(self, tensor, dst, tag):
        raise RuntimeError("send: a world of one process has no peer to send to")

    def _irecv(self, tensor, src, tag):
        raise RuntimeError("recv: a world of one process has no peer to receive from")
