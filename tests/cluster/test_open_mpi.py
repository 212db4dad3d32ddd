"""The multi-rank tests again, under Open MPI's mpirun (Debian's openmpi-bin) instead of the MPICH next to the
test's python: the DDP, tensor-, pipeline-parallel and ZeRO equivalence tests (a layout of each kind), the failure
tests (a rank raising, sys.exit on one rank, a collective or a pipeline peer timing out, SIGTERM to one rank ->
checkpoint -> exit 75) and launch/run.sh (--max-restarts, signal forwarding, a hostfile, a SIGKILLed rank relaunched
bitwise). Each group is one pytest run with INFINI_TRAIN_TEST_MPI=openmpi (tests/distributed/mpi_jobs.py then starts
jobs with mpirun.openmpi); the ranks use mpi4py's wheel, which infini_train points at Open MPI's library."""
import os
import re
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

PIPELINE = "tests/distributed/test_pipeline_runs.py::test_layout_gives_the_losses_samples_and_weights_of_one_process"
ZERO = "tests/distributed/test_zero.py::"
# every test of a group, or (pipeline layouts, ZeRO) one of each kind, to keep CI within its time
GROUPS = {
    "ddp": ["tests/distributed/test_mpi.py"],
    "tensor parallel": ["tests/distributed/test_tensor_parallel.py"],
    "pipeline parallel": [f"{PIPELINE}[{layout}]" for layout in ("pp2-1f1b", "pp2xdp2-interleaved",
                                                                  "pp2xtp2-sp-1f1b", "pp2xdp2-1f1b-zero2")],
    "zero": [f"{ZERO}test_stages_0_1_2_3_give_the_losses_of_one_process[3-384]",
             f"{ZERO}test_resume_across_world_sizes_and_zero_stages[2x-zero3->4x-zero3]",
             f"{ZERO}test_each_rank_holds_a_1_over_n_share_of_the_optimizer_state[2]"],
    "failures": ["tests/distributed/test_failures.py",
                 "tests/training/test_signals.py::test_on_two_ranks_a_signal_to_one_rank_stops_both_and_resume_is_"
                 "bitwise"],
    "launcher": ["tests/launch/test_run_sh.py", "tests/launch/test_restart_gpt2.py"],
}


@pytest.mark.parametrize("group", GROUPS)
def test_the_group_passes_under_open_mpi_as_under_mpich(open_mpi, group, tmp_path):
    env = dict(os.environ, INFINI_TRAIN_TEST_MPI="openmpi", OMPI_MCA_rmaps_base_oversubscribe="1",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")  # tests with 4 ranks on 2 cores; root
    for name in ("MPI4PY_LIBMPI", "MPI4PY_MPIABI", "PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS"):
        env.pop(name, None)  # the ranks must find Open MPI's library themselves
    # its own basetemp: a pytest that numbers its own under /tmp would prune those of the pytest running this one
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-q", "-rs",
                           f"--basetemp={tmp_path / 'basetemp'}", *GROUPS[group]], capture_output=True, text=True,
                          timeout=600, env=env, cwd=REPO)
    report = f"{open_mpi}: pytest {' '.join(GROUPS[group])}\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, report
    summary = proc.stdout.strip().splitlines()[-1]
    assert re.search(r"\d+ passed", summary) and "skipped" not in summary, report  # every test ran, under Open MPI
