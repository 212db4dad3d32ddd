"""NCCL backend on a GPU machine: 2 ranks when 2 GPUs are present, else a 1-rank NCCL group. Skipped where cupy
or a GPU is missing."""
import pytest

cupy = pytest.importorskip("cupy")

from tests.distributed.mpi_jobs import mpirun, needs_mpiexec, output  # noqa: E402


def _gpus():
    try:
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no driver / no device
        return 0


pytestmark = [pytest.mark.cuda, needs_mpiexec,
              pytest.mark.skipif(_gpus() == 0, reason="no CUDA GPU visible to cupy")]


def test_nccl_collectives_on_the_gpus():
    ranks = 2 if _gpus() >= 2 else 1
    proc = mpirun(ranks, "worker_nccl.py", timeout=300)
    assert proc.returncode == 0, output(proc)
    for rank in range(ranks):
        assert f"rank {rank} NCCL OK" in proc.stdout, output(proc)


needs_two_gpus = pytest.mark.skipif(_gpus() < 2, reason="tensor parallelism over NCCL needs a GPU per rank (2)")


@needs_two_gpus
@pytest.mark.parametrize("sequence", [False, True], ids=["tp2", "tp2-sp"])
def test_tensor_parallel_gpt2_over_nccl_is_the_whole_model(sequence):
    proc = mpirun(2, "worker_tp_state.py", "--cuda", *(["--sequence-parallel"] if sequence else []), timeout=300)
    assert proc.returncode == 0, output(proc)
    assert proc.stdout.count("tp state ok") == 2, output(proc)


@needs_two_gpus
def test_tp2_training_on_two_gpus_gives_the_losses_of_one_gpu(tmp_path):
    import numpy as np

    from tests.training.tiny_run import make_data, metrics, run, tiny_args

    data = make_data(tmp_path / "data")
    common = ["model.n_head=4", "train.num_iterations=10", "train.total_batch_size=256", "train.val_loss_every=0"]
    run(tiny_args(data, tmp_path / "one", *common, "device=cuda:0"))
    run(tiny_args(data, tmp_path / "tp2", *common, "device=cuda", "backend=nccl", "parallel.tensor=2",
                  "parallel.sequence=true"), ranks=2)
    losses = [np.array([r["loss"] for r in metrics(tmp_path / name) if "loss" in r]) for name in ("one", "tp2")]
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-4)


@needs_two_gpus
def test_pipeline_stages_over_nccl_are_the_whole_model():
    proc = mpirun(2, "worker_pipeline.py", "--cuda", timeout=300)
    assert proc.returncode == 0, output(proc)
    assert proc.stdout.count("pipeline ok") == 2, output(proc)
