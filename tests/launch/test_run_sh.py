"""launch/run.sh: argument errors, --max-restarts and signal forwarding, with a fake script standing in for train.py."""
import os
import pty
import re
import signal
import sys
import time

import pytest

from tests.launch.jobs import (BASH_ERRORS, FAKE, OPEN_MPI, REPO, RUN_SH, launcher_env, launches, needs_mpiexec,
                               output, rank_log, run_sh, start_run_sh, wait_until)

SCRIPT = "examples/gpt2/train.py"  # exists; never started by these cases
RESTART_LINE = re.compile(r"^\[run\.sh \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] restart (\d+)/(\d+) after exit status (\d+)",
                          re.M)


def assert_usage_error(proc, message):
    assert proc.returncode == 2, output(proc)
    assert message in proc.stderr, output(proc)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("run.sh:")]
    assert len(errors) == 1, output(proc)  # one message ...
    assert "Options (before the script)" in proc.stderr  # ... and the usage
    for text in BASH_ERRORS:
        assert text not in proc.stderr, output(proc)
    assert not re.search(r"run\.sh: line \d+", proc.stderr), output(proc)
    assert proc.stdout == ""


@pytest.mark.parametrize("args, message", [
    (["-n"], "option -n expects a value"),
    (["-np"], "option -np expects a value"),
    (["--ppn"], "option --ppn expects a value"),
    (["--hostfile"], "option --hostfile expects a value"),
    (["--max-restarts"], "option --max-restarts expects a value"),
    (["-n", "0", SCRIPT], "expected -n to be a positive number of ranks, got '0'"),
    (["-n", "-3", SCRIPT], "expected -n to be a positive number of ranks, got '-3'"),
    (["-n", "two", SCRIPT], "expected -n to be a positive number of ranks, got 'two'"),
    (["-n", "", SCRIPT], "expected -n to be a positive number of ranks, got ''"),
    (["-n", "1.5", SCRIPT], "expected -n to be a positive number of ranks, got '1.5'"),
    (["-n=2x", SCRIPT], "unknown option '-n=2x'"),
    (["--ppn", "0", SCRIPT], "expected --ppn to be a positive number of ranks per node, got '0'"),
    (["--ppn", "abc", SCRIPT], "expected --ppn to be a positive number of ranks per node, got 'abc'"),
    (["--ppn=-1", SCRIPT], "expected --ppn to be a positive number of ranks per node, got '-1'"),
    (["--max-restarts", "-1", SCRIPT], "expected --max-restarts to be a number >= 0, got '-1'"),
    (["--max-restarts", "x", SCRIPT], "expected --max-restarts to be a number >= 0, got 'x'"),
    (["--hostfile", "no/such/hosts", SCRIPT], "hostfile 'no/such/hosts' not found or unreadable"),
    (["--hostfile", "launch", SCRIPT], "hostfile 'launch' not found or unreadable"),
    (["-n", "2", "no/such/train.py"], "script 'no/such/train.py' not found"),
    (["-n", "2"], "expected a script to run"),
    ([], "expected a script to run"),
    (["--bogus", SCRIPT], "unknown option '--bogus'"),
])
def test_bad_arguments_print_one_message_and_the_usage_and_exit_2(args, message):
    assert_usage_error(run_sh(*args), message)


@pytest.mark.parametrize("content, message", [
    ("", "lists no hosts"),
    ("# only a comment\n\n   \n", "lists no hosts"),
    ("node01:0\n", "line 1: slots must be a positive integer, got 'node01:0'"),
    ("# ok\nnode01:4\nnode02:abc\n", "line 3: slots must be a positive integer, got 'node02:abc'"),
    ("node01:-2\n", "line 1: slots must be a positive integer"),
    ("node01:\n", "line 1: slots must be a positive integer"),
    ("node01:4:2\n", "line 1: slots must be a positive integer"),
    ("node01 slots=4\n", "line 1: expected 'host' or 'host:slots', got 'node01 slots=4'"),
    ("node01:4\n:4\n", "line 2: expected 'host' or 'host:slots', got ':4'"),
    ("node01, node02\n", "line 1: expected 'host' or 'host:slots'"),
])
def test_a_malformed_hostfile_is_refused_naming_the_line(tmp_path, content, message):
    hostfile = tmp_path / "hosts"
    hostfile.write_text(content)
    proc = run_sh("-n", "2", "--hostfile", hostfile, SCRIPT)
    assert_usage_error(proc, message)
    assert str(hostfile) in proc.stderr


