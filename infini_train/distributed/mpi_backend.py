"""MPI backend: mpi4py's non-blocking collectives (Iallreduce, Ibcast, ...) on host arrays.

Arrays travel through the buffer interface (uppercase mpi4py methods), never pickled. A C-contiguous numpy
array of a dtype MPI reduces is used as is, so the common case (float32 gradients) copies nothing; other
arrays are staged in a host buffer and copied back once the operation completed:

- cupy arrays: copied to the host and back (``cupy.ndarray.get``/``set``);
- strided views: a contiguous copy, written back into the view;
- float16/bfloat16 (and other dtypes MPI cannot reduce): reduced in float32, rounded once at the end.

Operations that do not compute (broadcast, all_gather, send/recv) move raw bytes (MPI.BYTE), which is exact
for every dtype. Booleans reduce with logical or (SUM, MAX) and logical and (PRODUCT, MIN).

The flat collectives take contiguous buffers, so host arrays travel as they are: ``all_gather_into_tensor``
is one Iallgather into the output (MPI.IN_PLACE when the input is this rank's chunk of it) and
``reduce_scatter_tensor`` one Ireduce_scatter_block (in place, the input is copied first: MPI may not read
the memory it writes).

``all_to_all_single`` is one Ialltoallv with counts and displacements in elements (an MPI type of the dtype's
size in bytes, so every dtype moves exactly); a cupy or strided input is staged in a host copy and the output
received into a host buffer and copied back, as for the other collectives.
"""
from __future__ import annotations

import numpy as np

from .process_group import ProcessGroup, ReduceOp
from .work import Work

_MPI_OPS = {ReduceOp.SUM: "SUM", ReduceOp.AVG: "SUM", ReduceOp.MAX: "MAX", ReduceOp.MIN: "MIN",
            ReduceOp.PRODUCT: "PROD"}
_BOOL_OPS = {ReduceOp.SUM: "LOR", ReduceOp.MAX: "LOR", ReduceOp.MIN: "LAND", ReduceOp.PRODUCT: "LAND"}


_NATIVE = {}  # dtype -> whether MPI reduces it natively


def _mpi_reduces(dtype):
    """Whether MPI reduces this dtype natively (float16/bfloat16 go through float32 instead)."""
    native = _NATIVE.get(dtype)
    if native is None:
        native = _NATIVE[dtype] = dtype.isnative and (dtype.kind in "iucb" or dtype.char in "fdg")
    return native


def _to_host(arr):
    return arr if isinstance(arr, np.ndarray) else arr.get()  # cupy: device -> host, after the current stream


def _assign(target, host):
    """Write the host array ``host`` into ``target`` (numpy or cupy, any strides), casting to its dtype."""
    if isinstance(target, np.ndarray):
        target[...] = host
        return
    if host.dtype != target.dtype:
        host = host.astype(target.dtype)
    if target.flags.c_contiguous:
        target.set(np.ascontiguousarray(host))
    else:
        import cupy

        with target.device:
            target[...] = cupy.asarray(host)


class _Staged:
    """A host buffer MPI can use for ``target``: ``target`` itself when possible, else a host copy that
    ``write_back`` copies into ``target`` after the operation. ``read=False`` skips copying the current
    contents in (receive-only buffers)."""

    __slots__ = ("target", "host", "copied")

    def __init__(self, target, reduce, read=True):
        host = target
        if reduce and not _mpi_reduces(target.dtype):
            host = _to_host(target).astype(np.float32) if read else np.empty(target.shape, np.float32)
        elif not (isinstance(target, np.ndarray) and target.flags.c_contiguous):
            host = np.ascontiguousarray(_to_host(target)) if read else np.empty(target.shape, target.dtype)
        self.target = target
        self.host = host
        self.copied = host is not target

    def raw(self, MPI):
        """The buffer as raw bytes, for operations that move data without computing."""
        return [self.host.reshape(-1).view(np.uint8), MPI.BYTE]

    def write_back(self, scale=None):
        if scale is not None:
            np.divide(self.host, scale, out=self.host)
        if self.copied:
            _assign(self.target, self.host)


