"""Stragglers and hangs in real multi-rank runs of the training script: a rank delayed by INFINI_TRAIN_SLOW_RANK is
named in every window of the straggler report (its log line and metrics.jsonl's records), and a rank that sleeps
at a step (INFINI_TRAIN_HANG_RANK) makes the others' collective time out: the job ends within the timeout plus 10 s,
every rank's stack and pending collective in out_dir/hang, the sleeping rank named."""
import re
import subprocess
import threading
import time

from infini_train.distributed import hang
from tests.distributed.mpi_jobs import needs_mpiexec
from tests.training.tiny_run import REPO, command, job_env, metrics, run, tiny_args

pytestmark = needs_mpiexec


def _args(data_dir, out, *extra):
    return tiny_args(data_dir, out, "train.total_batch_size=384", "train.val_loss_every=0", "train.log_every=2",
                     *extra)


def test_a_delayed_rank_is_named_in_every_window(data_dir, tmp_path):
    out = tmp_path / "run"
    proc = run(_args(data_dir, out, "train.num_iterations=7"), ranks=3,
               env=job_env(PYTHONPATH=REPO, INFINI_TRAIN_SLOW_RANK="1:0.3"))
    lines = [line for line in proc.stdout.splitlines() if line.startswith("straggler:")]
    assert len(lines) == 4, proc.stdout  # windows end at steps 0, 2, 4 and 6 (the step lines of log_every 2)
    for line, steps in zip(lines, ("step 1", "steps 2-3", "steps 4-5", "steps 6-7")):
        assert re.fullmatch(rf"straggler: rank 1 step 0\.3\d\d s vs median 0\.\d+ s \(compute 0\.3\d\d s, data wait "
                            rf"0\.\d+ s: compute dominates; the others wait 0\.\d+ s for it in communication\), mean "
                            rf"of {steps}", line), line
    records = [r["straggler"] for r in metrics(out) if "straggler" in r]
    assert [r["steps"] for r in records] == [[0, 0], [1, 2], [3, 4], [5, 6]]
    for r in records:
        assert r["rank"] == 1 and r["flagged"] and r["ratio"] > 1.2
        assert 0.3 <= r["step_s"] < 1.5 and r["compute_s"] >= 0.3
        assert r["others_comm_wait_s"] >= 0.2  # the others wait for rank 1 in communication


def test_a_rank_asleep_at_a_step_ends_the_job_with_every_ranks_stack(data_dir, tmp_path):
    out = tmp_path / "run"
    timeout = 5
    env = job_env(PYTHONPATH=REPO, INFINI_TRAIN_HANG_RANK="2:2", INFINI_TRAIN_COLLECTIVE_TIMEOUT=str(timeout))
    proc = subprocess.Popen(command(_args(data_dir, out, "train.num_iterations=6"), ranks=3), cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    killer = threading.Timer(120, proc.kill)
    killer.start()
    asleep, lines = None, []
    try:
        for line in proc.stdout:
            lines.append(line)
            if asleep is None and "INFINI_TRAIN_HANG_RANK: sleeping" in line:
                asleep = time.monotonic()
        proc.wait()
        ended = time.monotonic()
    finally:
        killer.cancel()
    text = "".join(lines)
    assert proc.returncode != 0 and asleep is not None, text[-4000:]
    assert "[rank 2] INFINI_TRAIN_HANG_RANK: sleeping 3600 s at step 2 (a test hook)" in text
    assert ended - asleep < timeout + 10, f"the job ended {ended - asleep:.1f} s after the rank fell asleep"
    assert re.search(rf"\[rank [01]\] RuntimeError: \w+ on group ranks \[0, 1, 2\] \(.*\) did not complete within "
                     rf"{timeout} s \(sequence \d+ on this group, [\d.]+ [KM]?B\); ranks never arrived: \[2\] \(their "
                     rf"stacks: \S+/hang/rank2.txt\)", text), text[-4000:]
    reports = {r: (out / "hang" / f"rank{r}.txt").read_text() for r in range(3)}
    assert "pending collective: none" in reports[2] and "in timing" in reports[2] and "stragglers.py" in reports[2]
    states = {r: hang.read_state(out / "hang" / f"rank{r}.txt") for r in range(3)}
    for r in (0, 1):
        assert "Python stacks (faulthandler" in reports[r] and "loop.py\", line" in reports[r]
        pending = states[r]["waiting"]
        assert pending["group"] == [0, 1, 2] and pending["sequence"] > states[2]["entered"]["0,1,2#0"]
