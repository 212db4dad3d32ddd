"""Submitting launch/slurm.sbatch to the test cluster and watching its jobs (tiny GPT-2, 2 CPU tasks)."""
import os
import subprocess
import sys
import time

import numpy as np

from tests.processes import processes

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SBATCH = os.path.join(REPO, "launch", "slurm.sbatch")
JOB_NAME = "infini-train-gpt2"  # the script's #SBATCH --job-name: its log is <name>-<jobid>.out
# the script's GPU nodes made one CPU node running 2 ranks; 10 minutes, the time-limit test lowers it
SBATCH_OPTIONS = ["--nodes=1", "--ntasks-per-node=2", "--gpus-per-node=0", "--cpus-per-task=1", "--time=10"]


def train_args(data_dir, out_dir, steps, save_every):
    return [f"out_dir={out_dir}", f"data.train={data_dir}/train_*.bin", f"data.val={data_dir}/val_*.bin",
            "data.source=null", "model.n_layer=2", "model.n_embd=64", "model.n_head=2", "model.block_size=32",
            "train.batch_size=4", "train.sequence_length=32", "train.total_batch_size=256", "train.warmup_iters=2",
            f"train.num_iterations={steps}", f"train.save_every={save_every}", "train.keep_last=2",
            "train.val_loss_every=0", "train.sample_every=0", "train.log_every=500", "plot=false", "device=cpu"]


def submit(cluster_env, log_dir, args, options=(), **script_env):
    """``sbatch launch/slurm.sbatch ARGS`` (the tiny config's overrides) from the repository, ``script_env`` (LAUNCHER,
    SRUN_MPI, MPIRUN) in the job's environment; returns the job id."""
    env = dict(cluster_env, CONFIG="configs/gpt2_tiny_ddp.yaml", VENV=sys.prefix, SRUN_WAIT="10", **script_env)
    proc = subprocess.run(["sbatch", "--parsable", f"--chdir={REPO}", f"--output={log_dir}/%x-%j.out",
                           *SBATCH_OPTIONS, *options, SBATCH, *args], capture_output=True, text=True,
                          env=env, timeout=60)
    assert proc.returncode == 0, f"sbatch failed ({proc.returncode}): {proc.stdout}\n{proc.stderr}"
    return proc.stdout.strip().split(";")[0]


def slurm(cluster_env, *command):
    proc = subprocess.run(list(command), capture_output=True, text=True, env=cluster_env, timeout=60)
    assert proc.returncode == 0, f"{' '.join(command)} failed ({proc.returncode}): {proc.stdout}\n{proc.stderr}"
    return proc.stdout


def job(cluster_env, job_id):
    """``scontrol show job``'s fields: JobState, Restarts, ExitCode, TimeLimit, ..."""
    fields = {}
    for item in slurm(cluster_env, "scontrol", "--oneliner", "show", "job", job_id).split():
        key, _, value = item.partition("=")
        fields.setdefault(key, value)
    return fields


def log_path(log_dir, job_id):
    return os.path.join(log_dir, f"{JOB_NAME}-{job_id}.out")


def log_text(log_dir, job_id):
    path = log_path(log_dir, job_id)
    if not os.path.exists(path):
        return ""
    with open(path, errors="replace") as f:
        return f.read()


def wait_for(predicate, timeout, what, describe=lambda: ""):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{describe()}")
        time.sleep(0.05)


def checkpoint_steps(out_dir):
    """The steps of the complete checkpoints in out_dir (state.json is written last)."""
    root = os.path.join(out_dir, "checkpoints")
    if not os.path.isdir(root):
        return []
    return sorted(int(name[5:]) for name in os.listdir(root)
                  if name.startswith("step_") and os.path.exists(os.path.join(root, name, "state.json")))


def rank_pid(job_id, rank):
    """The pid of rank ``rank``'s train.py in job ``job_id`` (found by its Slurm environment), or None."""
    wanted = {f"SLURM_JOB_ID={job_id}".encode(), f"SLURM_PROCID={rank}".encode()}
    for pid, argv, environ in processes(environ=True):
        if any(arg.endswith(b"examples/gpt2/train.py") for arg in argv) and wanted <= environ:
            return pid
    return None


def final_weights(out_dir, step):
    from infini_train.run_state import load_checkpoint

    return load_checkpoint(os.path.join(out_dir, "checkpoints", f"step_{step:06d}"))[0]


def assert_bitwise_equal(got, expected):
    assert sorted(got) == sorted(expected)
    for name in expected:
        assert got[name].dtype == expected[name].dtype and got[name].shape == expected[name].shape, name
        assert np.array_equal(got[name].view(np.uint8), expected[name].view(np.uint8)), f"{name} differs"
