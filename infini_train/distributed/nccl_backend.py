"""NCCL backend: cupy's NcclCommunicator, one per group, on the group's own non-blocking CUDA stream.

The NCCL unique id is made on the group's first rank and broadcast over the group's MPI communicator. An
operation first makes the comm stream wait for the work already queued on the caller's current stream
(which produced the data), runs on the comm stream, and records a CUDA event there; its Work is done when
that event is. ``wait()`` makes the caller's current stream wait for the event (so later kernels see the
result), and, by default, also waits on the host with the collective timeout so that a hang becomes an
error (INFINI_TRAIN_NCCL_BLOCKING_WAIT=0 keeps waits stream-only, without timeout, like torch's default).

The flat collectives run on the caller's contiguous buffers directly; their in-place forms (the input is this
rank's chunk of the output, or the output this rank's chunk of the input) are NCCL's own in-place calls
(sendbuff == recvbuff + rank * count, recvbuff == sendbuff + rank * count): one code path for both.

NCCL has no alltoallv: ``all_to_all_single`` is, as in torch, one ncclSend and one ncclRecv per peer (empty blocks
skipped) inside ncclGroupStart/End, on byte offsets into the contiguous input and output.

Host (numpy) tensors and barriers go through the group's MPI communicator, so a training script may
all-reduce a host scalar on an NCCL group. NCCL has no message tags: send/recv pair up in call order.
"""
from __future__ import annotations

import os

import numpy as np

from .mpi_backend import MPIProcessGroup
from .process_group import ProcessGroup, ReduceOp, _observed, is_floating
from .work import Launch, Work

BLOCKING_WAIT_ENV = "INFINI_TRAIN_NCCL_BLOCKING_WAIT"
_UNIQUE_ID_BYTES = 128  # sizeof(ncclUniqueId)
_ASYNC_ERROR_CHECK_EVERY = 256  # polls between ncclCommGetAsyncError calls while waiting


def _nccl():
    from cupy.cuda import nccl

    return nccl


def _reduce_dtypes(nccl, version):
    table = {"float16": nccl.NCCL_FLOAT16, "float32": nccl.NCCL_FLOAT32, "float64": nccl.NCCL_FLOAT64,
             "int8": nccl.NCCL_INT8, "uint8": nccl.NCCL_UINT8, "int32": nccl.NCCL_INT32,
             "uint32": nccl.NCCL_UINT32, "int64": nccl.NCCL_INT64, "uint64": nccl.NCCL_UINT64}
    if version >= 21000 and hasattr(nccl, "NCCL_BFLOAT16"):
        table["bfloat16"] = nccl.NCCL_BFLOAT16
    return table


def _unique_id_bytes(uid):
    """An ncclUniqueId as int8s: cupy 14 hands it out as bytes, earlier cupy as a tuple of ints."""
    return np.frombuffer(uid, np.int8) if isinstance(uid, (bytes, bytearray)) else np.array(uid, np.int8)


def _as_unique_id(cupy, uid):
    """The broadcast int8s in the form this cupy's NcclCommunicator takes: the form its get_unique_id returns."""
    return uid.tobytes() if int(cupy.__version__.split(".")[0]) >= 14 else tuple(int(b) for b in uid)


class _NCCLWork(Work):
    """Work backed by a CUDA event recorded on the group's comm stream."""

    __slots__ = ("_event", "_blocking", "_comm", "_polls", "_stream_waited")

    def __init__(self, group, name, event, finish, keep, blocking):
        super().__init__(group, name, self._event_done, finish, keep, on_timeout=group.abort)
        self._event = event
        self._blocking = blocking
        self._comm = group.comm
        self._polls = 0
        self._stream_waited = False

    def _event_done(self):
        self._polls += 1
        if self._polls % _ASYNC_ERROR_CHECK_EVERY == 0:
            self._comm.check_async_error()  # raises NcclError when a peer failed or the network broke
        return self._event.done

    def wait(self, timeout=None):
        if not self._stream_waited:
            import cupy

            self._stream_waited = True
            cupy.cuda.get_current_stream().wait_event(self._event)  # the caller's later kernels see the result
            if not self._blocking and not self._done:
                self._test = _stream_ordered  # copy-back/division queue behind the event on the current stream
        return super().wait(timeout)


def _stream_ordered():
    return True


