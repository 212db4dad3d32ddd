"""What a job says before any work, under mpirun: one message however many ranks find the same problem (in the
config, or once the world is up), a preset warning once, and a read-only out_dir named before anything is built."""
import os

import pytest

from tests.distributed.mpi_jobs import needs_mpiexec, output
from tests.training.tiny_run import run, tiny_args

pytestmark = needs_mpiexec


@pytest.mark.parametrize("extra,message", [
    (["model.n_head=3"], "model.n_head: expected n_embd (64) divisible by n_head (3)"),  # found by parse_args
    (["train.total_batch_size=128"], "train.total_batch_size: expected a multiple of batch_size * sequence_length * "
                                     "world_size = 4 * 32 * 2 = 256, got 128"),  # found once the world is up
])
def test_a_config_error_is_printed_once_not_by_every_rank(data_dir, tmp_path, extra, message):
    proc = run(tiny_args(data_dir, tmp_path / "x", "train.num_iterations=1", *extra), ranks=2, check=False)
    assert proc.returncode != 0
    assert proc.stderr.count(message) == 1 and proc.stderr.count("error:") == 1, output(proc)
    assert "Traceback" not in proc.stderr and "[rank" not in proc.stderr


def test_a_preset_warning_is_printed_once(data_dir, tmp_path):
    proc = run(tiny_args(data_dir, tmp_path / "x", "train.num_iterations=1", "train.total_batch_size=256",
                         "model.preset=d12", "model.n_head=2", "model.n_embd=64", "train.val_loss_every=0"), ranks=2)
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning: model.")]
    assert [w.split(" (")[0] for w in warnings] == ["warning: model.n_layer=2 overrides model.preset=d12's 12",
                                                    "warning: model.n_head=2 overrides model.preset=d12's 12",
                                                    "warning: model.n_embd=64 overrides model.preset=d12's 768"]


def test_an_out_dir_that_cannot_be_written_stops_the_job_before_any_work(data_dir, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    proc = run(tiny_args(data_dir, blocker / "out", "train.num_iterations=1", "train.total_batch_size=256"), ranks=2,
               check=False)
    assert proc.returncode != 0
    message = f"error: out_dir: expected a directory the run can write, got '{blocker / 'out'}' ({blocker} is not a " \
              "directory)\nHINT: choose another out_dir"
    assert proc.stderr.count(message) == 1, output(proc)
    assert "Traceback" not in proc.stderr and "world " not in proc.stdout  # nothing was built or trained


def test_check_writable_names_a_read_only_checkpoints_directory(tmp_path, monkeypatch):
    import tempfile

    from infini_train.training.out_dir import check_writable
    from infini_train.training.config import ConfigError

    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    real = tempfile.mkstemp

    def read_only_checkpoints(prefix="", dir=None):  # what a read-only directory answers (root ignores mode bits)
        if dir.endswith("checkpoints"):
            raise PermissionError(13, "Permission denied")
        return real(prefix=prefix, dir=dir)

    monkeypatch.setattr(tempfile, "mkstemp", read_only_checkpoints)
    with pytest.raises(ConfigError, match=r"out_dir \(its checkpoints/\): expected a directory the run can write, got "
                                          r"'.*/run/checkpoints' \(Permission denied\)"):
        check_writable(str(out))
    assert sorted(p.name for p in out.iterdir()) == ["checkpoints"]  # the probe left nothing behind
    monkeypatch.setattr(tempfile, "mkstemp", real)
    check_writable(str(out))
    check_writable(str(tmp_path / "new" / "run"))  # made later, under a writable directory
    assert not (tmp_path / "new").exists()


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes to read-only directories")
def test_a_read_only_out_dir_is_refused(data_dir, tmp_path):
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o555)
    try:
        proc = run(tiny_args(data_dir, out, "train.num_iterations=1"), check=False)
    finally:
        out.chmod(0o755)
    assert proc.returncode != 0 and "out_dir: expected a directory the run can write" in proc.stderr, output(proc)
