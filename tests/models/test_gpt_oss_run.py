"""configs/gpt_oss_tiny.yaml through examples/gpt2/train.py: a few steps in one process (the loss falls, the
load-balancing loss and expert loads are reported, the checkpoint resumes, tools.consolidate --format hf gives a
directory transformers loads); on two ranks (TP2, TP2 with sequence parallelism, PP2, DP2 with ZeRO-1) the same
losses, gradient norms and load-balancing losses as one process; the run config's gpt-oss keys
(sliding_window, yarn_*, swiglu_*) build the model config they say, --print-config shows them, and what gpt-oss
runs do not support is refused with one clear line each."""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from infini_train.training.config import ConfigError, load_config
from tests.distributed.mpi_jobs import needs_mpiexec
from tests.training.tiny_run import REPO, metrics, run, tiny_args

CONFIG = os.path.join(REPO, "configs", "gpt_oss_tiny.yaml")
COMMON = ["model.block_size=64", "train.total_batch_size=128", "train.batch_size=2", "train.val_loss_every=0",
          "train.learning_rate=3e-3", "train.warmup_iters=0", "model.n_embd=64", "model.head_dim=16",
          "model.intermediate_size=32", "model.sliding_window=8", "model.n_layer=2"]


def _train(data_dir, out, *extra, ranks=1):
    return run(tiny_args(data_dir, out, *COMMON, *extra), ranks=ranks, config=CONFIG)


def _values(out, key):
    return np.array([r[key] for r in metrics(out) if key in r and "loss" in r])


def test_a_few_steps_in_one_process_and_resume(data_dir, tmp_path):
    out = tmp_path / "one"
    proc = _train(data_dir, out, "train.num_iterations=6", "train.save_every=3", "train.keep_last=3")
    losses = _values(out, "loss")
    assert len(losses) == 6 and np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert np.all(_values(out, "aux_loss") > 0) and "load max/mean" in proc.stdout
    again = tmp_path / "again"
    _train(data_dir, again, "train.num_iterations=6", f"resume={out}/checkpoints/step_000003")
    np.testing.assert_allclose(_values(again, "loss"), losses[3:], rtol=1e-5)
    # tools.consolidate --format hf: a directory transformers loads, with our logits
    import infini_train as it
    from transformers import GptOssForCausalLM

    hf_dir = tmp_path / "hf"
    subprocess.run([sys.executable, "-m", "infini_train.tools.consolidate", f"{out}/checkpoints/step_000006",
                    str(hf_dir), "--format", "hf"], check=True, cwd=REPO, capture_output=True)
    hf = GptOssForCausalLM.from_pretrained(hf_dir).eval()
    x = np.random.default_rng(0).integers(0, 257, (2, 40))
    ours = it.models.from_pretrained(hf_dir)(it.tensor(x))[0].numpy()
    np.testing.assert_allclose(ours, hf(torch.tensor(x)).logits.detach().numpy(), rtol=1e-5, atol=1e-5)


LAYOUTS = {"tp2": ["parallel.tensor=2"], "tp2-sp": ["parallel.tensor=2", "parallel.sequence=true"],
           "pp2": ["parallel.pipeline=2"], "dp2-zero1": ["parallel.zero_stage=1"]}


@pytest.fixture(scope="module")
def one_process(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("one")
    _train(data_dir, out, "train.num_iterations=4")
    return out


@needs_mpiexec
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_two_rank_layouts_follow_one_process(data_dir, tmp_path, one_process, layout):
    """Tensor parallelism (the heads, their biases and sinks split, the experts whole on each rank; with sequence
    parallelism each rank routing its slice), pipeline stages (the router statistics passed on) and data
    parallelism with ZeRO-1: the one process's losses, gradient norms and load-balancing losses."""
    out = tmp_path / layout
    _train(data_dir, out, "train.num_iterations=4", *LAYOUTS[layout], ranks=2)
    for key in ("loss", "grad_norm", "aux_loss"):
        np.testing.assert_allclose(_values(out, key), _values(one_process, key), rtol=1e-4, err_msg=key)


def test_run_keys_build_the_model_config():
    model = load_config(CONFIG).model.to_model_config()
    assert model.layer_types == ["sliding_attention", "full_attention"] * 2 and model.sliding_window == 16
    assert model.rope_scaling["factor"] == 4.0 and model.rope_scaling["original_max_position_embeddings"] == 32
    assert (model.num_experts, model.num_experts_per_tok, model.swiglu_limit) == (8, 2, 7.0)
    full = load_config(CONFIG, ["model.sliding_window=0", "model.yarn_factor=0"]).model.to_model_config()
    assert full.layer_types == ["full_attention"] * 4 and full.sliding_window is None and full.rope_scaling is None
    preset = load_config(CONFIG, ["model.preset=gpt-oss-tiny"] + [f"model.{k}=null" for k in (
        "n_layer", "n_head", "n_kv_head", "head_dim", "n_embd", "intermediate_size", "block_size", "rope_theta",
        "yarn_factor", "yarn_original_context", "sliding_window", "num_experts", "num_experts_per_tok",
        "router_aux_loss_coef", "rms_norm_eps", "tie_embeddings")])
    assert preset.model.to_model_config().n_layers == 4
    shown = load_config(CONFIG).model.resolved()
    assert (shown.sliding_window, shown.yarn_factor, shown.bias) == (16, 4.0, True)
    assert shown.to_model_config() == model  # --print-config loads back to the same model
    shown = load_config(CONFIG, ["model.preset=gpt-oss-20b"]).model
    assert shown.resolved().to_model_config() == shown.to_model_config()


def _errors(overrides):
    with pytest.raises(ConfigError) as info:
        load_config(CONFIG, overrides)
    return info.value.errors


def test_refusals():
    assert _errors(["parallel.expert=2"])[0].startswith("parallel.expert: expected 1 for model.arch=gpt_oss (its "
                                                        "experts are stacked tensors")
    assert _errors(["train.recompute=block"])[0].startswith("train.recompute: expected 'none' for model.arch=gpt_oss")
    assert _errors(["model.yarn_original_context=256"])[0].startswith("model.yarn_original_context: expected "
                                                                      "yarn_original_context (256) < block_size (128)")
    assert _errors(["model.moe_intermediate_size=8"])[0].startswith("model.moe_intermediate_size")
