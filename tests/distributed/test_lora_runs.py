"""LoRA fine-tuning runs (the ``lora`` config section). From a checkpoint trained on Python source, a fine-tune on
other text lowers the validation loss while every base weight stays bitwise unchanged. DDP (with ZeRO) and tensor
parallelism give the one-process losses. Checkpoints hold only the adapters and a reference to the base, resume
bitwise and load (merged) in generate.py. The PEFT adapter written at the end loads with the peft library onto the
Hugging Face base model and gives our logits. Bad settings are refused."""
import json
import os
import random
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

import infini_train as it
from infini_train.data.corpus import prepare_shards
from infini_train.models.gpt2 import GPT2
from infini_train.run_state import list_checkpoints, load_checkpoint
from tests.distributed.mpi_jobs import REPO, job_env, mpirun, needs_mpiexec, output
from tests.training.tiny_run import metrics, run, same_run, tiny_args

pytestmark = needs_mpiexec

LORA = ["lora.rank=4", "lora.alpha=8", "train.learning_rate=1e-2", "train.warmup_iters=0", "train.val_loss_every=0",
        "train.sample_every=0", "train.total_batch_size=256"]


@pytest.fixture(scope="module")
def tune_dir(tmp_path_factory):
    """The fine-tuning corpus: words the base model never saw, in a fixed 4096-token validation split."""
    rng = random.Random(0)
    words = "alpha beta gamma delta epsilon zeta eta theta".split()
    out = tmp_path_factory.mktemp("tune")
    prepare_shards([" ".join(rng.choice(words) for _ in range(20000))], str(out), "byte", val_tokens=4096)
    return out