class NCCLProcessGroup(ProcessGroup):
    """A process group over NCCL; ``mpi_comm`` holds the same ranks (it bootstraps NCCL and carries host data)."""

    backend = "nccl"

    def __init__(self, mpi_comm, ranks, timeout, owns_comm=False, device=None):
        import cupy

        super().__init__(ranks, mpi_comm.Get_rank(), timeout)
        self.cp = cupy
        self.host = MPIProcessGroup(mpi_comm, ranks, timeout, owns_comm)  # numpy tensors, barrier, bootstrap
        nccl = _nccl()
        self.nccl_version = nccl.get_version()
        self._native_avg = self.nccl_version >= 21000  # ncclAvg appeared in NCCL 2.10
        self._dtypes = _reduce_dtypes(nccl, self.nccl_version)
        self._ops = {ReduceOp.SUM: nccl.NCCL_SUM, ReduceOp.PRODUCT: nccl.NCCL_PROD, ReduceOp.MAX: nccl.NCCL_MAX,
                     ReduceOp.MIN: nccl.NCCL_MIN}
        self._avg = getattr(nccl, "NCCL_AVG", None) if self._native_avg else None
        self._bytes = nccl.NCCL_UINT8
        self.blocking_wait = os.environ.get(BLOCKING_WAIT_ENV, "1") not in ("0", "false", "False", "")
        self.device = cupy.cuda.Device(device) if device is not None else cupy.cuda.Device()

        uid = np.zeros(_UNIQUE_ID_BYTES, np.int8)
        if self.rank == 0:
            uid[:] = _unique_id_bytes(nccl.get_unique_id())
        mpi_comm.Bcast(uid, root=0)
        with self.device:
            self.comm = nccl.NcclCommunicator(self.size, _as_unique_id(cupy, uid), self.rank)
            self.stream = cupy.cuda.Stream(non_blocking=True)

    def destroy(self):
        if self.comm is not None:
            self.comm.destroy()
            self.comm = None
        self.host.destroy()

    def abort(self):
        """Abort the communicator (after a timeout): NCCL kernels stuck waiting for a peer return."""
        if self.comm is not None:
            self.comm.abort()
            self.comm = None

    # ------------------------------------------------------------------------------ plumbing
    def _on_host(self, arr):
        if isinstance(arr, np.ndarray):
            return True
        if arr.device.id != self.device.id:
            raise ValueError(f"nccl: expected a tensor on cuda:{self.device.id} (this rank's GPU), got one on "
                             f"cuda:{arr.device.id}\nHINT: move it with t.to('cuda:{self.device.id}')")
        return False

    def _comm(self, name):
        if self.comm is None:
            raise RuntimeError(f"{self.describe(name)}: the NCCL communicator was destroyed or aborted\n"
                               "HINT: a previous collective timed out or destroy_process_group() was called")
        return self.comm

    def _contiguous(self, arr):
        return arr if arr.flags.c_contiguous else self.cp.ascontiguousarray(arr)

    def _launch(self, name, call, finish=None, keep=None):
        """Run ``call(comm, stream_ptr)`` on the comm stream after the current stream's queued work."""
        cp = self.cp
        comm = self._comm(name)
        with self.device:
            ready = cp.cuda.Event(disable_timing=True)
            ready.record(cp.cuda.get_current_stream())
            self.stream.wait_event(ready)
            call(comm, self.stream.ptr)
            done = cp.cuda.Event(disable_timing=True)
            done.record(self.stream)
        return _NCCLWork(self, name, done, finish, keep, self.blocking_wait)

    def _reduction(self, arr, op, name):
        """(NCCL dtype, NCCL op, array view) for reducing ``arr``; booleans reduce as uint8 max/min."""
        if arr.dtype.kind == "b":
            arr = arr.view(self.cp.uint8)
            op = ReduceOp.MAX if op in (ReduceOp.SUM, ReduceOp.MAX) else ReduceOp.MIN
        dtype = self._dtypes.get(arr.dtype.name)
        if dtype is None:
            raise TypeError(f"{name}: expected a dtype NCCL reduces ({sorted(self._dtypes)}), got {arr.dtype}\n"
                            "HINT: cast the tensor, or use a process group with backend='mpi'")
        if op is ReduceOp.AVG:
            return dtype, (self._avg if self._avg is not None else self._ops[ReduceOp.SUM]), arr
        return dtype, self._ops[op], arr

    def _post(self, target, buf, op):
        """The copy-back (strided targets) and division (AVG without ncclAvg) that follow a reduction."""
        scale = self.size if op is ReduceOp.AVG and self._avg is None and is_floating(target.dtype) else None
        if scale is None and buf is target:
            return None

        def finish():
            with self.device:
                if scale is not None:
                    buf.__itruediv__(scale)
                if buf is not target:
                    target[...] = buf
        return finish

    # ------------------------------------------------------------------------------ collectives
    def _all_reduce(self, arr, op):
        if self._on_host(arr):
            return self.host._all_reduce(arr, op)
        buf = self._contiguous(arr)
        dtype, nccl_op, view = self._reduction(buf, op, "all_reduce")
        return self._launch("all_reduce", lambda c, s: c.allReduce(view.data.ptr, view.data.ptr, view.size, dtype,
                                                                   nccl_op, s), self._post(arr, buf, op), buf)

    def _broadcast(self, arr, src):
        if self._on_host(arr):
            return self.host._broadcast(arr, src)
        buf = self._contiguous(arr)
        return self._launch("broadcast", lambda c, s: c.bcast(buf.data.ptr, buf.nbytes, self._bytes, src, s),
                            self._post(arr, buf, None), buf)

    def _all_gather(self, outs, arr):
        if self._on_host(arr):
            return self.host._all_gather(outs, arr)
        src = self._contiguous(arr)
        with self.device:
            gathered = self.cp.empty((self.size,) + tuple(arr.shape), arr.dtype)

        def finish():
            with self.device:
                for out, part in zip(outs, gathered):
                    out[...] = part
        return self._launch("all_gather", lambda c, s: c.allGather(src.data.ptr, gathered.data.ptr, src.nbytes,
                                                                   self._bytes, s), finish, (src, gathered))

    def _reduce_scatter(self, out, ins, op):
        if self._on_host(out):
            return self.host._reduce_scatter(out, ins, op)
        with self.device:
            stacked = self.cp.stack([self.cp.asarray(a) for a in ins])
        buf = self._contiguous(out)
        dtype, nccl_op, view = self._reduction(buf, op, "reduce_scatter")
        send = stacked.view(view.dtype)
        return self._launch("reduce_scatter", lambda c, s: c.reduceScatter(send.data.ptr, view.data.ptr, view.size,
                                                                           dtype, nccl_op, s),
                            self._post(out, buf, op), (buf, stacked))

    def _all_gather_into_tensor(self, out, arr, in_place):
        if self._on_host(out):
            return self.host._all_gather_into_tensor(out, arr, in_place)
        return self._launch("all_gather_into_tensor", lambda c, s: c.allGather(arr.data.ptr, out.data.ptr, arr.nbytes,
                                                                               self._bytes, s), None, (out, arr))

    def _reduce_scatter_tensor(self, out, arr, op, in_place):
        if self._on_host(out):
            return self.host._reduce_scatter_tensor(out, arr, op, in_place)
        dtype, nccl_op, view = self._reduction(out, op, "reduce_scatter_tensor")
        send = arr.view(view.dtype)
        return self._launch("reduce_scatter_tensor", lambda c, s: c.reduceScatter(send.data.ptr, view.data.ptr,
                                                                                  view.size, dtype, nccl_op, s),
                            self._post(out, out, op), (view, send))

    def _all_to_all_single(self, out, arr, out_splits, in_splits):
        if self._on_host(out):
            return self.host._all_to_all_single(out, arr, out_splits, in_splits)
        send, recv = self._contiguous(arr), self._contiguous(out)
        row = arr.itemsize * int(np.prod(arr.shape[1:], dtype=np.int64))  # bytes per row
        plan = all_to_all_plan(in_splits, out_splits, row)
        nccl = _nccl()

        def call(comm, stream):
            nccl.groupStart()
            try:
                for kind, peer, offset, nbytes in plan:
                    if kind == "send":
                        comm.send(send.data.ptr + offset, nbytes, self._bytes, peer, stream)
                    else:
                        comm.recv(recv.data.ptr + offset, nbytes, self._bytes, peer, stream)
            finally:
                nccl.groupEnd()
        return self._launch("all_to_all_single", call, self._post(out, recv, None), (send, recv))

    def _reduce(self, arr, dst, op):
        if self._on_host(arr):
            return self.host._reduce(arr, dst, op)
        buf = self._contiguous(arr)
        dtype, nccl_op, view = self._reduction(buf, op, "reduce")
        finish = self._post(arr, buf, op) if self.rank == dst else None
        return self._launch("reduce", lambda c, s: c.reduce(view.data.ptr, view.data.ptr, view.size, dtype, nccl_op,
                                                            dst, s), finish, buf)

    def _barrier(self):
        return self.host._barrier()

    def _send(self, arr, dst, tag):
        if self._on_host(arr):
            return self.host._send(arr, dst, tag)
        buf = self._contiguous(arr)
        return self._launch(f"send to {dst}", lambda c, s: c.send(buf.data.ptr, buf.nbytes, self._bytes, dst, s),
                            None, buf)

    @_observed("batch_isend_irecv")
    def batch_isend_irecv(self, ops):
        """Device tensors' sends and receives launched inside one ncclGroupStart/End (so paired transfers between
        two ranks progress together), recorded by one event; host tensors go through MPI."""
        from .process_group import _array_of, _bump

        works, device_ops = [None] * len(ops), []
        for k, (kind, tensor, peer, tag) in enumerate(ops):
            if kind not in ("send", "recv"):
                raise ValueError(f"batch_isend_irecv: expected ops of kind 'send' or 'recv', got {kind!r}")
            arr = _array_of(tensor, kind, writes=kind == "recv")
            self._check_peer(peer, kind, "dst" if kind == "send" else "src")
            if self._on_host(arr):
                works[k] = self.isend(tensor, peer, tag) if kind == "send" else self.irecv(tensor, peer, tag)
            else:
                device_ops.append((k, kind, tensor, arr, self._contiguous(arr), peer))
        if not device_ops:
            return works
        cp, nccl = self.cp, _nccl()
        comm = self._comm("batch_isend_irecv")
        with self.device:
            ready = cp.cuda.Event(disable_timing=True)
            ready.record(cp.cuda.get_current_stream())
            self.stream.wait_event(ready)
            nccl.groupStart()
            try:
                for _, kind, _, _, buf, peer in device_ops:
                    call = comm.send if kind == "send" else comm.recv
                    call(buf.data.ptr, buf.nbytes, self._bytes, peer, self.stream.ptr)
            finally:
                nccl.groupEnd()
            done = cp.cuda.Event(disable_timing=True)
            done.record(self.stream)  # after groupEnd: the group's kernels are enqueued
        for k, kind, tensor, arr, buf, peer in device_ops:
            name = f"{kind} {'to' if kind == 'send' else 'from'} {peer}"
            finish = self._post(arr, buf, None) if kind == "recv" else None
            works[k] = _NCCLWork(self, name, done, finish, buf, self.blocking_wait)
            works[k].launch = self.last_transfer = Launch(name, self, None, buf.nbytes, self.ranks[peer])
            if kind == "recv":
                _bump(tensor)
        return works

    def _recv(self, arr, src, tag):
        if self._on_host(arr):
            return self.host._recv(arr, src, tag)
        buf = self._contiguous(arr)
        return self._launch(f"recv from {src}", lambda c, s: c.recv(buf.data.ptr, buf.nbytes, self._bytes, src, s),
                            self._post(arr, buf, None), buf)


def all_to_all_plan(in_splits, out_splits, row_bytes):
    """all_to_all_single as point-to-point transfers: ``[(kind, peer, byte offset, bytes)]``, for each peer in
    rank order its send (block ``peer`` of the input) then its receive (block ``peer`` of the output); empty
    blocks are left out (as torch's alltoallv over NCCL does)."""
    plan, sent, received = [], 0, 0
    for peer, (n_send, n_recv) in enumerate(zip(in_splits, out_splits)):
        send_bytes, recv_bytes = n_send * row_bytes, n_recv * row_bytes
        if send_bytes:
            plan.append(("send", peer, sent, send_bytes))
        if recv_bytes:
            plan.append(("recv", peer, received, recv_bytes))
        sent += send_bytes
        received += recv_bytes
    return plan


__all__ = ["NCCLProcessGroup", "BLOCKING_WAIT_ENV", "all_to_all_plan"]
