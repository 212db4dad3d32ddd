"""configs/deepseek_v3_tiny.yaml with multi-token prediction on (model.num_nextn_predict_layers=2) through
examples/gpt2/train.py: a one-process run logs mtp_loss per step and its loss falls; its checkpoint holds the MTP
modules; PP2 (the MTP modules on the last stage, with the input tokens and a copy of the embedding whose gradient is
summed with the first stage's), EP2, DP2 ZeRO-1, TP2, TP2+SP and TP2xPP2 equal it over a few steps."""
import os
import shutil

import numpy as np
import pytest

from infini_train.run_state import list_checkpoints, load_checkpoint
from tests.distributed.mpi_jobs import needs_mpiexec
from tests.training.tiny_run import REPO, metrics, run

CONFIG = os.path.join(REPO, "configs", "deepseek_v3_tiny.yaml")
MTP = ("model.num_nextn_predict_layers=2", "train.mtp_loss_weight=0.3")


def _args(data_dir, out, *extra, mtp=MTP):
    # (lr 1e-3: at 3e-3 a token's expert choice in a near tie flips between the one-process and TP2 rounding by
    # step 3, and the runs part at 1e-5; in float64 and at 1e-3 they agree to 1e-7)
    return [f"out_dir={out}", f"data.train={data_dir}/train_*.bin", f"data.val={data_dir}/val_*.bin",
            "data.source=null", "train.num_iterations=4", "train.batch_size=2", "train.total_batch_size=256",
            "train.val_loss_every=0", "train.sample_every=0", "train.save_every=4", "train.log_every=1",
            "train.learning_rate=1e-3", "train.warmup_iters=0", "plot=false", "device=cpu", *mtp, *extra]


def _values(out, key):
    return np.array([r[key] for r in metrics(out) if key in r and "loss" in r])


@pytest.fixture(scope="module")
def one_process(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("deepseek_mtp_one")
    proc = run(_args(data_dir, out), config=CONFIG)
    return out, proc.stdout


def test_the_tiny_config_with_mtp_trains_in_one_process(one_process):
    out, stdout = one_process
    losses, mtp = _values(out, "loss"), _values(out, "mtp_loss")
    assert len(losses) == 4 and len(mtp) == 4 and losses[-1] < losses[0]
    assert np.all(mtp > 0) and mtp[-1] < mtp[0] and "| mtp " in stdout
    weights, _, _ = load_checkpoint(list_checkpoints(out)[-1])
    for name in ("mtp.0.enorm.weight", "mtp.1.hnorm.weight", "mtp.1.eh_proj.weight", "mtp.0.shared_head.norm.weight",
                 "mtp.1.self_attn.kv_b_proj.weight", "mtp.1.mlp.gate.e_score_correction_bias"):
        assert name in weights, name
    # the MTP block's router is balanced as the others are
    assert np.abs(np.asarray(weights["mtp.0.mlp.gate.e_score_correction_bias"])).max() > 0


def test_the_mtp_loss_weight_is_checked():
    from infini_train.training.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="train.mtp_loss_weight"):
        load_config(CONFIG, [*MTP, "train.mtp_loss_weight=-1"])


@pytest.mark.layouts
@needs_mpiexec
@pytest.mark.parametrize("layout", [
    "parallel.pipeline=2", "parallel.expert=2", "parallel.zero_stage=1", "parallel.tensor=2",
    "parallel.tensor=2 parallel.sequence=true", "parallel.tensor=2 parallel.pipeline=2",
    "parallel.pipeline=2 parallel.virtual_pipeline=2 parallel.pipeline_schedule=interleaved"])
def test_parallel_layouts_with_mtp_give_the_one_process_run(data_dir, one_process, tmp_path, layout):
    """PP2: the MTP modules on the last stage (of the last chunk with virtual stages); EP2: the MTP block's experts
    split over the expert group too; DP2 with ZeRO-1; TP2 (the MTP blocks split as the others, the vocab-parallel
    embedding and head shared), with sequence parallelism too."""
    out = tmp_path / "run"
    run(_args(data_dir, out, *layout.split()), ranks=4 if "tensor=2 parallel.pipeline" in layout else 2,
        config=CONFIG)
    for key in ("loss", "mtp_loss", "grad_norm", "aux_loss"):
        np.testing.assert_allclose(_values(out, key), _values(one_process[0], key), rtol=1e-4, err_msg=key)
    mine, _, _ = load_checkpoint(list_checkpoints(out)[-1])  # (the last stage's embedding copy is not saved apart)
    ref, _, _ = load_checkpoint(list_checkpoints(one_process[0])[-1])
    assert sorted(mine) == sorted(ref)
    for name in ref:
        np.testing.assert_allclose(np.asarray(mine[name]), np.asarray(ref[name]), rtol=1e-4, atol=2e-4, err_msg=name)


