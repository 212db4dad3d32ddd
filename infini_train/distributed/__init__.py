"""Process groups and collectives, in the style of torch.distributed (``from infini_train import distributed as dist``).

    dist.init_process_group()              # under mpirun -n N (or launch/run.sh); rank/size from MPI
    dist.all_reduce(t, dist.ReduceOp.AVG)  # in place on t.array, on every rank
    work = dist.all_reduce(t, async_op=True); ...; work.wait()
    dist.all_gather_into_tensor(flat, flat[rank * n:(rank + 1) * n])  # flat buffers, in place (ZeRO)
    dist.all_to_all_single(out, inp, output_split_sizes, input_split_sizes)  # rows per rank (expert parallel)

Backends: "mpi" (mpi4py on host arrays; cupy arrays are staged through the host) and "nccl" (cupy's NCCL on
each rank's GPU). ``init_process_group()`` picks NCCL when every rank sees a GPU and cupy, MPI otherwise. A
plain ``python script.py`` is a world of one process ("single" backend) where every collective is the
identity, and calling a collective before ``init_process_group`` initialises the world lazily.

Failures: in a world of more than one rank an uncaught exception on any rank aborts the whole job
(MPI Abort), and a collective that does not complete within the timeout (``init_process_group(timeout=)``
or $INFINI_TRAIN_COLLECTIVE_TIMEOUT, default 300 s) raises an error naming it, the group's ranks and this rank;
after ``set_hang_dir(path)`` (a training run sets out_dir/hang) every rank first writes its Python stacks and pending
collective to ``path/rank<R>.txt`` and the error names the ranks that never arrived (hang.py).
mpi4py is imported lazily: the package imports without it.
"""
from __future__ import annotations

import os

import numpy as np

from .launch_utils import (
    CUDA_HINT,
    MPI_HINT,
    cuda_device_count,
    import_mpi,
    install_abort_on_failure,
    launcher_world_size,
    node_local_rank,
    uninstall_abort_on_failure,
)
from .object_collectives import all_gather_object as _all_gather_object
from .comm_counters import CommCounters, count_communication
from . import hang
from .hang import get_hang_dir, set_hang_dir
from .p2p import P2POp, batch_isend_irecv
from .process_group import ProcessGroup, ReduceOp, SingleProcessGroup
from .work import (DEFAULT_TIMEOUT, TIMEOUT_ENV, CompletedWork, Work, comm_wait_seconds, resolve_timeout,
                   set_oversubscribed)

__all__ = ["init_process_group", "destroy_process_group", "is_initialized", "get_rank", "get_world_size",
           "get_local_rank", "get_local_world_size", "get_backend", "new_group", "default_group", "ReduceOp",
           "Work", "ProcessGroup", "all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_gather_into_tensor",
           "reduce_scatter_tensor", "all_to_all_single", "reduce", "barrier", "all_gather_object", "send", "recv",
           "isend", "irecv", "P2POp", "batch_isend_irecv", "DEFAULT_TIMEOUT", "TIMEOUT_ENV", "count_communication",
           "CommCounters", "set_hang_dir", "get_hang_dir", "comm_wait_seconds"]

_BACKENDS = (None, "auto", "mpi", "nccl", "single")
_world = None  # the default (world) group
_lazy = False  # the world was made by default_group(), not by an explicit init_process_group()
_local_rank, _local_size = 0, 1
_subgroups = []  # groups from new_group(), destroyed with the world


def init_process_group(backend=None, timeout=None) -> ProcessGroup:
    """Join the job's world and return its group. Rank and world size come from MPI (mpirun -n N); the
    local rank (position among the ranks on this node) picks the GPU. ``backend``: None/"auto" (NCCL when
    every rank sees a GPU and cupy, else MPI), "mpi" or "nccl". ``timeout``: collective timeout in seconds
    (default $INFINI_TRAIN_COLLECTIVE_TIMEOUT or 300)."""
    if backend not in _BACKENDS:
        raise ValueError(f"init_process_group: expected backend None, 'mpi' or 'nccl', got {backend!r}")
    if _world is not None:
        if _lazy:
            destroy_process_group()  # made implicitly by an earlier collective: redo with these settings
        elif backend in (None, "auto", _world.backend):
            if timeout is not None:
                _world.timeout = resolve_timeout(timeout)
            return _world
        else:
            raise RuntimeError(f"init_process_group: the world is already initialised with backend "
                               f"{_world.backend!r}, got backend={backend!r}\n"
                               "HINT: call destroy_process_group() first")
    return _init_world(None if backend == "auto" else backend, resolve_timeout(timeout), lazy=False)


