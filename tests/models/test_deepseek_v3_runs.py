"""configs/deepseek_v3_tiny.yaml through examples/gpt2/train.py: a one-process run of a few steps (the loss falls, the
sequence-wise balance loss and the expert loads are logged, the checkpoint samples with the compressed cache), and
tensor parallelism (TP2: the heads split, the shared down-projections whole; with sequence parallelism too) and
pipeline parallelism equal to it."""
import os

import numpy as np
import pytest

from infini_train.run_state import list_checkpoints, load_checkpoint
from tests.distributed.mpi_jobs import needs_mpiexec
from tests.training.tiny_run import REPO, metrics, run

CONFIG = os.path.join(REPO, "configs", "deepseek_v3_tiny.yaml")


def _args(data_dir, out, *extra):
    return [f"out_dir={out}", f"data.train={data_dir}/train_*.bin", f"data.val={data_dir}/val_*.bin",
            "data.source=null", "train.num_iterations=6", "train.batch_size=2", "train.total_batch_size=256",
            "train.val_loss_every=0", "train.sample_every=0", "train.save_every=6", "train.log_every=1",
            "train.learning_rate=3e-3", "train.warmup_iters=0", "plot=false", "device=cpu", *extra]


def _values(out, key):
    return np.array([r[key] for r in metrics(out) if key in r and "loss" in r])


@pytest.fixture(scope="module")
def one_process(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("deepseek_one")
    proc = run(_args(data_dir, out, "train.sample_length=8", "train.sample_every=6"), config=CONFIG)
    return out, proc.stdout


def test_an_all_dense_run_is_refused():
    from infini_train.training.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="model.first_k_dense_replace: expected first_k_dense_replace \\(4\\) below "
                                          "n_layer \\(4\\)"):
        load_config(CONFIG, ["model.first_k_dense_replace=4"])


def test_the_tiny_config_trains_in_one_process(one_process):
    out, stdout = one_process
    losses = _values(out, "loss")
    assert len(losses) == 6 and losses[-1] < losses[0] - 0.5
    assert np.all(_values(out, "aux_loss") > 0)  # the sequence-wise balance loss (seq_aux_loss_alpha)
    assert "--- sample at step 6 ---" in stdout
    weights, _, _ = load_checkpoint(list_checkpoints(out)[-1])
    assert "model.layers.1.mlp.gate.e_score_correction_bias" in weights
    assert "model.layers.0.self_attn.kv_b_proj.weight" in weights and "model.layers.0.mlp.gate_proj.weight" in weights
    bias = np.asarray(weights["model.layers.1.mlp.gate.e_score_correction_bias"])
    assert np.abs(bias).max() > 0  # updated after each step from the expert loads


@pytest.mark.layouts
@needs_mpiexec
@pytest.mark.parametrize("layout", ["parallel.tensor=2", "parallel.pipeline=2"])
def test_tensor_and_pipeline_parallel_give_the_one_process_run(data_dir, one_process, tmp_path, layout):
    """TP2 (the heads split) and PP2 (the second stage's routers with the one process's correction biases)."""
    out = tmp_path / "run"
    proc = run(_args(data_dir, out, layout), ranks=2, config=CONFIG)
    assert ("tensor parallel 2" if "tensor" in layout else "pipeline 2") in proc.stdout
    for key in ("loss", "grad_norm", "aux_loss"):
        np.testing.assert_allclose(_values(out, key), _values(one_process[0], key), rtol=1e-4, err_msg=key)
    mine, _, _ = load_checkpoint(list_checkpoints(out)[-1])
    ref, _, _ = load_checkpoint(list_checkpoints(one_process[0])[-1])
    assert sorted(mine) == sorted(ref)
    for name in ref:
        np.testing.assert_allclose(np.asarray(mine[name]), np.asarray(ref[name]), rtol=1e-4, atol=2e-4, err_msg=name)


def test_a_pretrained_run_consolidates_to_a_directory_transformers_loads(data_dir, tmp_path):
    """model.pretrained = an HF directory, two steps, ``tools.consolidate --format hf``: transformers loads the result
    and its logits are ours."""
    import subprocess
    import sys

    import torch
    from transformers import DeepseekV3ForCausalLM

    import infini_train as it

    from .deepseek_v3_setup import hf_config

    torch.manual_seed(0)
    DeepseekV3ForCausalLM(hf_config(vocab_size=257, max_position_embeddings=64)).save_pretrained(tmp_path / "hf")
    config = tmp_path / "run.yaml"
    config.write_text(f"model:\n  arch: deepseek_v3\n  pretrained: {tmp_path / 'hf'}\n")
    out = tmp_path / "run"
    run(_args(data_dir, out, "train.num_iterations=2", "train.sequence_length=32", "train.save_every=2"),
        config=str(config))
    subprocess.run([sys.executable, "-m", "infini_train.tools.consolidate", "--format", "hf",
                    list_checkpoints(out)[-1], str(tmp_path / "back")], check=True, cwd=REPO, capture_output=True)
    theirs = DeepseekV3ForCausalLM.from_pretrained(tmp_path / "back", experts_implementation="eager").eval()
    ours = it.models.from_pretrained(tmp_path / "back")
    x = np.arange(12).reshape(2, 6) * 7 % 257
    np.testing.assert_allclose(ours(it.tensor(x))[0].numpy(), theirs(torch.tensor(x)).logits.detach().numpy(),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.layouts
@needs_mpiexec
@pytest.mark.parametrize("q_lora_rank", [64, 0], ids=["q_lora", "direct_q"])
def test_sequence_parallel_gives_the_one_process_run(data_dir, tmp_path, q_lora_rank):
    """TP2 with sequence parallelism: each rank's slice through the shared down-projections, the rope key gathered,
    the sequence-wise balance loss pooled over the slices."""
    extra = (f"model.q_lora_rank={q_lora_rank}",)
    run(_args(data_dir, tmp_path / "one", *extra), config=CONFIG)
    proc = run(_args(data_dir, tmp_path / "sp", *extra, "parallel.tensor=2", "parallel.sequence=true"), ranks=2,
               config=CONFIG)
    assert "with sequence parallel" in proc.stdout
    for key in ("loss", "grad_norm", "aux_loss", "expert_load_max"):
        np.testing.assert_allclose(_values(tmp_path / "sp", key), _values(tmp_path / "one", key), rtol=1e-4,
                                   err_msg=key)
    mine, _, _ = load_checkpoint(list_checkpoints(tmp_path / "sp")[-1])
    ref, _, _ = load_checkpoint(list_checkpoints(tmp_path / "one")[-1])
    for name in ref:
        np.testing.assert_allclose(np.asarray(mine[name]), np.asarray(ref[name]), rtol=1e-4, atol=2e-4, err_msg=name)
