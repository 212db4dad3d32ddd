"""Helpers for tests that start real multi-process jobs with the mpiexec next to the test's python."""
import os
import re
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
# INFINI_TRAIN_TEST_MPI=openmpi runs the multi-rank tests under Open MPI's mpirun (Debian's openmpi-bin) instead of
# the MPICH next to the test's python; tests/cluster/test_open_mpi.py runs them so
OPEN_MPI = os.environ.get("INFINI_TRAIN_TEST_MPI", "mpich") == "openmpi"
if OPEN_MPI:
    MPIEXEC = shutil.which("mpirun.openmpi")
    needs_mpiexec = pytest.mark.skipif(MPIEXEC is None, reason="Open MPI's mpirun.openmpi not found")
else:
    MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
    needs_mpiexec = pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not found (pip install -e '.[mpi]')")
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK")  # a rank's number in its environment: MPICH, Open MPI


def job_env(**extra):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONPATH=REPO, PYTHONUNBUFFERED="1")
    env.pop("INFINI_TRAIN_COLLECTIVE_TIMEOUT", None)
    env.update(extra)
    return env


def mpirun(n, script, *args, timeout=120, env=None):
    """``mpiexec -n N python script args`` from the repository root; returns the CompletedProcess."""
    return subprocess.run([MPIEXEC, "-n", str(n), sys.executable, os.path.join(HERE, script), *args],
                          capture_output=True, text=True, timeout=timeout, env=env or job_env(), cwd=REPO)


def python(*args, timeout=60, env=None):
    """A plain ``python ...`` (no launcher): a world of one."""
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout,
                          env=env or job_env(), cwd=REPO)


def output(proc):
    return f"--- rc {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"


def assert_every_rank_checked(proc, marker, ranks, at_least):
    """A worker ends by printing "rank R <marker> <checks>": every rank printed it, after at least ``at_least`` checks
    (so every check ran)."""
    counts = {int(r): int(n) for r, n in re.findall(rf"rank (\d+) {marker} (\d+)", proc.stdout)}
    assert set(counts) == set(range(ranks)), output(proc)
    assert min(counts.values()) >= at_least, output(proc)
