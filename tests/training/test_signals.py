"""Stop signals end a run at a step boundary with a checkpoint and exit status 75; resuming gives the run that was
never interrupted, bitwise. Signals are sent by pid from the test, to one rank only in the two-rank job."""
import os
import re
import signal
import subprocess
import time

import pytest

from infini_train.training import EXIT_INTERRUPTED, EXIT_STOPPED, Run, StopSignals
from infini_train.run_state import list_checkpoints
from infini_train.training.config import parse_args
from tests.distributed.mpi_jobs import needs_mpiexec
from tests.training.tiny_run import (CONFIG, REPO, command, job_env, metrics, rank_pids, run, same_run,
                                     signal_after_steps, tiny_args)

COMMON = ["train.num_iterations=30", "train.save_every=0", "model.dropout=0.1", "train.val_loss_every=4"]


@pytest.fixture(scope="module")
def uninterrupted(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    run(tiny_args(data_dir, out, *COMMON))
    return out


def _start(args, ranks=1):
    return subprocess.Popen(command(args, ranks), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env=job_env())


def _stopped(proc, name):
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_STOPPED, f"rc {proc.returncode}\n{out[-2000:]}\n{err[-2000:]}"
    found = re.search(rf"stopped by {name} after (\d+) of (\d+) steps, checkpoint (\S+)\nHINT: resume=auto continues "
                      rf"the run with step (\d+)/\2 \(exit status 75\)", out)
    assert found, out[-2000:]
    step, path = int(found.group(1)), found.group(3)
    assert int(found.group(4)) == step + 1 and f"step {step:5d}/{found.group(2)} |" in out  # the last step line
    trained = [r["step"] for r in metrics(os.path.dirname(os.path.dirname(path))) if "loss" in r]
    assert trained == list(range(step)), trained  # metrics.jsonl's records of those steps: 0 .. N-1
    return step, path


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGUSR1, signal.SIGINT], ids=lambda n: n.name)
def test_a_signal_stops_with_a_checkpoint_and_resume_is_bitwise(data_dir, uninterrupted, tmp_path, number):
    out = tmp_path / "run"
    proc = _start(tiny_args(data_dir, out, *COMMON))
    signal_after_steps(proc, out, 5, number)
    step, path = _stopped(proc, number.name)
    assert 5 <= step < 30 and list_checkpoints(out) == [path] and path.endswith(f"step_{step:06d}")
    resumed = run(tiny_args(data_dir, out, *COMMON, "resume=auto"))
    assert f"resumed from {path} at step {step}" in resumed.stdout
    same_run(uninterrupted, out)


@needs_mpiexec
def test_on_two_ranks_a_signal_to_one_rank_stops_both_and_resume_is_bitwise(data_dir, tmp_path):
    full, out = tmp_path / "full", tmp_path / "run"
    common = [*COMMON, "train.batch_size=2"]  # the same 128-token global batch over two ranks
    run(tiny_args(data_dir, full, *common), ranks=2)
    proc = _start(tiny_args(data_dir, out, *common), ranks=2)
    pids = []
    while len(pids) < 2 and proc.poll() is None:
        pids = rank_pids(str(out))
    signal_after_steps(proc, out, 5, signal.SIGTERM, pid=pids[-1])
    step, path = _stopped(proc, "SIGTERM")
    assert list_checkpoints(out) == [path]
    run(tiny_args(data_dir, out, *common, "resume=auto"), ranks=2)
    same_run(full, out)


def test_a_second_sigint_exits_at_once_without_a_checkpoint(data_dir, tmp_path):
    out = tmp_path / "run"
    # each iteration validates on 200 batches, so the second SIGINT (0.1 s later; two pending SIGINTs would merge
    # into one) arrives long before the next step boundary
    proc = _start(tiny_args(data_dir, out, "train.num_iterations=50", "train.save_every=0", "train.val_loss_every=1",
                            "train.val_max_steps=200"))
    signal_after_steps(proc, out, 1, signal.SIGINT)
    time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_INTERRUPTED, err[-2000:]
    assert "interrupted twice: exiting now, without a checkpoint" in err
    assert list_checkpoints(out) == []


def test_a_signal_while_the_run_is_built_stops_it_at_its_first_step_boundary(data_dir, tmp_path, capsys):
    # train.py records stop signals from its start (a time-limit warning may come before the first step)
    args = ["--config", CONFIG, *tiny_args(data_dir, tmp_path / "run", "train.num_iterations=6")]
    with StopSignals() as stops:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert Run(parse_args(args)).train(stops) == EXIT_STOPPED
    (first,) = list_checkpoints(tmp_path / "run")
    assert first.endswith("step_000000") and "stopped by SIGUSR1 after 0 of 6 steps" in capsys.readouterr().out
    state = os.path.join(first, "state.json")
    written = os.stat(state).st_mtime_ns
    with StopSignals() as stops:  # resumed and stopped again before a step: the checkpoint it resumed is current
        os.kill(os.getpid(), signal.SIGTERM)
        assert Run(parse_args([*args, "resume=auto"])).train(stops) == EXIT_STOPPED
    assert f"stopped by SIGTERM after 0 of 6 steps, checkpoint {first}\nHINT: resume=auto continues the run with " \
           "step 1/6 (exit status 75)" in capsys.readouterr().out
    assert list_checkpoints(tmp_path / "run") == [first] and os.stat(state).st_mtime_ns == written
    assert Run(parse_args([*args, "resume=auto"])).train() == 0
    assert os.path.basename(list_checkpoints(tmp_path / "run")[-1]) == "step_000006"