def _init_world(backend, seconds, lazy):
    global _world, _lazy, _local_rank, _local_size
    announced = launcher_world_size()
    needs_mpi = backend in ("mpi", "nccl") or (announced or 1) > 1
    MPI = import_mpi(f"init_process_group(backend={backend!r}) in a world of {announced or 1} rank(s)"
                     if needs_mpi else None)
    if MPI is None:  # no mpi4py and no launcher: a world of one
        _world, _lazy = SingleProcessGroup(seconds), lazy
        return _world
    comm = MPI.COMM_WORLD
    size = comm.Get_size()
    if announced is not None and announced != size:
        raise RuntimeError(f"init_process_group: the launcher started {announced} ranks but MPI sees a world of "
                           f"{size}\nHINT: mpi4py was built against another MPI than the mpirun used; start the job "
                           "with the mpirun next to your python (launch/run.sh does) or rebuild mpi4py for yours")
    if backend == "single" and size > 1:
        raise ValueError(f"init_process_group: backend 'single' is a world of one process, got {size} ranks")
    _local_rank, _local_size = node_local_rank(MPI, comm)
    set_oversubscribed(_local_size > len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                       else _local_size > (os.cpu_count() or 1))
    if size > 1:
        install_abort_on_failure(comm)  # from here on, an error on any rank ends the job
    if backend is None:
        backend = "single" if size == 1 else _auto_backend(MPI, comm)
    if backend == "nccl":
        world = _nccl_group(comm, list(range(size)), seconds, owns_comm=False)
    elif backend == "mpi":
        from .mpi_backend import MPIProcessGroup

        world = MPIProcessGroup(comm, list(range(size)), seconds)
    else:
        world = SingleProcessGroup(seconds)
    _world, _lazy = world, lazy
    return world


def _auto_backend(MPI, comm):
    """NCCL when every rank sees a GPU of its own (and cupy), MPI otherwise; all ranks agree."""
    mine = np.array([1 if cuda_device_count() > _local_rank else 0], np.int32)
    comm.Allreduce(MPI.IN_PLACE, mine, op=MPI.MIN)
    return "nccl" if mine[0] else "mpi"


def _nccl_group(comm, ranks, seconds, owns_comm):
    count = cuda_device_count()
    if count == 0:
        raise RuntimeError(f"init_process_group: backend 'nccl' needs cupy and a GPU, but world rank "
                           f"{ranks[comm.Get_rank()]} sees none\n"
                           f"HINT: {CUDA_HINT}")
    if _local_rank >= count:
        raise RuntimeError(f"init_process_group: {_local_size} ranks share this node but it has {count} GPU(s)\n"
                           "HINT: start at most one rank per GPU (mpirun -n <GPUs per node x nodes>)")
    import cupy

    from .nccl_backend import NCCLProcessGroup

    cupy.cuda.Device(_local_rank).use()
    return NCCLProcessGroup(comm, ranks, seconds, owns_comm=owns_comm, device=_local_rank)


def destroy_process_group(group=None):
    """Release ``group``'s communicator; with no argument, every group and the world (hooks restored)."""
    global _world, _lazy
    if group is not None and group is not _world:
        group.destroy()
        if group in _subgroups:
            _subgroups.remove(group)
        return
    for g in reversed(_subgroups):
        g.destroy()
    _subgroups.clear()
    if _world is not None:
        _world.destroy()
    _world, _lazy = None, False
    hang.stop()
    uninstall_abort_on_failure()


def is_initialized() -> bool:
    return _world is not None


def default_group() -> ProcessGroup:
    """The world group, initialised on first use (a world of one without mpirun)."""
    return _world if _world is not None else _init_world(None, resolve_timeout(None), lazy=True)


def get_rank(group=None) -> int:
    return (group or default_group()).rank


def get_world_size(group=None) -> int:
    return (group or default_group()).size