class MPIProcessGroup(ProcessGroup):
    """A process group over an MPI communicator (``comm``'s ranks are the group ranks)."""

    backend = "mpi"

    def __init__(self, comm, ranks, timeout, owns_comm=False):
        from mpi4py import MPI

        super().__init__(ranks, comm.Get_rank(), timeout)
        if comm.Get_size() != len(self.ranks):
            raise ValueError(f"MPIProcessGroup: expected a communicator of {len(self.ranks)} ranks, got "
                             f"{comm.Get_size()}")
        self.comm = comm
        self.MPI = MPI
        self._owns_comm = owns_comm  # sub-communicators are freed by destroy(); COMM_WORLD never
        self._ops = {op: getattr(MPI, name) for op, name in _MPI_OPS.items()}
        self._bool_ops = {op: getattr(MPI, name) for op, name in _BOOL_OPS.items()}
        self._element_types = {}  # itemsize -> a committed MPI type of that many bytes (all_to_all_single)

    def destroy(self):
        if self._owns_comm and self.comm != self.MPI.COMM_NULL:
            self.comm.Free()
        self._owns_comm = False
        if not self.MPI.Is_finalized():
            for datatype in self._element_types.values():
                datatype.Free()
        self._element_types.clear()

    def _element_type(self, itemsize):
        """An MPI type of ``itemsize`` raw bytes: counts in elements for any dtype (bfloat16 included)."""
        datatype = self._element_types.get(itemsize)
        if datatype is None:
            datatype = self._element_types[itemsize] = self.MPI.BYTE.Create_contiguous(itemsize).Commit()
        return datatype

    def _start(self, name, start, finish=None, keep=None):
        """Start a non-blocking MPI operation; its Work tests the request and runs ``finish`` when done."""
        try:
            request = start()
        except self.MPI.Exception as exc:
            raise RuntimeError(f"{self.describe(name)} failed to start: {exc}") from exc
        return Work(self, name, request.Test, finish, (request, keep))

    def _mpi_op(self, op, dtype):
        return (self._bool_ops if dtype.kind == "b" else self._ops)[op]

    @staticmethod
    def _finisher(buf, scale=None):
        if scale is None and not buf.copied:
            return None
        return lambda: buf.write_back(scale)

    def _all_reduce(self, arr, op):
        if (type(arr) is np.ndarray and op is not ReduceOp.AVG and arr.flags.c_contiguous and _mpi_reduces(arr.dtype)
                and arr.dtype.kind != "b"):
            # the common case (a float32 gradient bucket, a loss scalar): no staging, no copy back
            try:
                request = self.comm.Iallreduce(self.MPI.IN_PLACE, arr, self._ops[op])
            except self.MPI.Exception as exc:
                raise RuntimeError(f"{self.describe('all_reduce')} failed to start: {exc}") from exc
            return Work(self, "all_reduce", request.Test, None, request)
        buf = _Staged(arr, reduce=True)
        mpi_op = self._mpi_op(op, buf.host.dtype)
        scale = self.size if op is ReduceOp.AVG else None
        return self._start("all_reduce", lambda: self.comm.Iallreduce(self.MPI.IN_PLACE, buf.host, mpi_op),
                           self._finisher(buf, scale), buf)

    def _broadcast(self, arr, src):
        buf = _Staged(arr, reduce=False, read=self.rank == src)
        finish = self._finisher(buf) if self.rank != src else None
        return self._start("broadcast", lambda: self.comm.Ibcast(buf.raw(self.MPI), root=src), finish, buf)

    def _all_gather(self, outs, arr):
        src = _Staged(arr, reduce=False)
        gathered = np.empty((self.size, arr.nbytes), np.uint8)

        def finish():
            for out, row in zip(outs, gathered):
                _assign(out, row.view(arr.dtype).reshape(arr.shape))

        return self._start("all_gather", lambda: self.comm.Iallgather(src.raw(self.MPI), [gathered, self.MPI.BYTE]),
                           finish, (src, gathered))

    def _reduce_scatter(self, out, ins, op):
        recv = _Staged(out, reduce=True, read=False)
        stacked = np.empty((self.size,) + tuple(out.shape), recv.host.dtype)
        for row, a in zip(stacked, ins):
            row[...] = _to_host(a)
        mpi_op = self._mpi_op(op, stacked.dtype)
        scale = self.size if op is ReduceOp.AVG else None
        return self._start("reduce_scatter", lambda: self.comm.Ireduce_scatter_block(stacked, recv.host, mpi_op),
                           self._finisher(recv, scale), (recv, stacked))

    def _all_gather_into_tensor(self, out, arr, in_place):
        recv = _Staged(out, reduce=False, read=False)
        send = None
        if in_place:
            if recv.copied:  # a cupy output: this rank's chunk goes out from its host copy
                recv.host[self.rank * arr.size:(self.rank + 1) * arr.size] = _to_host(arr)
            sendbuf = self.MPI.IN_PLACE
        else:
            send = _Staged(arr, reduce=False)
            sendbuf = send.raw(self.MPI)
        return self._start("all_gather_into_tensor", lambda: self.comm.Iallgather(sendbuf, recv.raw(self.MPI)),
                           self._finisher(recv), (recv, send))

    def _reduce_scatter_tensor(self, out, arr, op, in_place):
        recv = _Staged(out, reduce=True, read=False)
        send = _Staged(arr, reduce=True)
        sendbuf = arr.copy() if in_place and not send.copied else send.host  # never read what MPI writes
        mpi_op = self._mpi_op(op, recv.host.dtype)
        scale = self.size if op is ReduceOp.AVG else None
        return self._start("reduce_scatter_tensor",
                           lambda: self.comm.Ireduce_scatter_block(sendbuf, recv.host, mpi_op),
                           self._finisher(recv, scale), (recv, send, sendbuf))

    def _all_to_all_single(self, out, arr, out_splits, in_splits):
        send = _Staged(arr, reduce=False)
        recv = _Staged(out, reduce=False, read=False)
        row = int(np.prod(arr.shape[1:], dtype=np.int64))  # elements per row
        datatype = self._element_type(arr.itemsize)
        send_spec = [send.host.reshape(-1).view(np.uint8), _counts_and_displacements(in_splits, row), datatype]
        recv_spec = [recv.host.reshape(-1).view(np.uint8), _counts_and_displacements(out_splits, row), datatype]
        return self._start("all_to_all_single", lambda: self.comm.Ialltoallv(send_spec, recv_spec),
                           self._finisher(recv), (send, recv))

    def _reduce(self, arr, dst, op):
        buf = _Staged(arr, reduce=True)
        mpi_op = self._mpi_op(op, buf.host.dtype)
        if self.rank != dst:
            return self._start("reduce", lambda: self.comm.Ireduce(buf.host, None, mpi_op, root=dst), None, buf)
        scale = self.size if op is ReduceOp.AVG else None
        return self._start("reduce", lambda: self.comm.Ireduce(self.MPI.IN_PLACE, buf.host, mpi_op, root=dst),
                           self._finisher(buf, scale), buf)

    def _barrier(self):
        return self._start("barrier", self.comm.Ibarrier)

    def _send(self, arr, dst, tag):
        buf = _Staged(arr, reduce=False)
        return self._start(f"send to {dst}", lambda: self.comm.Isend(buf.raw(self.MPI), dest=dst, tag=tag),
                           None, buf)

    def _recv(self, arr, src, tag):
        buf = _Staged(arr, reduce=False, read=False)
        return self._start(f"recv from {src}", lambda: self.comm.Irecv(buf.raw(self.MPI), source=src, tag=tag),
                           self._finisher(buf), buf)


def _counts_and_displacements(splits, row):
    """MPI's (counts, displacements) in elements for blocks of ``splits`` rows of ``row`` elements each."""
    counts = [n * row for n in splits]
    displacements = [0] * len(counts)
    for j in range(1, len(counts)):
        displacements[j] = displacements[j - 1] + counts[j - 1]
    return counts, displacements


__all__ = ["MPIProcessGroup"]
