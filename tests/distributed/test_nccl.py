"""NCCL backend on a GPU machine: 2 ranks when 2 GPUs are present, else a 1-rank NCCL group. Skipped where cupy
or a GPU is missing."""
import pytest

cupy = pytest.importorskip("cupy")

from tests.distributed.mpi_jobs import mpirun, needs_mpiexec, output  # noqa: E402


def _gpus():
    try:
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no driver / no device
        return 0


pytestmark = [pytest.mark.cuda, needs_mpiexec,
              pytest.mark.skipif(_gpus() == 0, reason="no CUDA GPU visible to cupy")]


def test_nccl_collectives_on_the_gpus():
    ranks = 2 if _gpus() >= 2 else 1
    proc = mpirun(ranks, "worker_nccl.py", timeout=300)
    assert proc.returncode == 0, output(proc)
    for rank in range(ranks):
        assert f"rank {rank} NCCL OK" in proc.stdout, output(proc)