def test_help_prints_the_usage_and_exits_0():
    proc = run_sh("--help")
    assert proc.returncode == 0, output(proc)
    assert "--max-restarts N" in proc.stdout and "Exit status" in proc.stdout


def test_dry_run_with_good_arguments_prints_the_command(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# two nodes\n\n  node01:4  \nnode02\n")
    env = launcher_env(MPIRUN="/opt/mpich/bin/mpiexec", MPIRUN_ARGS="-bind-to core")
    proc = run_sh("--dry-run", "-n", "08", f"--hostfile={hostfile}", "--ppn", "4", "--max-restarts=3", SCRIPT,
                  "--config", "c.yaml", env=env)
    assert proc.returncode == 0, output(proc)
    assert proc.stdout.split() == ["/opt/mpich/bin/mpiexec", "-n", "8", "-f", str(hostfile), "-ppn", "4",
                                   "-bind-to", "core", sys.executable, "-u", SCRIPT, "--config", "c.yaml"]
    # "--" passes python options on; --dry-run only notes a script it cannot see (it may live on the nodes)
    proc = run_sh("--dry-run", "--", "-m", "some.module", env=env)
    assert proc.returncode == 0 and proc.stdout.split()[-3:] == ["-u", "-m", "some.module"], output(proc)
    proc = run_sh("--dry-run", "remote/train.py", env=env)
    assert proc.returncode == 0 and "script 'remote/train.py' not found here" in proc.stderr, output(proc)


# ---- --max-restarts

@needs_mpiexec
def test_a_failed_job_is_relaunched_once_with_resume_auto_and_its_final_status_passed_on(tmp_path):
    proc = run_sh("-n", "2", "--max-restarts", "2", FAKE, tmp_path, "fail", "1", "3", "out_dir=x")
    assert proc.returncode == 0, output(proc)
    assert RESTART_LINE.findall(proc.stderr) == [("1", "2", "3")], output(proc)
    for rank in (0, 1):
        assert launches(tmp_path, rank) == [[str(tmp_path), "fail", "1", "3", "out_dir=x"],
                                            [str(tmp_path), "fail", "1", "3", "out_dir=x", "resume=auto"]]


@needs_mpiexec
def test_resume_auto_is_appended_once_across_restarts_and_not_when_already_given(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir(), second.mkdir()
    proc = run_sh("--max-restarts", "3", FAKE, first, "fail", "3", "1")
    assert proc.returncode == 0, output(proc)
    assert RESTART_LINE.findall(proc.stderr) == [("1", "3", "1"), ("2", "3", "1"), ("3", "3", "1")], output(proc)
    runs = launches(first)
    assert len(runs) == 4 and "resume=auto" not in runs[0]
    assert all(r.count("resume=auto") == 1 for r in runs[1:]), runs
    proc = run_sh("--max-restarts", "1", FAKE, second, "fail", "1", "1", "resume=auto")
    assert proc.returncode == 0, output(proc)
    assert [r.count("resume=auto") for r in launches(second)] == [1, 1]


@needs_mpiexec
def test_the_restart_limit_is_honoured_and_the_last_status_passed_on(tmp_path):
    proc = run_sh("-n", "2", "--max-restarts", "2", FAKE, tmp_path, "fail", "5", "7")
    assert proc.returncode == 7, output(proc)
    assert RESTART_LINE.findall(proc.stderr) == [("1", "2", "7"), ("2", "2", "7")], output(proc)
    assert "giving up after 2 restart(s): exit status 7" in proc.stderr
    assert len(launches(tmp_path, 0)) == len(launches(tmp_path, 1)) == 3


@needs_mpiexec
def test_without_max_restarts_a_failure_is_not_relaunched(tmp_path):
    proc = run_sh(FAKE, tmp_path, "fail", "1", "3")
    assert proc.returncode == 3, output(proc)
    assert not RESTART_LINE.search(proc.stderr) and len(launches(tmp_path)) == 1


@needs_mpiexec
def test_exit_status_75_stopped_with_a_checkpoint_is_not_restarted(tmp_path):
    proc = run_sh("-n", "2", "--max-restarts", "3", FAKE, tmp_path, "fail", "1", "75")
    assert proc.returncode == 75, output(proc)
    assert not RESTART_LINE.search(proc.stderr), output(proc)
    assert len(launches(tmp_path, 0)) == len(launches(tmp_path, 1)) == 1


@needs_mpiexec
def test_a_hostfile_run_starts_the_ranks_on_the_hosts_it_lists(tmp_path):
    hostfile = tmp_path / "hosts"  # MPICH's format; run.sh converts it for Open MPI
    hostfile.write_text("# this machine, two slots\nlocalhost:2\n")
    proc = run_sh("-n", "2", "--hostfile", hostfile, FAKE, tmp_path, "fail", "0", "0")
    assert proc.returncode == 0, output(proc)
    for rank in (0, 1):
        assert launches(tmp_path, rank) == [[str(tmp_path), "fail", "0", "0"]], output(proc)


# ---- signals

def forwarded(name):
    """The signal run.sh passes to mpirun for ``name``: Open MPI's mpirun gets SIGUSR1 for SIGTERM and SIGINT."""
    return "SIGUSR1" if OPEN_MPI else name


def both_ready(state_dir):
    return all("ready" in rank_log(state_dir, rank) for rank in (0, 1))


@needs_mpiexec
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1])
def test_a_signal_to_run_sh_reaches_every_rank_and_stops_without_restart(tmp_path, sig):
    proc = start_run_sh("-n", "2", "--max-restarts", "2", FAKE, tmp_path, "wait")
    try:
        wait_until(lambda: both_ready(tmp_path), what="both ranks to start", proc=proc)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 75, f"{proc.returncode}\n{out}\n{err}"
    sent = forwarded(sig.name)
    for rank in (0, 1):
        assert rank_log(tmp_path, rank) == [f"launch {tmp_path} wait", "ready", f"got {sent}"]
    assert f"received {sig.name}: sending {sent} to mpirun" in err
    assert not RESTART_LINE.search(err), err


