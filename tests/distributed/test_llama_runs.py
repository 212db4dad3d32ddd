"""LLaMA-3 training runs (model.arch=llama3) with everything GPT-2 runs have: one process against DP2 with ZeRO-2,
TP2 with sequence parallelism, and PP2 x TP2 interleaved with a tied embedding (rtol 1e-4); mixed precision; a
dropout run that resumes bitwise; and a checkpoint that generate.py and evaluate.py load."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from infini_train.run_state import list_checkpoints, load_checkpoint
from tests.distributed.mpi_jobs import REPO, job_env, needs_mpiexec, output
from tests.training.tiny_run import metrics, run, same_run, tiny_args

pytestmark = [needs_mpiexec, pytest.mark.layouts]

LLAMA = ["model.arch=llama3", "model.n_layer=4", "model.n_head=4", "model.n_kv_head=2", "model.intermediate_size=128",
         "model.rope_scaling_factor=8", "model.rope_original_context=16", "train.total_batch_size=512",
         "train.grad_clip=0.5", "train.learning_rate=3e-3", "train.val_loss_every=5", "train.sample_every=0"]


def _train(data_dir, out, ranks, *extra, steps=10):
    return run(tiny_args(data_dir, out, f"train.num_iterations={steps}", *LLAMA, *extra), ranks=ranks)


def _values(out, key):
    return np.array([r[key] for r in metrics(out) if key in r])


@pytest.fixture(scope="module")
def single(data_dir, tmp_path_factory):
    runs = {}
    for tie in (False, True):
        out = tmp_path_factory.mktemp(f"single-tie{tie}")
        _train(data_dir, out, 1, f"model.tie_embeddings={str(tie).lower()}")
        runs[tie] = out
    return runs


def test_one_process_llama_run_learns_and_its_checkpoint_is_an_hf_shaped_llama(single):
    losses = _values(single[False], "loss")
    assert losses[-1] < losses[0] - 0.3
    state, _, meta = load_checkpoint(list_checkpoints(single[False])[-1])
    assert meta["arch"] == "llama3" and meta["model_config"]["n_kv_heads"] == 2
    assert state["model.layers.0.self_attn.k_proj.weight"].shape == (32, 64)  # 2 kv heads x head_dim 16
    assert "lm_head.weight" in state and "model.norm.weight" in state


LAYOUTS = {
    "dp2-zero2": (2, False, ["parallel.zero_stage=2", "train.batch_size=2"]),
    "tp2-sp": (2, False, ["parallel.tensor=2", "parallel.sequence=true"]),
    "pp2xtp2-interleaved-tied": (4, True, ["parallel.pipeline=2", "parallel.tensor=2", "parallel.virtual_pipeline=2",
                                           "parallel.pipeline_schedule=interleaved"]),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_llama_layout_gives_the_losses_and_weights_of_one_process(data_dir, single, tmp_path, layout):
    ranks, tie, extra = LAYOUTS[layout]
    out = tmp_path / layout
    _train(data_dir, out, ranks, f"model.tie_embeddings={str(tie).lower()}", *extra)
    one = single[tie]
    for key in ("loss", "grad_norm") + (("val_loss",) if "dp2" not in layout else ()):
        np.testing.assert_allclose(_values(out, key), _values(one, key), rtol=1e-4, err_msg=key)
    mine, _, _ = load_checkpoint(list_checkpoints(out)[-1])
    ref, _, _ = load_checkpoint(list_checkpoints(one)[-1])
    assert list(mine) == list(ref)
    for name in ref:
        np.testing.assert_allclose(np.asarray(mine[name]), np.asarray(ref[name]), rtol=1e-3, atol=2e-5, err_msg=name)


def test_mixed_precision_llama_run_follows_fp32(data_dir, single, tmp_path):
    out = tmp_path / "bf16"
    _train(data_dir, out, 1, "precision=bf16-mixed", steps=10)
    np.testing.assert_allclose(_values(out, "loss"), _values(single[False], "loss"), rtol=3e-2)


def test_llama_dropout_run_resumes_bitwise_under_tensor_parallelism(data_dir, tmp_path):
    extra = ["model.dropout=0.1", "parallel.tensor=2", "train.save_every=4"]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    _train(data_dir, whole, 2, *extra, steps=8)
    shutil.copytree(whole, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_000008")
    _train(data_dir, resumed, 2, *extra, "resume=auto", steps=8)
    same_run(whole, resumed)


def test_generate_and_evaluate_load_a_llama_checkpoint(data_dir, single):
    script = os.path.join(REPO, "examples", "gpt2")
    ckpt = str(single[True])
    gen = subprocess.run([sys.executable, os.path.join(script, "generate.py"), "--checkpoint", ckpt, "--prompt",
                          "def ", "--max-new-tokens", "20", "--temperature", "0"], capture_output=True, text=True,
                         timeout=120, env=job_env(), cwd=REPO)
    assert gen.returncode == 0 and gen.stdout.startswith("def "), output(gen)
    ev = subprocess.run([sys.executable, os.path.join(script, "evaluate.py"), "--checkpoint", ckpt, "--data",
                         f"{data_dir}/val_*.bin", "--max-batches", "2", "--batch-size", "4", "--seq-len", "32"],
                        capture_output=True, text=True, timeout=120, env=job_env(), cwd=REPO)
    assert ev.returncode == 0 and "perplexity" in ev.stdout, output(ev)
