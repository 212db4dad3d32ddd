"""Qwen3, Qwen3-MoE and Mixtral trained from their run configs (configs/*_tiny.yaml, shrunk): each learns, logs the
router statistics only for the MoE models, repeats bitwise, evaluates and samples during the run, and leaves a
checkpoint that generate.py and evaluate.py load; a Qwen3-MoE run resumes bitwise; two data-parallel ranks give the
losses and router statistics of one process with the same global batch; what MoE runs cannot do is refused by the
config, by message."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from infini_train.run_state import list_checkpoints, load_checkpoint
from infini_train.training.config import ConfigError, load_config
from tests.distributed.mpi_jobs import needs_mpiexec
from tests.training.tiny_run import REPO, job_env, metrics, run, same_run, tiny_args

CONFIGS = {arch: os.path.join(REPO, "configs", f"{arch}_tiny.yaml") for arch in ("qwen3", "qwen3_moe", "mixtral")}
SMALL = {"qwen3": ["model.head_dim=32", "model.intermediate_size=128"],
         "qwen3_moe": ["model.num_experts=4", "model.moe_intermediate_size=64", "model.intermediate_size=128"],
         "mixtral": ["model.num_experts=4", "model.intermediate_size=64"]}
MOE_KEYS = ("aux_loss", "expert_load_max", "experts_idle")


def _train(data_dir, out, arch, *extra, steps=6, ranks=1):
    args = tiny_args(data_dir, out, f"train.num_iterations={steps}", "train.learning_rate=3e-3", *SMALL[arch], *extra)
    return run(args, ranks=ranks, config=CONFIGS[arch])


def _values(out, key):
    return np.array([r[key] for r in metrics(out) if key in r and "loss" in r])


@pytest.mark.parametrize("arch", list(CONFIGS))
def test_tiny_config_learns_repeats_bitwise_and_its_checkpoint_generates(data_dir, tmp_path, arch):
    first, second = tmp_path / "first", tmp_path / "second"
    proc = _train(data_dir, first, arch, "train.sample_every=3", "train.sample_length=8", "train.val_loss_every=3")
    _train(data_dir, second, arch, "train.sample_every=3", "train.sample_length=8", "train.val_loss_every=3")
    losses = _values(first, "loss")
    assert len(losses) == 6 and np.isfinite(losses).all() and losses[-1] < losses[0]
    assert "--- sample at step 3 ---" in proc.stdout and "step 6: val loss" in proc.stdout
    same_run(first, second)
    records = [r for r in metrics(first) if "loss" in r]
    if arch == "qwen3":  # no router statistics for a dense model
        assert not any(k in r for r in records for k in MOE_KEYS) and "| aux" not in proc.stdout
    else:
        assert all(k in r for r in records for k in MOE_KEYS)
        assert all(np.isfinite(r["aux_loss"]) and r["aux_loss"] > 0 for r in records)
        assert all(1.0 <= r["expert_load_max"] <= 4 / 2 and 0 <= r["experts_idle"] <= 4 for r in records)
        assert "| aux " in proc.stdout and "| load max/mean " in proc.stdout
        assert [r["aux_loss"] for r in records] == [r["aux_loss"] for r in metrics(second) if "loss" in r]
    script = os.path.join(REPO, "examples", "gpt2")
    gen = subprocess.run([sys.executable, os.path.join(script, "generate.py"), "--checkpoint", str(first), "--prompt",
                          "def ", "--max-new-tokens", "8", "--temperature", "0"], capture_output=True, text=True,
                         timeout=120, env=job_env(), cwd=REPO)
    assert gen.returncode == 0 and gen.stdout.startswith("def "), gen.stderr[-2000:]
    ev = subprocess.run([sys.executable, os.path.join(script, "evaluate.py"), "--checkpoint", str(first), "--data",
                         f"{data_dir}/val_*.bin", "--max-batches", "2", "--batch-size", "4", "--seq-len", "32"],
                        capture_output=True, text=True, timeout=120, env=job_env(), cwd=REPO)
    assert ev.returncode == 0 and "perplexity" in ev.stdout, ev.stderr[-2000:]


def test_qwen3_moe_run_resumes_bitwise(data_dir, tmp_path):
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    _train(data_dir, whole, "qwen3_moe", "train.save_every=4", steps=8)
    shutil.copytree(whole, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_000008")
    proc = _train(data_dir, resumed, "qwen3_moe", "train.save_every=4", "resume=auto", steps=8)
    assert "resumed from" in proc.stdout
    same_run(whole, resumed)
    for key in MOE_KEYS:
        np.testing.assert_array_equal(_values(resumed, key), _values(whole, key), err_msg=key)


@pytest.mark.layouts
@needs_mpiexec
def test_qwen3_moe_data_parallel_equals_one_process(data_dir, tmp_path):
    """Each micro-batch routes (and balances) its own tokens, so the micro-batches match: one process runs 4 of B=2,
    each of two ranks 2 of B=2 (rank r reads the one process's micro-batches r and r + 2). Top-1 of 16 experts leaves
    some experts without a token: their gradients stay None on every rank, as in one process (DDP's
    find_unused_parameters with torch's rule), and experts used on one rank only are averaged with the other's zeros."""
    one, two = tmp_path / "one", tmp_path / "two"
    common = ["train.total_batch_size=256", "train.batch_size=2", "train.val_loss_every=0", "model.num_experts=16",
              "model.num_experts_per_tok=1", "model.moe_intermediate_size=32"]
    _train(data_dir, one, "qwen3_moe", *common)
    _train(data_dir, two, "qwen3_moe", *common, ranks=2)
    assert _values(one, "experts_idle").max() > 0
    for key in ("loss", "grad_norm") + MOE_KEYS:
        np.testing.assert_allclose(_values(two, key), _values(one, key), rtol=1e-5, err_msg=key)
    mine, _, _ = load_checkpoint(list_checkpoints(two)[-1])
    ref, _, _ = load_checkpoint(list_checkpoints(one)[-1])
    for name in ref:
        np.testing.assert_allclose(np.asarray(mine[name]), np.asarray(ref[name]), rtol=1e-4, atol=1e-5, err_msg=name)


def _errors(arch, *overrides):
    with pytest.raises(ConfigError) as info:
        load_config(CONFIGS[arch], list(overrides))
    return info.value.errors


def test_moe_model_keys_presets_and_refusals_are_config_errors():
    cfg = load_config(CONFIGS["qwen3_moe"], ["model.preset=qwen3-30b-a3b"]).model.to_model_config()
    assert (cfg.n_layers, cfg.num_experts, cfg.num_experts_per_tok, cfg.head_dim, cfg.norm_topk_prob) == (
        48, 128, 8, 128, True)
    mixtral = load_config(CONFIGS["mixtral"], ["model.preset=mixtral-8x7b", "train.sequence_length=64"])
    assert mixtral.model.to_model_config().intermediate_size == 14336 and not mixtral.warnings
    assert load_config(CONFIGS["qwen3"], ["model.preset=qwen3-0.6b"]).model.to_model_config().head_dim == 128
    tiny = load_config(CONFIGS["qwen3_moe"]).model.to_model_config()
    assert tiny.mlp_only_layers == [0] and not tiny.sparse_layer(0) and tiny.sparse_layer(1)

    assert _errors("qwen3", "model.num_experts=4", "model.mlp_only_layers=[1]") == [
        "model.num_experts: only for model.arch=qwen3_moe | mixtral | deepseek_v3 | gpt_oss, got 4 with "
        "model.arch=qwen3; HINT: set model.arch=qwen3_moe, or drop the key",
        "model.mlp_only_layers: only for model.arch=qwen3_moe, got [1] with model.arch=qwen3; HINT: set "
        "model.arch=qwen3_moe, or drop the key"]
    assert _errors("mixtral", "model.rope_scaling_factor=8")[0].startswith(
        "model.rope_scaling_factor: only for model.arch=llama3 | deepseek_v3, got 8.0 with model.arch=mixtral")
    assert _errors("qwen3_moe", "model.num_experts_per_tok=9") == [
        "model.num_experts_per_tok: expected at most num_experts (8), got 9"]
    assert _errors("qwen3_moe", "model.mlp_only_layers=[0,1,2,3]")[0].startswith(
        "model.decoder_sparse_step: no layer is sparse")
    assert _errors("qwen3_moe", "model.mlp_only_layers=[9]") == [
        "model.mlp_only_layers: expected layer indices below n_layer (4), got [9]"]
    assert _errors("qwen3_moe", "model.mlp_only_layers=first", "model.head_dim=33") == [
        "model.mlp_only_layers: expected a list of integers or null, got 'first' (str)",
        "model.head_dim: expected an even integer >= 2 (rotary embeddings rotate pairs), got 33"]
    assert _errors("qwen3_moe", "model.preset=qwen3-30b") == [
        "model.preset: expected one of ['qwen3-30b-a3b'] (model.arch=qwen3_moe) or null, got 'qwen3-30b' (did you "
        "mean 'qwen3-30b-a3b'?)"]
    assert _errors("mixtral", "model.bias=true")[0].startswith("model.bias: expected false or null for "
                                                               "model.arch=mixtral")

    refused = _errors("mixtral", "train.recompute=block", "parallel.context=2", "lora.rank=4", "parallel.tensor=2")
    assert [e.split(":")[0] for e in refused] == ["train.recompute", "parallel.context", "lora.target_modules"]
    assert "recomputing blocks is not supported for MoE models yet" in refused[0] and "HINT" in refused[0]
    assert "LoRA on experts is not supported yet" in refused[2]
    for stage in (1, 2, 3):  # (tests/training/test_moe_zero_runs.py, test_moe_layout_runs.py)
        assert load_config(CONFIGS["qwen3_moe"], [f"parallel.zero_stage={stage}"]).parallel.zero_stage == stage
        assert load_config(CONFIGS["qwen3_moe"], [f"parallel.zero_stage={stage}", "parallel.pipeline=2"])
    for stage in (2, 3):  # (ZeRO-3 x TP: tests/training/test_moe_zero_runs.py)
        assert load_config(CONFIGS["mixtral"], [f"parallel.zero_stage={stage}", "parallel.tensor=2"]).parallel.tensor
    assert _errors("qwen3_moe", "parallel.pipeline=3") == [  # stages are fine (test_moe_layout_runs.py) if equal
        "model.n_layer: expected a multiple of parallel.pipeline x parallel.virtual_pipeline = 3 x 1 = 3 (equal model "
        "chunks), got 4"]
    assert _errors("qwen3_moe", "lora.rank=4", "lora.target_modules=.*mlp.*")[0].startswith("lora.target_modules")
    load_config(CONFIGS["qwen3_moe"], ["lora.rank=4", "lora.target_modules=q_proj,v_proj"])  # attention only: fine
    assert _errors("qwen3", "parallel.tensor=2") == [
        "parallel.sequence: expected true for model.arch=qwen3 with parallel.tensor=2 (the gradients of the per-head "
        "q_norm / k_norm weights are partial sums over the tensor group, which the sequence-parallel gradient sum "
        "completes), got false; HINT: add parallel.sequence=true"]
