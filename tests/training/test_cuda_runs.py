"""train.py on a GPU (cupy): the tiny GPT-2, LLaMA and Qwen3-MoE on cuda:0 against the same runs on the CPU, in
float32 and under bfloat16 / float16 autocast, dropout on the GPU's generator, and resume on the GPU. Marked cuda:
skipped without cupy and a GPU."""
import os
import shutil

import numpy as np
import pytest

import infini_train as it
from tests.training.tiny_run import REPO, grad_norms, losses_by_step, run, same_run, tiny_args

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


ARCHS = {  # config -> the tiny shape's overrides
    "llama3_tiny": ("model.n_kv_head=1", "model.intermediate_size=128", "model.rope_original_context=16"),
    "qwen3_moe_tiny": ("model.n_kv_head=1", "model.head_dim=32", "model.intermediate_size=128",
                       "model.moe_intermediate_size=32", "model.num_experts=4"),
}


@pytest.mark.parametrize("precision,rtol", [("fp32", 1e-4), ("bf16-mixed", 2e-2), ("fp16-mixed", 5e-3)])
@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_llama_and_qwen3_moe_on_the_gpu_give_the_cpu_losses(data_dir, tmp_path, arch, precision, rtol):
    config = os.path.join(REPO, "configs", f"{arch}.yaml")
    cpu, gpu = tmp_path / "cpu", tmp_path / "gpu"
    args = (*COMMON, *ARCHS[arch], f"precision={precision}")
    run(tiny_args(data_dir, cpu, *args), config=config)
    run(tiny_args(data_dir, gpu, *args, "device=cuda:0"), config=config)
    on_cpu, on_gpu = losses_by_step(cpu), losses_by_step(gpu)
    assert sorted(on_gpu) == sorted(on_cpu) == list(range(8))
    np.testing.assert_allclose(_ordered(on_gpu), _ordered(on_cpu), rtol=rtol)
    assert on_gpu[7] < on_gpu[0]


@pytest.mark.parametrize("arch,layout", [("qwen3_moe_tiny", "parallel.expert=2"),
                                         ("qwen3_moe_tiny", "parallel.zero_stage=3"),
                                         ("gpt2_tiny", "parallel.context=2")], ids=["ep2", "zero3-moe", "cp2-ring"])
def test_two_ranks_sharing_the_gpu_give_the_one_process_cpu_losses(data_dir, tmp_path, arch, layout):
    """The experts' all-to-all, ZeRO-3's gathers and ring attention's exchanges on GPU arrays (two ranks over MPI:
    NCCL refuses two ranks per GPU), against one process on the CPU with the same global batch."""
    config = os.path.join(REPO, "configs", f"{arch}.yaml")
    args = (*COMMON, *ARCHS.get(arch, ()), "train.total_batch_size=256")
    run(tiny_args(data_dir, tmp_path / "one", *args), config=config)
    run(tiny_args(data_dir, tmp_path / "two", *args, layout, "device=cuda:0", "backend=mpi"), ranks=2, config=config)
    np.testing.assert_allclose(_ordered(losses_by_step(tmp_path / "two")), _ordered(losses_by_step(tmp_path / "one")),
                               rtol=1e-4)


def test_resume_on_the_gpu_is_bitwise_the_uninterrupted_run(data_dir, tmp_path):
    common = ["train.num_iterations=8", "train.save_every=4", "train.keep_last=2", "model.dropout=0.1",
              "train.val_loss_every=4", "device=cuda:0"]
    full, part = tmp_path / "full", tmp_path / "part"
    run(tiny_args(data_dir, full, *common))
    shutil.copytree(full, part)
    shutil.rmtree(part / "checkpoints" / "step_000008")
    run(tiny_args(data_dir, part, *common, "resume=auto"))
    same_run(full, part)
