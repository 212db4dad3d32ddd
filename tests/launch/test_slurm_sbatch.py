"""launch/slurm.sbatch run by bash with stand-ins for srun, scontrol and the venv's python (no Slurm needed):
SIGUSR1 to the batch shell reaches the ranks, exit status 75 requeues the job, other statuses do not."""
import os
import signal
import stat
import subprocess
import sys

import pytest

from tests.launch.jobs import FAKE, MPIEXEC, REPO, SBATCH, launches, needs_mpiexec, rank_log, wait_until

FAKE_SRUN = """#!/usr/bin/env bash
printf '%s\\n' "$@" > "$FAKE_STATE/srun_args"
while [[ "$1" == -* ]]; do shift; done  # srun's own options; the real srun passes signals on to the tasks
exec "$@"
"""
FAKE_SCONTROL = """#!/usr/bin/env bash
echo "$*" >> "$FAKE_STATE/scontrol.log"
if [[ "$1 $2" == "show hostnames" ]]; then echo localhost; fi
"""
FAKE_PYTHON = f"""#!/usr/bin/env bash
exec {sys.executable} {FAKE} "$FAKE_STATE" $FAKE_MODE "$@"
"""


def executable(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def start_batch(tmp_path, mode, launcher="srun", *args):
    state = tmp_path / "state"
    state.mkdir()
    executable(tmp_path / "bin" / "srun", FAKE_SRUN)
    executable(tmp_path / "bin" / "scontrol", FAKE_SCONTROL)
    executable(tmp_path / "venv" / "bin" / "python", FAKE_PYTHON)
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}", VENV=str(tmp_path / "venv"),
               FAKE_STATE=str(state), FAKE_MODE=mode, LAUNCHER=launcher, TMPDIR=str(tmp_path),
               SLURM_JOB_ID="4242", SLURM_SUBMIT_DIR=REPO, SLURM_NTASKS="2", SLURM_NTASKS_PER_NODE="2",
               SLURM_NNODES="1", SLURM_JOB_NODELIST="localhost", SLURM_CPUS_PER_TASK="1")
    env.pop("VIRTUAL_ENV", None)
    if MPIEXEC:
        env["MPIRUN"] = MPIEXEC
    proc = subprocess.Popen(["bash", SBATCH, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=REPO)  # a batch job starts in the directory it was submitted from
    return proc, state


def finish(proc, timeout=30):
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    return out


def scontrol_calls(state):
    path = state / "scontrol.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return [line for line in lines if not line.startswith("show hostnames")]


def test_the_batch_script_asks_for_usr1_before_the_time_limit_and_for_requeue():
    with open(SBATCH) as f:
        header = []
        for line in f.read().splitlines()[1:]:
            if not line.startswith("#"):
                break  # sbatch reads #SBATCH lines only up to the first command
            header.append(line)
    assert "#SBATCH --signal=B:USR1@120" in header and "#SBATCH --requeue" in header


@pytest.mark.parametrize("launcher", ["srun", pytest.param("mpirun", marks=needs_mpiexec)])
def test_usr1_to_the_batch_shell_checkpoints_the_ranks_and_requeues_on_75(tmp_path, launcher):
    proc, state = start_batch(tmp_path, "wait", launcher, "train.num_iterations=100")
    ranks = (0,) if launcher == "srun" else (0, 1)  # the fake srun starts one process
    wait_until(lambda: all("ready" in rank_log(state, r) for r in ranks), what="the ranks to start", proc=proc)
    proc.send_signal(signal.SIGUSR1)
    out = finish(proc)
    assert proc.returncode == 75, out
    for rank in ranks:
        assert rank_log(state, rank)[-1] == "got SIGUSR1", out
        (args,) = launches(state, rank)
        train = args[args.index("examples/gpt2/train.py"):]
        assert train[-2:] == ["resume=auto", "train.num_iterations=100"], args  # resume=auto, then the user's
    assert scontrol_calls(state) == ["requeue 4242"], out
    assert "requeueing" in out
    if launcher == "srun":
        assert (state / "srun_args").read_text().splitlines()[:4] == ["--mpi=pmi2", "--cpu-bind=cores",
                                                                     "--kill-on-bad-exit=0", "--wait=10"]
    else:
        assert not list(tmp_path.glob("hosts.4242.*")), "the generated hostfile was left behind"


@pytest.mark.parametrize("mode, status", [("fail 0 0", 0), ("fail 1 3", 3)])
def test_a_finished_or_failed_job_is_not_requeued(tmp_path, mode, status):
    proc, state = start_batch(tmp_path, mode)
    out = finish(proc)
    assert proc.returncode == status, out
    assert scontrol_calls(state) == [], out
    assert ("failed with exit status 3 (not requeued" in out) == (status == 3), out
    (args,) = launches(state)
    assert "resume=auto" in args