def get_local_rank() -> int:
    """This rank's position among the ranks on its node (it selects the GPU)."""
    default_group()
    return _local_rank


def get_local_world_size() -> int:
    default_group()
    return _local_size


def get_backend(group=None) -> str:
    return (group or default_group()).backend


def new_group(ranks, timeout=None, backend=None):
    """A group of the given world ranks (group rank i is the i-th smallest). Members must all call it; other
    ranks get None. ``backend`` defaults to the world's; ``timeout`` to the world's timeout."""
    world = default_group()
    members = sorted({int(r) for r in ranks})
    if not members or members[0] < 0 or members[-1] >= world.size:
        raise ValueError(f"new_group: expected world ranks in [0, {world.size}), got {list(ranks)!r}")
    seconds = world.timeout if timeout is None else resolve_timeout(timeout)
    if world.rank not in members:
        return None
    backend = backend or world.backend
    if world.size == 1 and backend == "single":
        return SingleProcessGroup(seconds)
    MPI = import_mpi(f"new_group(backend={backend!r})")
    whole = MPI.COMM_WORLD.Get_group()
    part = whole.Incl(members)
    comm = MPI.COMM_WORLD.Create_group(part)  # collective over the members only
    part.Free()
    whole.Free()
    if backend == "nccl":
        group = _nccl_group(comm, members, seconds, owns_comm=True)
    elif backend in ("mpi", "single"):
        from .mpi_backend import MPIProcessGroup

        group = MPIProcessGroup(comm, members, seconds, owns_comm=True)
    else:
        raise ValueError(f"new_group: expected backend None, 'mpi' or 'nccl', got {backend!r}")
    _subgroups.append(group)
    return group


# ---------------------------------------------------------------------------------- module-level collectives
def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    return (group or default_group()).all_reduce(tensor, op, async_op)


def broadcast(tensor, src=0, group=None, async_op=False):
    return (group or default_group()).broadcast(tensor, src, async_op)


def all_gather(tensor_list, tensor, group=None, async_op=False):
    return (group or default_group()).all_gather(tensor_list, tensor, async_op)


def all_gather_object(object_list, obj, group=None):
    """``object_list[r]`` = rank r's picklable ``obj``, on every rank (as torch.distributed's)."""
    return _all_gather_object(object_list, obj, group or default_group())


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op=False):
    return (group or default_group()).reduce_scatter(output, input_list, op, async_op)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    """Every rank's ``input_tensor`` gathered into ``output_tensor`` (chunk r from rank r); ``input_tensor`` may be
    this rank's own chunk of ``output_tensor`` (in place)."""
    return (group or default_group()).all_gather_into_tensor(output_tensor, input_tensor, async_op)


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op=False):
    """``output`` on rank r: the reduction over ranks of chunk r of their ``input``; ``output`` may be this rank's
    own chunk of ``input`` (in place)."""
    return (group or default_group()).reduce_scatter_tensor(output, input, op, async_op)


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False):
    """``input`` split along dim 0 into ``input_split_sizes[j]`` rows for rank j (None: equal blocks); ``output``
    receives every rank's block for this one, in rank order, ``output_split_sizes[j]`` rows from rank j (as
    torch.distributed's). Blocks may be empty; rows may have any shape."""
    return (group or default_group()).all_to_all_single(output, input, output_split_sizes, input_split_sizes,
                                                        async_op)


def reduce(tensor, dst=0, op=ReduceOp.SUM, group=None, async_op=False):
    return (group or default_group()).reduce(tensor, dst, op, async_op)


def barrier(group=None, async_op=False):
    return (group or default_group()).barrier(async_op)


def send(tensor, dst, group=None, tag=0):
    return (group or default_group()).send(tensor, dst, tag)


def recv(tensor, src, group=None, tag=0):
    return (group or default_group()).recv(tensor, src, tag)


def isend(tensor, dst, group=None, tag=0) -> Work:
    return (group or default_group()).isend(tensor, dst, tag)


def irecv(tensor, src, group=None, tag=0) -> Work:
    return (group or default_group()).irecv(tensor, src, tag)



from . import checkpoint  # noqa: E402  (it.distributed.checkpoint: sharded save and resharding load)
from . import algorithms  # noqa: E402  (it.distributed.algorithms.ddp_comm_hooks)