@needs_mpiexec
def test_a_job_failing_after_a_forwarded_signal_is_not_restarted(tmp_path):
    proc = start_run_sh("--max-restarts", "2", FAKE, tmp_path, "wait", "1")  # the fake exits 1 on the signal
    try:
        wait_until(lambda: "ready" in rank_log(tmp_path, 0), what="the rank to start", proc=proc)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 1, f"{proc.returncode}\n{out}\n{err}"
    assert len(launches(tmp_path)) == 1 and not RESTART_LINE.search(err), err


@needs_mpiexec
def test_one_ctrl_c_in_a_terminal_stops_the_ranks_once_with_a_checkpoint(tmp_path):
    # Ctrl-C reaches the terminal's foreground process group: run.sh alone (mpirun runs in its own group), which
    # passes it on once. Were mpirun in the group too, MPICH would take the second SIGINT as "abort now".
    env = launcher_env()
    pid, fd = pty.fork()
    if pid == 0:  # the child: run.sh on the terminal
        try:
            os.chdir(REPO)
            os.execve(RUN_SH, [RUN_SH, "-n", "2", "--max-restarts", "1", FAKE, str(tmp_path), "wait"], env)
        finally:
            os._exit(127)
    out = b""
    try:
        wait_until(lambda: both_ready(tmp_path), what="both ranks to start")
        os.write(fd, b"\x03")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the terminal closed: everyone exited
                break
            if not chunk:
                break
            out += chunk
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(fd)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    text = out.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 75, text
    for rank in (0, 1):
        assert rank_log(tmp_path, rank) == [f"launch {tmp_path} wait", "ready", f"got {forwarded('SIGINT')}"], text
    assert "force abort" not in text.replace("Press Ctrl-C again to force abort", "")



