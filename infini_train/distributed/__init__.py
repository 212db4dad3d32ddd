"""Process groups over MPI (mpi4py) and NCCL (cupy), and module-level collectives like torch.distributed.

``init_process_group()`` reads rank and world size from MPI (run under ``mpirun``); a plain
``python script.py`` is a world of size 1 where every collective is the identity.
"""
from __future__ import annotations

import os
import sys
import threading
import traceback

from .process_group import DEFAULT_TIMEOUT, MPIProcessGroup, ProcessGroup, ReduceOp, SingleProcessGroup, Work

__all__ = ["init_process_group", "destroy_process_group", "is_initialized", "get_rank", "get_world_size",
           "get_local_rank", "new_group", "default_group", "ReduceOp", "Work", "ProcessGroup", "all_reduce",
           "broadcast", "all_gather", "reduce_scatter", "reduce", "barrier", "send", "recv", "isend", "irecv"]

_world = None
_local_rank = 0
_backend = None
_timeout = DEFAULT_TIMEOUT


def _mpi():
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    return MPI


def _launched_by_mpi():
    return any(k in os.environ for k in ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK",
                                         "HYDRA_CONTROL_FD", "MPI_LOCALRANKID"))


def _cuda_per_rank(local_rank):
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > local_rank
    except Exception:
        return False


def init_process_group(backend=None, timeout=None):
    """Join the world: rank/world size from MPI, local rank from a shared-memory split (it picks the GPU).
    ``backend`` None picks "nccl" when every rank has a GPU and cupy, else "mpi"."""
    global _world, _local_rank, _backend, _timeout
    if _world is not None:
        return _world
    _timeout = float(timeout) if timeout is not None else DEFAULT_TIMEOUT
    MPI = _mpi()
    if MPI is None:
        if _launched_by_mpi() or backend in ("mpi", "nccl"):
            raise RuntimeError("init_process_group: mpi4py is not installed, so ranks cannot communicate\n"
                               "HINT: pip install -e '.[mpi]'")
        _world, _backend = SingleProcessGroup(_timeout), "single"
        return _world
    comm = MPI.COMM_WORLD
    size = comm.Get_size()
    _local_rank = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_rank() if size > 1 else 0
    if backend in (None, "auto"):
        has_gpu = _cuda_per_rank(_local_rank)
        backend = "nccl" if size > 1 and all(comm.allgather(has_gpu)) else ("mpi" if size > 1 else "single")
    if size > 1:
        install_failure_handler(comm)
    if backend == "nccl":
        import cupy
        cupy.cuda.Device(_local_rank).use()
        from .nccl_backend import NCCLProcessGroup
        _world = NCCLProcessGroup(comm, list(range(size)), _local_rank, _timeout)
    elif backend == "mpi" or size > 1:
        _world = MPIProcessGroup(comm, list(range(size)), _timeout)
    else:
        _world = SingleProcessGroup(_timeout)
    _backend = _world.backend
    return _world


def install_failure_handler(comm):
    """An exception on any rank aborts the whole job (MPI Abort), so every rank exits non-zero promptly."""
    def abort(exc_type, exc, tb):
        rank = comm.Get_rank()
        sys.stderr.write(f"[rank {rank}] uncaught {exc_type.__name__}; aborting the job\n")
        traceback.print_exception(exc_type, exc, tb, file=sys.stderr)
        sys.stderr.flush()
        comm.Abort(1)

    sys.excepthook = abort
    threading.excepthook = lambda args: abort(args.exc_type, args.exc_value, args.exc_traceback)


def destroy_process_group():
    global _world
    _world = None


def is_initialized():
    return _world is not None


def default_group() -> ProcessGroup:
    return _world if _world is not None else init_process_group()


def get_rank(group=None):
    return (group or default_group()).rank


def get_world_size(group=None):
    return (group or default_group()).size


def get_local_rank():
    default_group()
    return _local_rank


def get_backend():
    default_group()
    return _backend


def new_group(ranks):
    """A group of some world ranks; every world rank must call it (MPI communicator creation is collective).
    Ranks outside ``ranks`` get None."""
    world = default_group()
    ranks = sorted(set(int(r) for r in ranks))
    if world.size == 1:
        return world if ranks == [0] else None
    MPI = _mpi()
    member = world.ranks.index(MPI.COMM_WORLD.Get_rank()) in ranks
    sub = MPI.COMM_WORLD.Split(0 if member else MPI.UNDEFINED, ranks.index(MPI.COMM_WORLD.Get_rank())
                               if member else 0)
    if not member:
        return None
    if world.backend == "nccl":
        from .nccl_backend import NCCLProcessGroup
        return NCCLProcessGroup(sub, ranks, _local_rank, _timeout)
    return MPIProcessGroup(sub, ranks, _timeout)


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    return (group or default_group()).all_reduce(tensor, op, async_op)


def broadcast(tensor, src=0, group=None, async_op=False):
    return (group or default_group()).broadcast(tensor, src, async_op)


def all_gather(tensor_list, tensor, group=None, async_op=False):
    return (group or default_group()).all_gather(tensor_list, tensor, async_op)


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op=False):
    return (group or default_group()).reduce_scatter(output, input_list, op, async_op)


def reduce(tensor, dst=0, op=ReduceOp.SUM, group=None, async_op=False):
    return (group or default_group()).reduce(tensor, dst, op, async_op)


def barrier(group=None, async_op=False):
    return (group or default_group()).barrier(async_op)


def send(tensor, dst, group=None, tag=0):
    return (group or default_group()).send(tensor, dst, tag)


def recv(tensor, src, group=None, tag=0):
    return (group or default_group()).recv(tensor, src, tag)


def isend(tensor, dst, group=None, tag=0):
    return (group or default_group()).isend(tensor, dst, tag)


def irecv(tensor, src, group=None, tag=0):
    return (group or default_group()).irecv(tensor, src, tag)
