"""NCCL backend: one NcclCommunicator per group (the unique id made on the group's first rank and sent over
MPI), its own non-blocking CUDA stream, and Work backed by a CUDA event recorded after each operation."""
from __future__ import annotations

from .process_group import ProcessGroup, ReduceOp, Work


def _nccl():
    from cupy.cuda import nccl
    return nccl


def _dtype(arr):
    nccl = _nccl()
    table = {"float32": nccl.NCCL_FLOAT32, "float64": nccl.NCCL_FLOAT64, "float16": nccl.NCCL_FLOAT16,
             "int32": nccl.NCCL_INT32, "int64": nccl.NCCL_INT64, "uint8": nccl.NCCL_UINT8, "int8": nccl.NCCL_INT8}
    if hasattr(nccl, "NCCL_BFLOAT16"):
        table["bfloat16"] = nccl.NCCL_BFLOAT16
    try:
        return table[arr.dtype.name]
    except KeyError:
        raise TypeError(f"nccl: unsupported dtype {arr.dtype}") from None


def _op(op):
    nccl = _nccl()
    return {ReduceOp.SUM: nccl.NCCL_SUM, ReduceOp.PRODUCT: nccl.NCCL_PROD, ReduceOp.MAX: nccl.NCCL_MAX,
            ReduceOp.MIN: nccl.NCCL_MIN, ReduceOp.AVG: getattr(nccl, "NCCL_AVG", nccl.NCCL_SUM)}[op]


class NCCLProcessGroup(ProcessGroup):
    backend = "nccl"

    def __init__(self, mpi_comm, ranks, device_index, timeout):
        super().__init__(ranks, mpi_comm.Get_rank(), timeout)
        import cupy
        self.cp = cupy
        nccl = _nccl()
        uid = nccl.get_unique_id() if self.rank == 0 else None
        uid = mpi_comm.bcast(uid, root=0)
        self.device = cupy.cuda.Device(device_index)
        with self.device:
            self.comm = nccl.NcclCommunicator(self.size, uid, self.rank)
            self.stream = cupy.cuda.Stream(non_blocking=True)
        self._native_avg = hasattr(nccl, "NCCL_AVG")

    def _launch(self, name, fn, finish=None):
        cp = self.cp
        with self.device:
            ready = cp.cuda.Event()
            ready.record(cp.cuda.get_current_stream())
            self.stream.wait_event(ready)  # the comm stream waits for the producer of the data
            fn(self.stream.ptr)
            done = cp.cuda.Event(disable_timing=True)
            done.record(self.stream)

        def complete():
            cp.cuda.get_current_stream().wait_event(done)
            if finish is not None:
                finish()

        return self._work(name, lambda: done.done, complete)

    def _iall_reduce(self, tensor, op):
        a = tensor.array
        nccl_op = _op(op)
        scale = self.size if op is ReduceOp.AVG and not self._native_avg else None
        finish = (lambda: a.__itruediv__(scale)) if scale else None
        return self._launch("all_reduce", lambda s: self.comm.allReduce(a.data.ptr, a.data.ptr, a.size, _dtype(a),
                                                                         nccl_op, s), finish)

    def _ibroadcast(self, tensor, src):
        a = tensor.array
        return self._launch("broadcast", lambda s: self.comm.bcast(a.data.ptr, a.size, _dtype(a), src, s))

    def _iall_gather(self, tensor_list, tensor):
        a = tensor.array
        out = self.cp.empty((self.size,) + a.shape, a.dtype)

        def finish():
            for t, part in zip(tensor_list, out):
                t.array[...] = part
        return self._launch("all_gather", lambda s: self.comm.allGather(a.data.ptr, out.data.ptr, a.size,
                                                                         _dtype(a), s), finish)

    def _ireduce_scatter(self, output, input_list, op):
        send = self.cp.ascontiguousarray(self.cp.stack([t.array for t in input_list]))
        out = output.array
        scale = self.size if op is ReduceOp.AVG and not self._native_avg else None
        finish = (lambda: out.__itruediv__(scale)) if scale else None
        return self._launch("reduce_scatter", lambda s: self.comm.reduceScatter(
            send.data.ptr, out.data.ptr, out.size, _dtype(out), _op(op), s), finish)

    def _ireduce(self, tensor, dst, op):
        a = tensor.array
        scale = self.size if op is ReduceOp.AVG and not self._native_avg and self.rank == dst else None
        finish = (lambda: a.__itruediv__(scale)) if scale else None
        return self._launch("reduce", lambda s: self.comm.reduce(a.data.ptr, a.data.ptr, a.size, _dtype(a), _op(op),
                                                                 dst, s), finish)

    def _ibarrier(self):
        flag = self.cp.zeros(1, self.cp.float32)
        return self._launch("barrier", lambda s: self.comm.allReduce(flag.data.ptr, flag.data.ptr, 1, _dtype(flag),
                                                                      _op(ReduceOp.SUM), s))

    def _isend(self, tensor, dst, tag):
        a = tensor.array
        return self._launch(f"send to {dst}", lambda s: self.comm.send(a.data.ptr, a.size, _dtype(a), dst, s))

    def _irecv(self, tensor, src, tag):
        a = tensor.array
        return self._launch(f"recv from {src}", lambda s: self.comm.recv(a.data.ptr, a.size, _dtype(a), src, s))


__all__ = ["NCCLProcessGroup", "Work"]