@pytest.fixture(scope="module")
def base(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("base")
    run(tiny_args(data_dir, out, "train.num_iterations=60", "train.total_batch_size=256"))
    return out


def _lora(tune_dir, base, out, ranks=1, *extra, steps=24):
    return run(tiny_args(tune_dir, out, f"train.num_iterations={steps}", *LORA, f"lora.init_from={base}", *extra),
               ranks=ranks)


def _losses(out):
    return np.array([r["loss"] for r in metrics(out) if "loss" in r])


@pytest.fixture(scope="module")
def single(tune_dir, base, tmp_path_factory):
    out = tmp_path_factory.mktemp("lora")
    proc = _lora(tune_dir, base, out, 1, "train.val_loss_every=12")
    return out, proc


def _rebuilt(out):
    """The LoRA run's model as generate.py builds it (base + adapters), without merging."""
    from infini_train.models import registry
    from infini_train.models.pretrained import mapped_pretrained
    from infini_train.run_state.lora_base import rebuild

    adapters, _, state = load_checkpoint(list_checkpoints(out)[-1])
    model = registry.build(state["arch"], state["model_config"])
    return rebuild(model, state["lora"], adapters, mapped_pretrained), adapters, state


def test_loss_falls_and_the_base_weights_stay_bitwise_unchanged(single, base):
    out, proc = single
    val = [r["val_loss"] for r in metrics(out) if "val_loss" in r]
    assert len(val) == 3 and val[-1] < val[0] - 0.15, val
    model, adapters, state = _rebuilt(out)
    assert adapters and all(k.endswith(("lora_A.weight", "lora_B.weight")) for k in adapters)
    assert state["lora"]["base"] == os.path.abspath(str(base)) and state["lora"]["rank"] == 4
    base_weights, _, _ = load_checkpoint(list_checkpoints(base)[-1])
    ours = model.state_dict()
    for name, value in base_weights.items():
        wrapped = name.replace(".weight", ".base_layer.weight").replace(".bias", ".base_layer.bias")
        got = ours[name] if name in ours else ours[wrapped]
        assert np.array_equal(got.numpy(), np.asarray(value)), name
    assert any(np.abs(v).max() > 0 for k, v in adapters.items() if "lora_B" in k)  # the adapters did train
    assert "adapter (PEFT format)" in proc.stdout and os.path.exists(out / "adapter" / "adapter_config.json")


@pytest.mark.layouts
@pytest.mark.parametrize("ranks,extra", [
    (2, ["train.batch_size=2"]), (2, ["train.batch_size=2", "parallel.zero_stage=2"]), (2, ["parallel.tensor=2"]),
    (2, ["parallel.tensor=2", "parallel.sequence=true"]), (2, ["train.batch_size=2", "parallel.zero_stage=3"]),
    (4, ["train.batch_size=1", "parallel.zero_stage=3", "parallel.data_replicate=2"])],
    ids=["ddp2", "ddp2-zero2", "tp2", "tp2-sp", "zero3x2", "hsdp2x2"])
def test_lora_runs_in_parallel_give_the_one_process_losses(tune_dir, base, single, tmp_path, ranks, extra):
    out = tmp_path / "run"
    _lora(tune_dir, base, out, ranks, *extra, "train.val_loss_every=12")
    np.testing.assert_allclose(_losses(out), _losses(single[0]), rtol=1e-4)
    adapters, _, _ = load_checkpoint(list_checkpoints(out)[-1])
    ref, _, _ = load_checkpoint(list_checkpoints(single[0])[-1])
    assert sorted(adapters) == sorted(ref)
    for k in ref:
        np.testing.assert_allclose(np.asarray(adapters[k]), np.asarray(ref[k]), rtol=1e-3, atol=1e-5, err_msg=k)


@pytest.mark.parametrize("ranks,extra", [(1, []), (2, ["parallel.tensor=2", "parallel.zero_stage=1"])],
                         ids=["single", "tp2-zero1"])
def test_lora_run_resumes_bitwise_and_loads_in_generate(tune_dir, base, tmp_path, ranks, extra):
    extra = ["lora.dropout=0.1", "train.save_every=5", *extra]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    _lora(tune_dir, base, whole, ranks, *extra, steps=10)
    shutil.copytree(whole, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_000010")
    proc = _lora(tune_dir, base, resumed, ranks, *extra, "resume=auto", steps=10)
    assert "at step 5" in proc.stdout
    same_run(whole, resumed)
    gen = subprocess.run([sys.executable, os.path.join(REPO, "examples", "gpt2", "generate.py"), "--checkpoint",
                          str(whole), "--prompt", "beta ", "--max-new-tokens", "10", "--temperature", "0"],
                         capture_output=True, text=True, timeout=120, env=job_env(), cwd=REPO)
    assert gen.returncode == 0 and gen.stdout.startswith("beta "), output(gen)


def test_the_run_adapter_loads_in_peft_onto_the_hf_base_model(tune_dir, tmp_path):
    from peft import PeftModel
    from transformers import GPT2Config as HFConfig
    from transformers import GPT2LMHeadModel

    torch.manual_seed(0)
    hf = GPT2LMHeadModel(HFConfig(vocab_size=257, n_positions=32, n_embd=64, n_layer=2, n_head=2)).eval()
    hf.save_pretrained(tmp_path / "hf")
    out = tmp_path / "lora"
    _lora(tune_dir, tmp_path / "hf", out, 1, "lora.target_modules=c_attn,c_fc", steps=4)
    config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(tmp_path / "hf") and config["fan_in_fan_out"] is True
    peft_model = PeftModel.from_pretrained(hf, str(out / "adapter")).eval()
    ours, _, _ = _rebuilt(out)
    ours.eval()
    x = np.random.default_rng(0).integers(0, 257, (2, 16))
    np.testing.assert_allclose(ours(it.tensor(x))[0].numpy(), peft_model(torch.tensor(x)).logits.detach().numpy(),
                               rtol=1e-4, atol=1e-5)
    assert isinstance(ours, GPT2)


@pytest.mark.parametrize("extra,message", [
    (["parallel.pipeline=2", "model.n_layer=2"], "lora.rank: LoRA runs with data and tensor parallelism, not "
                                                 "pipeline stages"),
    (["lora.init_from=/nonexistent/base"], "lora.init_from: expected an existing HF directory, llm.c .bin or "
                                           "checkpoint path, got '/nonexistent/base'"),
    (["lora.target_modules=c_atn"], "lora.target_modules:"),
])
def test_bad_lora_settings_are_refused(data_dir, tmp_path, extra, message):
    proc = run(tiny_args(data_dir, tmp_path / "x", "train.num_iterations=1", "lora.rank=4", *extra), check=False)
    assert proc.returncode != 0 and message in proc.stderr, output(proc)


def test_each_rank_reads_only_its_pieces_of_imported_base_weights(tmp_path):
    proc = mpirun(2, "worker_lora_pieces.py", str(tmp_path), timeout=180)
    assert proc.returncode == 0, output(proc)
    assert proc.stdout.count("lora pieces ok") == 2, output(proc)