# ---- what run.sh does for Open MPI's mpirun, seen by a stand-in (tests/cluster/test_open_mpi.py runs the tests above
# under the real one)

FAKE_MPIRUN = """#!/usr/bin/env bash
if [[ "$1" == --version ]]; then echo "%s"; exit 0; fi
log="$(dirname "$0")/mpirun.log"
signals=0
for sig in TERM INT USR1; do trap "echo got $sig >> '$log'; signals=\\$(( signals + 1 ))" $sig; done
echo "ready $*" >> "$log"
while (( signals < %d )); do sleep 0.02; done
exit 75
"""


def fake_mpirun(tmp_path, version="mpirun (Open MPI) 4.1.6", signals_to_stop=1):
    """An mpirun that logs the signals it gets and exits 75 after ``signals_to_stop`` of them."""
    mpirun = tmp_path / "mpirun"
    mpirun.write_text(FAKE_MPIRUN % (version, signals_to_stop))
    mpirun.chmod(0o755)
    return mpirun, tmp_path / "mpirun.log"


def fake_openmpi(tmp_path):
    return fake_mpirun(tmp_path)


def test_for_open_mpi_the_hostfile_is_converted_and_the_environment_exported(tmp_path):
    mpirun, _ = fake_openmpi(tmp_path)
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# nodes\n node01:4 \nnode02\n")
    proc = run_sh("--dry-run", "-n", "5", "--hostfile", hostfile, SCRIPT,
                  env=launcher_env(MPIRUN=str(mpirun), TMPDIR=str(tmp_path)))
    assert proc.returncode == 0, output(proc)
    words = proc.stdout.split()
    converted = words[words.index("--hostfile") + 1]
    assert converted != str(hostfile) and os.path.dirname(converted) == str(tmp_path)
    with open(converted) as f:
        assert f.read() == "# nodes\nnode01 slots=4\nnode02\n"
    assert "-x" in words and "OMP_NUM_THREADS" in words


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_open_mpis_mpirun_is_sent_usr1_for_a_term_or_int(tmp_path, sig):
    # Open MPI's mpirun SIGKILLs the ranks a few seconds after a SIGTERM/SIGINT; SIGUSR1 it passes on as it is
    mpirun, log = fake_openmpi(tmp_path)
    proc = start_run_sh("--max-restarts", "2", SCRIPT, env=launcher_env(MPIRUN=str(mpirun)))
    try:
        wait_until(lambda: log.exists() and "ready" in log.read_text(), what="mpirun to start", proc=proc)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 75, f"{proc.returncode}\n{out}\n{err}"
    assert log.read_text().splitlines()[1:] == ["got USR1"]
    assert f"received {sig.name}: sending SIGUSR1 to mpirun" in err


def test_a_second_signal_is_passed_on_as_it_is(tmp_path):
    mpirun, log = fake_mpirun(tmp_path, "HYDRA build details:", signals_to_stop=2)  # MPICH
    proc = start_run_sh(SCRIPT, env=launcher_env(MPIRUN=str(mpirun)))
    try:
        wait_until(lambda: log.exists() and "ready" in log.read_text(), what="mpirun to start", proc=proc)
        proc.send_signal(signal.SIGTERM)
        wait_until(lambda: "got TERM" in log.read_text(), what="the first signal", proc=proc)
        time.sleep(0.5)  # run.sh back in its wait after forwarding: a signal during its trap was lost once in CI
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 75, f"{proc.returncode}\n{out}\n{err}"
    assert log.read_text().splitlines()[1:] == ["got TERM", "got INT"]
    assert "received SIGINT again: sending it to mpirun" in err
