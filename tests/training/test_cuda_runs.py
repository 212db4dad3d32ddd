"""train.py on a GPU (cupy): the tiny GPT-2 on cuda:0 against the same run on the CPU, in float32 and under
bfloat16 / float16 autocast, dropout on the GPU's generator, and resume on the GPU. Marked cuda: skipped without
cupy and a GPU."""
import shutil

import numpy as np
import pytest

import infini_train as it
from tests.training.tiny_run import grad_norms, losses_by_step, run, same_run, tiny_args

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not it.backend.cuda_available(), reason="needs cupy and an NVIDIA GPU")]

COMMON = ("train.num_iterations=8", "train.val_loss_every=4")


def _ordered(losses):
    return [losses[s] for s in sorted(losses)]


@pytest.mark.parametrize("precision,rtol", [("fp32", 1e-4), ("bf16-mixed", 2e-2), ("fp16-mixed", 5e-3)])
def test_the_tiny_run_on_the_gpu_gives_the_cpu_losses(data_dir, tmp_path, precision, rtol):
    cpu, gpu = tmp_path / "cpu", tmp_path / "gpu"
    run(tiny_args(data_dir, cpu, *COMMON, f"precision={precision}"))
    proc = run(tiny_args(data_dir, gpu, *COMMON, f"precision={precision}", "device=cuda:0"))
    assert "1 GPU: " in proc.stdout  # the MFU line names the GPU's peak: the run computed there
    on_cpu, on_gpu = losses_by_step(cpu), losses_by_step(gpu)
    assert sorted(on_gpu) == sorted(on_cpu) == list(range(8))
    np.testing.assert_allclose(_ordered(on_gpu), _ordered(on_cpu), rtol=rtol)
    np.testing.assert_allclose(grad_norms(gpu), grad_norms(cpu), rtol=10 * rtol)
    assert on_gpu[7] < on_gpu[0]


def test_resume_on_the_gpu_is_bitwise_the_uninterrupted_run(data_dir, tmp_path):
    common = ["train.num_iterations=8", "train.save_every=4", "train.keep_last=2", "model.dropout=0.1",
              "train.val_loss_every=4", "device=cuda:0"]
    full, part = tmp_path / "full", tmp_path / "part"
    run(tiny_args(data_dir, full, *common))
    shutil.copytree(full, part)
    shutil.rmtree(part / "checkpoints" / "step_000008")
    run(tiny_args(data_dir, part, *common, "resume=auto"))
    same_run(full, part)