@needs_mpiexec
def test_a_pipeline_checkpoint_with_mtp_resumes_on_one_process(data_dir, tmp_path):
    """PP2's checkpoint (the MTP modules from the last stage, its embedding copy not saved apart) resumes in one
    process: the resumed steps give PP2's losses and MTP losses."""
    pp2, resumed = tmp_path / "pp2", tmp_path / "resumed"
    run(_args(data_dir, pp2, "parallel.pipeline=2", "train.num_iterations=6", "train.save_every=3"), ranks=2,
        config=CONFIG)
    shutil.copytree(pp2, resumed)
    shutil.rmtree(list_checkpoints(resumed)[-1])
    log = resumed / "metrics.jsonl"  # (the steps after the checkpoint: the resumed run's own)
    log.write_text("".join(line for line in log.read_text().splitlines(True) if '"step": 3' not in line
                           and '"step": 4' not in line and '"step": 5' not in line))
    proc = run(_args(data_dir, resumed, "train.num_iterations=6", "train.save_every=3", "resume=auto"),
               config=CONFIG)
    assert "resumed from" in proc.stdout
    assert [r["step"] for r in metrics(resumed) if "loss" in r] == list(range(6))
    for key in ("loss", "mtp_loss", "grad_norm"):
        np.testing.assert_allclose(_values(resumed, key)[-3:], _values(pp2, key)[-3:], rtol=1e-4, err_msg=key)


def test_a_pretrained_run_with_mtp_consolidates_to_deepseeks_names(data_dir, tmp_path):
    """model.pretrained = a directory with DeepSeek's MTP layers: the run trains them (mtp_loss logged) and
    ``tools.consolidate --format hf`` writes them back under model.layers.{N+k}; transformers loads the main model."""
    import subprocess
    import sys

    import torch
    from transformers import DeepseekV3ForCausalLM

    import infini_train as it
    from infini_train.safetensors_io import read_header

    from .test_deepseek_v3_mtp import N, mtp_pair

    _, _, _, directory = mtp_pair(tmp_path, 1, vocab_size=257, max_position_embeddings=64)
    config = tmp_path / "run.yaml"
    config.write_text(f"model:\n  arch: deepseek_v3\n  pretrained: {directory}\n")
    out = tmp_path / "run"
    run(_args(data_dir, out, "train.num_iterations=2", "train.sequence_length=32", "train.save_every=2", mtp=()),
        config=str(config))
    assert len(_values(out, "mtp_loss")) == 2
    subprocess.run([sys.executable, "-m", "infini_train.tools.consolidate", "--format", "hf",
                    list_checkpoints(out)[-1], str(tmp_path / "back")], check=True, cwd=REPO, capture_output=True)
    names = set(read_header(str(tmp_path / "back" / "model.safetensors"))[0])
    assert names == set(read_header(str(directory / "model.safetensors"))[0])
    ours = it.models.from_pretrained(tmp_path / "back")
    assert len(ours.mtp) == 1 and f"model.layers.{N}.eh_proj.weight" in names
    theirs = DeepseekV3ForCausalLM.from_pretrained(tmp_path / "back", experts_implementation="eager").eval()
    x = np.arange(12).reshape(2, 6) * 7 % 257
    ours.eval()
    np.testing.assert_allclose(ours(it.tensor(x))[0].numpy(), theirs(torch.tensor(x)).logits.detach().numpy(),
                               rtol=1e-5, atol=1e-5)


def test_bf16_mixed_with_mtp_follows_float32(data_dir, one_process, tmp_path):
    out = tmp_path / "bf16"
    run(_args(data_dir, out, "precision=bf16-mixed", "train.save_every=0"), config=CONFIG)
    for key, rtol in (("loss", 2e-3), ("mtp_loss", 2e-3), ("grad_norm", 1e-2)):
        np.testing.assert_allclose(_values(out, key), _values(one_process[0], key), rtol=rtol, err_msg=key)


@pytest.mark.layouts
@needs_mpiexec
def test_tied_embeddings_with_mtp_under_pp2_give_the_one_process_run(data_dir, tmp_path):
    """Tied: the last stage's output-layer copy is the MTP modules' embedding too."""
    tied = "model.tie_embeddings=true"
    run(_args(data_dir, tmp_path / "one", tied), config=CONFIG)
    run(_args(data_dir, tmp_path / "pp2", tied, "parallel.pipeline=2"), ranks=2, config=CONFIG)
    for key in ("loss", "mtp_loss", "grad_norm"):
        np.testing.assert_allclose(_values(tmp_path / "pp2", key), _values(tmp_path / "one", key), rtol=1e-4,
                                   err_msg=key)
