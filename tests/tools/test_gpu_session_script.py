"""benchmarks/gpu_session.sh, the one command that checks a GPU machine, run here on a logical CPU device: its
training and generation steps start, pass their arguments through and report each step in summary.txt."""
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_session_script_runs_its_steps_and_summarises_them(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable, DEVICE="cpu:1", PHASES="runs", RUNS="tiny-fp32 generate",
               WORK=str(tmp_path / "work"), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    proc = subprocess.run(["bash", os.path.join(REPO, "benchmarks", "gpu_session.sh"), str(tmp_path / "logs")],
                          capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = (tmp_path / "logs" / "summary.txt").read_text().splitlines()
    assert [line.split(" rc=")[0] for line in summary] == ["runs tiny-fp32", "runs generate"]
    assert all(" rc=0 " in line for line in summary), summary
    runs = (tmp_path / "logs" / "runs.log").read_text()
    assert "step    20/20" in runs and "tokens in" in runs  # the run trained 20 steps; generation printed its rate
