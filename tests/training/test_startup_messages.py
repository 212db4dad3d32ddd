"""What a job says before any work, under mpirun: one message however many ranks find the same problem (in the
config, or once the world is up), a preset warning once, and a read-only out_dir named before anything is built."""
import pytest

from tests.distributed.mpi_jobs import needs_mpiexec, output
from tests.training.tiny_run import make_data, run, tiny_args

pytestmark = needs_mpiexec


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return make_data(tmp_path_factory.mktemp("data"))


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
