"""How a process finds its place in a job: MPI (imported lazily), the launcher's environment, the local rank,
and abort-on-failure: an uncaught exception on any rank, or a rank leaving the interpreter (``sys.exit``, the
end of the script) while its peers still run, ends the whole job within seconds."""
from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import traceback

MPI_HINT = "pip install -e '.[mpi]'   (mpi4py + MPICH; start the job with mpirun -n N or launch/run.sh)"
CUDA_HINT = "pip install -e '.[cuda]' on a machine with NVIDIA GPUs, or use backend='mpi'"
# set by mpirun/mpiexec (MPICH hydra, Open MPI, MVAPICH) and by srun --mpi=pmi2/pmix
_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MV2_COMM_WORLD_SIZE")


# Open MPI's library (its soname since 3.0): ranks an Open MPI launcher started load it rather than the MPICH wheel's
OPEN_MPI_LIBRARY = "libmpi.so.40"
_OPEN_MPI_LAUNCHED = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK")  # Open MPI's mpirun; srun --mpi=pmix


def _choose_mpi_library():
    """mpi4py's wheel carries an extension for each MPI ABI and loads the first libmpi it finds: the MPICH wheel's
    when that is installed. MPICH cannot join ranks that Open MPI's mpirun or srun --mpi=pmix started (it aborts in
    MPI_Init: "unsupported PMI version PMIx"), so such ranks load Open MPI's library, unless MPI4PY_LIBMPI or
    MPI4PY_MPIABI names one. Returns the library chosen here, or None."""
    if "mpi4py.MPI" in sys.modules or os.environ.get("MPI4PY_LIBMPI") or os.environ.get("MPI4PY_MPIABI"):
        return None
    if not any(name in os.environ for name in _OPEN_MPI_LAUNCHED):
        return None
    os.environ["MPI4PY_LIBMPI"] = OPEN_MPI_LIBRARY
    return OPEN_MPI_LIBRARY


def import_mpi(needed_for=None):
    """mpi4py's MPI module, or None when mpi4py is missing (a RuntimeError with a HINT if ``needed_for``)."""
    chosen = _choose_mpi_library()
    try:
        from mpi4py import MPI
    except ImportError as exc:
        if needed_for is None:
            return None
        raise RuntimeError(f"{needed_for} needs mpi4py, which is not installed\nHINT: {MPI_HINT}") from exc
    except RuntimeError as exc:  # mpi4py could not load the MPI library
        if chosen is None:
            raise
        raise RuntimeError(f"Open MPI started this rank, but its library {chosen} could not be loaded: {exc}\n"
                           "HINT: put Open MPI's lib directory on LD_LIBRARY_PATH (module load openmpi), set "
                           "MPI4PY_LIBMPI to the libmpi.so to use, or start the job with launch/run.sh") from exc
    return MPI


def mpi_library():
    """The MPI library this process loaded, e.g. "MPICH 5.0.2" or "Open MPI 4.1.4" (None without mpi4py)."""
    if "mpi4py.MPI" not in sys.modules:
        return None
    name, version = sys.modules["mpi4py.MPI"].get_vendor()
    return f"{name} {'.'.join(map(str, version))}"


def launcher_world_size():
    """The world size a launcher announced in the environment, or None when no launcher started us."""
    for name in _SIZE_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def node_local_rank(MPI, comm):
    """(local rank, ranks on this node): this rank's position among the ranks sharing its node's memory."""
    if comm.Get_size() == 1:
        return 0, 1
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return local.Get_rank(), local.Get_size()
    finally:
        local.Free()


def cuda_device_count():
    """GPUs this process sees (0 when cupy is missing or no driver/GPU is present)."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:
        return 0


_saved_hooks = None
_ABORT_GRACE_SECONDS = 0.5  # lets the launcher forward the traceback before Abort tears the job down


def abort_job(status=1):
    """End every rank of the job now (after a reported error), once the launcher had time to forward what this
    rank printed."""
    MPI = import_mpi("abort_job")
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(_ABORT_GRACE_SECONDS)
    MPI.COMM_WORLD.Abort(status)


def install_abort_on_failure(comm):
    """Make an uncaught exception (main thread or any other) print its traceback tagged with the rank and
    call ``comm.Abort(1)``: mpirun then ends every rank, so no peer waits forever in a collective."""
    global _saved_hooks
    if _saved_hooks is None:
        _saved_hooks = (sys.excepthook, threading.excepthook)
    rank, size = comm.Get_rank(), comm.Get_size()

    def abort(exc_type, exc, tb):
        try:
            sys.stdout.flush()
            text = "".join(traceback.format_exception(exc_type, exc, tb))
            sys.stderr.write("".join(f"[rank {rank}] {line}" for line in text.splitlines(True)))
            sys.stderr.write(f"[rank {rank}] uncaught {exc_type.__name__}: aborting the job ({size} ranks)\n")
            sys.stderr.flush()
            time.sleep(_ABORT_GRACE_SECONDS)
        finally:
            comm.Abort(1)

    def thread_abort(args):
        if args.exc_type is SystemExit:  # a thread calling sys.exit() ends only itself, as by default
            return
        abort(args.exc_type, args.exc_value, args.exc_traceback)

    sys.excepthook = abort
    threading.excepthook = thread_abort

    _arm_exit_guard(comm)


EXIT_GRACE_ENV = "INFINI_TRAIN_EXIT_GRACE"
_exit_guard = None  # a private duplicate of the world communicator, while the world is up


def _arm_exit_guard(comm):
    """At interpreter exit with the world still up (no destroy_process_group), every rank must be exiting too:
    they meet in a barrier on a private communicator (so it cannot be mistaken for a collective in flight) within
    $INFINI_TRAIN_EXIT_GRACE seconds (default 10), or this rank aborts the job rather than leave its peers waiting
    for it until their collective timeout."""
    global _exit_guard
    if _exit_guard is None:
        _exit_guard = comm.Dup()
        atexit.register(_check_exit, comm)


def _check_exit(comm):
    guard = _exit_guard
    if guard is None:
        return
    MPI = import_mpi()
    if MPI is None or MPI.Is_finalized():
        return
    grace = float(os.environ.get(EXIT_GRACE_ENV, "10"))
    request = guard.Ibarrier()
    deadline = time.monotonic() + grace
    while not request.Test():
        if time.monotonic() > deadline:
            rank, size = comm.Get_rank(), comm.Get_size()
            sys.stderr.write(f"[rank {rank}] exited before the other ranks (sys.exit, or the end of the script "
                             f"without destroy_process_group()): aborting the job ({size} ranks)\n")
            sys.stderr.flush()
            time.sleep(_ABORT_GRACE_SECONDS)  # let the launcher forward the message before Abort ends everything
            comm.Abort(1)
        time.sleep(0.005)


def uninstall_abort_on_failure():
    global _saved_hooks, _exit_guard
    if _saved_hooks is not None:
        sys.excepthook, threading.excepthook = _saved_hooks
        _saved_hooks = None
    if _exit_guard is not None:
        try:
            _exit_guard.Free()
        except Exception:  # freeing is best effort: the world is being torn down anyway
            pass
        _exit_guard = None


__all__ = ["import_mpi", "mpi_library", "launcher_world_size", "node_local_rank", "cuda_device_count",
           "install_abort_on_failure", "uninstall_abort_on_failure", "MPI_HINT", "CUDA_HINT", "EXIT_GRACE_ENV"]
