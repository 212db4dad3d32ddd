"""Helpers for the launcher tests: run launch/run.sh (or slurm.sbatch) on the fake training script."""
import os
import subprocess
import sys
import time

from tests.distributed.mpi_jobs import MPIEXEC, OPEN_MPI, RANK_VARIABLES, needs_mpiexec  # noqa: F401

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RUN_SH = os.path.join(REPO, "launch", "run.sh")
SBATCH = os.path.join(REPO, "launch", "slurm.sbatch")
FAKE = os.path.join(HERE, "fake_train.py")
BASH_ERRORS = ("unbound variable", "syntax error", "command not found", "integer expression", "value too great",
               "bad substitution", "No such file or directory")


def launcher_env(**extra):
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               PYTHONUNBUFFERED="1")
    for key in ("MPIRUN", "MPIRUN_ARGS", "INFINI_TRAIN_COLLECTIVE_TIMEOUT"):
        env.pop(key, None)
    if OPEN_MPI:  # run.sh would pick the venv's MPICH
        env["MPIRUN"] = MPIEXEC
    env.update(extra)
    return env


def run_sh(*args, timeout=60, env=None):
    return subprocess.run([RUN_SH, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=env or launcher_env(), cwd=REPO)


def start_run_sh(*args, env=None, **kwargs):
    return subprocess.Popen([RUN_SH, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env or launcher_env(), cwd=REPO, **kwargs)


def rank_log(state_dir, rank):
    path = os.path.join(state_dir, f"rank{rank}.log")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return f.read().splitlines()


def launches(state_dir, rank=0):
    """The argument lists fake_train.py was started with, one per launch."""
    return [line.split()[1:] for line in rank_log(state_dir, rank) if line.startswith("launch ")]


def wait_until(predicate, timeout=30, what="the condition", proc=None):
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the job ended ({proc.returncode}) before {what}\n{(out or '')[-3000:]}\n"
                                 f"{(err or '')[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def output(proc):
    return f"--- rc {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
