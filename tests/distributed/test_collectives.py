"""Collectives on real 2-rank jobs (mpiexec), a world of one without a launcher, and launch/run.sh."""
import os
import subprocess
import sys

from tests.distributed.mpi_jobs import (HERE, REPO, assert_every_rank_checked, job_env, mpirun, needs_mpiexec, output,
                                        python)

RUN_SH = os.path.join(REPO, "launch", "run.sh")


@needs_mpiexec
def test_every_collective_and_reduce_op_on_two_ranks_matches_numpy():
    # all_reduce (5 ops x float32/float64/int32/int64 x sync/async x 3 shapes, float16/bfloat16, bool, strided
    # views, raw arrays), broadcast from each src, all_gather, reduce_scatter, reduce to each dst, send/recv with
    # tags, isend/irecv, barrier, new_group, argument errors and the AllReducePostAccumulateHook: one job
    proc = mpirun(2, "worker_collectives.py")
    assert proc.returncode == 0, output(proc)
    assert_every_rank_checked(proc, "OK", 2, at_least=501)


def test_world_of_one_without_a_launcher():
    proc = python(os.path.join(HERE, "worker_single.py"))
    assert proc.returncode == 0, output(proc)
    assert proc.stdout.strip() == "single OK"


def test_without_mpi4py_the_package_imports_and_a_world_of_two_asks_for_the_mpi_extra():
    code = """
import sys
sys.modules["mpi4py"] = None  # as if mpi4py were not installed
import infini_train as it
from infini_train import distributed as dist
t = it.ones(2)
dist.all_reduce(t)  # no launcher: a world of one, no mpi4py needed
assert dist.get_world_size() == 1 and dist.get_backend() == "single"
dist.destroy_process_group()
import os
os.environ["PMI_SIZE"] = "2"  # as a launcher starting 2 ranks would set it
try:
    dist.init_process_group()
except RuntimeError as exc:
    print(exc)
"""
    proc = python("-c", code)
    assert proc.returncode == 0, output(proc)
    assert "needs mpi4py, which is not installed" in proc.stdout
    assert "HINT: pip install -e '.[mpi]'" in proc.stdout


@needs_mpiexec
def test_run_sh_starts_ranks_with_per_rank_threads_and_a_lazily_initialised_world():
    env = job_env(PYTHON=sys.executable)
    for key in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NCCL_DEBUG", "MPIRUN"):
        env.pop(key, None)
    proc = subprocess.run([RUN_SH, "-n", "2", os.path.join(HERE, "worker_launch.py")], capture_output=True, text=True,
                          timeout=120, env=env, cwd=REPO)
    assert proc.returncode == 0, output(proc)
    threads = max(1, len(os.sched_getaffinity(0)) // 2)  # the cores this process may use, split over 2 ranks
    for rank in (0, 1):
        assert (f"rank {rank}/2 backend mpi avg [1.5, 1.5, 1.5] OMP_NUM_THREADS={threads} "
                f"OPENBLAS_NUM_THREADS={threads} NCCL_DEBUG=WARN PYTHONUNBUFFERED=1") in proc.stdout, output(proc)
    # the mpirun next to the interpreter is the one used
    assert os.path.join(os.path.dirname(sys.executable), "mpi") in proc.stderr


def test_run_sh_dry_run_builds_the_mpirun_command(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# two nodes\nnode01:4\nnode02:4\n")
    env = job_env(PYTHON=sys.executable, MPIRUN="/opt/mpich/bin/mpiexec", MPIRUN_ARGS="-bind-to core")
    proc = subprocess.run([RUN_SH, "--dry-run", "-n", "8", "--hostfile", str(hostfile), "--ppn", "4", "train.py",
                           "--config", "c.yaml"], capture_output=True, text=True, timeout=30, env=env, cwd=REPO)
    assert proc.returncode == 0, output(proc)
    assert proc.stdout.split() == ["/opt/mpich/bin/mpiexec", "-n", "8", "-f", str(hostfile), "-ppn", "4",
                                   "-bind-to", "core", sys.executable, "-u", "train.py", "--config", "c.yaml"]
    bad = subprocess.run([RUN_SH, "-n", "two", "train.py"], capture_output=True, text=True, timeout=30, env=env)
    assert bad.returncode == 2 and "positive number of ranks" in bad.stderr


def test_a_launcher_of_another_mpi_is_reported_instead_of_n_separate_worlds_of_one():
    # Open MPI's mpirun starting an MPICH-built mpi4py gives every process a world of 1: refuse, with a HINT
    code = ("from infini_train import distributed as dist\n"
            "try:\n    dist.init_process_group()\nexcept RuntimeError as exc:\n    print(exc)\n")
    proc = python("-c", code, env=job_env(OMPI_COMM_WORLD_SIZE="2", PYTHONWARNINGS="ignore"))
    assert proc.returncode == 0, output(proc)
    assert "the launcher started 2 ranks but MPI sees a world of 1" in proc.stdout, output(proc)
    assert "HINT:" in proc.stdout
