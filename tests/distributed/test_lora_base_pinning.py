"""A LoRA run's adapters stay tied to the base they were trained on, and its outputs are never lost:

- the checkpoint records the base source actually read (a run's out_dir resolves to its step directory) and a
  SHA-256 of the base values; evaluate.py, generate.py and resume use that base even after the base run wrote newer
  checkpoints, and refuse a base that was replaced;
- resuming with a config whose lora section is missing or differs is one message;
- a run that ends with its final model writes out_dir/adapter even when the resume had nothing left to train;
- generate.py splits a LoRA checkpoint over tensor-parallel ranks (GPT-2 and LLaMA) and gives the one-process
  tokens; a rank count the heads cannot be split over names mpirun's -n.
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from infini_train.run_state import list_checkpoints, load_checkpoint
from tests.distributed.mpi_jobs import MPIEXEC, REPO, job_env, needs_mpiexec, output
from tests.distributed.test_lora_runs import LORA, base, tune_dir  # noqa: F401 (fixtures)
from tests.distributed.test_llama_runs import LLAMA
from tests.training.tiny_run import run, tiny_args

pytestmark = needs_mpiexec
SCRIPTS = os.path.join(REPO, "examples", "gpt2")


def _lora(tune_dir, init_from, out, *extra, steps=6, ranks=1, check=True):  # noqa: F811
    return run(tiny_args(tune_dir, out, f"train.num_iterations={steps}", *LORA, f"lora.init_from={init_from}",
                         *extra), ranks=ranks, check=check)


def script(name, *args, ranks=1):
    cmd = [sys.executable, os.path.join(SCRIPTS, name), *args]
    if ranks > 1:
        cmd = [MPIEXEC, "-n", str(ranks), *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO, env=job_env())


def _val_loss(out, tune_dir):  # noqa: F811
    proc = script("evaluate.py", "--checkpoint", str(out), "--data", f"{tune_dir}/val_*.bin", "--batch-size", "2",
                  "--seq-len", "32", "--max-batches", "4")
    assert proc.returncode == 0, output(proc)
    return float(proc.stdout.split("loss ")[1].split()[0])


@pytest.fixture(scope="module")
def moving_base(base, tmp_path_factory):  # noqa: F811
    """A copy of the base run that can train on after the fine-tune started from it."""
    out = tmp_path_factory.mktemp("moving") / "base"
    shutil.copytree(base, out)
    return out


def test_a_base_run_that_trains_on_does_not_change_the_fine_tunes_base(data_dir, tune_dir, moving_base, tmp_path):  # noqa: F811,E501
    out = tmp_path / "lora"
    _lora(tune_dir, moving_base, out, "train.save_every=3")
    reference = load_checkpoint(list_checkpoints(out)[-1])[2]["lora"]
    pinned = list_checkpoints(moving_base)[-1]
    assert reference["base"] == str(moving_base) and reference["base_source"] == pinned
    assert len(reference["base_sha256"]) == 64
    before = _val_loss(out, tune_dir)
    # the base run goes on: its out_dir's newest checkpoint now holds other weights
    run(tiny_args(data_dir, moving_base, "train.num_iterations=80", "train.total_batch_size=256", "resume=auto",
                  "train.keep_last=0"))
    assert list_checkpoints(moving_base)[-1] != pinned
    assert _val_loss(out, tune_dir) == before  # the adapters still meet the base they were trained on
    # resume reads the pinned base too: the same end as an uninterrupted fine-tune
    whole = tmp_path / "whole"
    _lora(tune_dir, moving_base, whole, "train.save_every=3")  # (starts from the base's new newest checkpoint)
    shutil.rmtree(out / "checkpoints" / "step_000006")
    proc = _lora(tune_dir, moving_base, out, "train.save_every=3", "resume=auto")
    assert "resumed from" in proc.stdout and "at step 3" in proc.stdout
    assert load_checkpoint(list_checkpoints(out)[-1])[2]["lora"]["base_source"] == pinned
    assert _val_loss(out, tune_dir) == before
    assert _val_loss(whole, tune_dir) != before  # a fine-tune of the newer base is another model


@pytest.fixture
def hf_base(tmp_path):
    from transformers import GPT2Config as HFConfig
    from transformers import GPT2LMHeadModel

    torch.manual_seed(0)
    GPT2LMHeadModel(HFConfig(vocab_size=257, n_positions=32, n_embd=64, n_layer=2, n_head=2)).save_pretrained(
        tmp_path / "hf")
    return tmp_path / "hf"


def _replace_hf_weights(hf_dir):
    from transformers import GPT2LMHeadModel

    torch.manual_seed(1)
    model = GPT2LMHeadModel.from_pretrained(hf_dir)
    with torch.no_grad():
        model.transformer.h[0].mlp.c_fc.weight.mul_(1.5)
    model.save_pretrained(hf_dir)


def test_a_replaced_hf_base_is_refused_by_evaluate_generate_and_resume(tune_dir, hf_base, tmp_path):  # noqa: F811
    out = tmp_path / "lora"
    _lora(tune_dir, hf_base, out, "train.save_every=3")
    _val_loss(out, tune_dir)
    _replace_hf_weights(hf_base)
    message = (f"error: --checkpoint: the base weights at {hf_base} are not the ones the LoRA adapters were trained "
               "on (SHA-256 of their values: recorded")
    for proc in (script("evaluate.py", "--checkpoint", str(out), "--data", f"{tune_dir}/val_*.bin", "--max-batches",
                        "1", "--seq-len", "32"),
                 script("generate.py", "--checkpoint", str(out), "--prompt", "a", "--max-new-tokens", "2")):
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, output(proc)
        assert message in proc.stderr and "HINT: the base was replaced or retrained" in proc.stderr
    shutil.rmtree(out / "checkpoints" / "step_000006")
    proc = _lora(tune_dir, hf_base, out, "train.save_every=3", "resume=auto", check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, output(proc)
    assert f"error: the base weights at {hf_base} are not the ones the LoRA adapters were trained on" in proc.stderr


def test_resuming_a_lora_checkpoint_with_another_lora_section_is_one_message(tune_dir, base, tmp_path):  # noqa: F811
    out = tmp_path / "lora"
    _lora(tune_dir, base, out, "train.save_every=3", steps=3)
    without = run(tiny_args(tune_dir, out, "train.num_iterations=6", *LORA[1:], "lora.rank=0", "resume=auto"),
                  check=False)
    differ = _lora(tune_dir, base, out, "lora.alpha=4", "resume=auto", check=False)
    for proc in (without, differ):
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, output(proc)
        assert f"HINT: resume with the run's own config ({out / 'config.yaml'})" in proc.stderr
    assert "is a LoRA run's (rank 4, base" in without.stderr and "but the config has no lora section" in without.stderr
    assert "was trained with other LoRA settings (lora.alpha: checkpoint 8.0, config 4.0)" in differ.stderr
    full = tmp_path / "full"
    run(tiny_args(tune_dir, full, "train.num_iterations=2"))
    proc = run(tiny_args(tune_dir, full, "train.num_iterations=4", "lora.rank=4", "resume=auto"), check=False)
    assert proc.returncode == 1 and "holds a whole model (no LoRA adapters), but the config sets lora.rank=4" in \
        proc.stderr, output(proc)
    assert len(list_checkpoints(out)) == 1  # nothing was written by the refused runs


def test_the_adapter_is_written_when_a_resume_has_nothing_left_to_train(tune_dir, base, tmp_path):  # noqa: F811
    out = tmp_path / "lora"
    _lora(tune_dir, base, out, steps=4)
    adapter = out / "adapter"
    written = {name: (adapter / name).read_bytes() for name in os.listdir(adapter)}
    shutil.rmtree(adapter)  # as after a stop at the last step boundary: the final checkpoint, no adapter
    proc = _lora(tune_dir, base, out, "resume=auto", steps=4)
    assert "resumed from" in proc.stdout and "at step 4" in proc.stdout
    assert {name: (adapter / name).read_bytes() for name in os.listdir(adapter)} == written


def test_a_stop_at_the_last_step_boundary_exports_the_adapter(tune_dir, base, tmp_path, monkeypatch):  # noqa: F811
    import signal

    from infini_train.training import EXIT_STOPPED, loop, signals
    from infini_train.training.config import load_config
    from tests.training.tiny_run import CONFIG

    out = tmp_path / "lora"
    cfg = load_config(CONFIG, tiny_args(tune_dir, out, "train.num_iterations=3", *LORA, f"lora.init_from={base}"))
    checks = []

    def agreed(self, group=None):  # the ranks agree on a SIGTERM at the top of the loop's last pass (step 3)
        checks.append(len(checks))
        return signal.SIGTERM if len(checks) == 4 else None

    monkeypatch.setattr(signals.StopSignals, "agreed", agreed)
    assert loop.Run(cfg).train() == EXIT_STOPPED
    assert [os.path.basename(p) for p in list_checkpoints(out)] == ["step_000003"]
    assert sorted(os.listdir(out / "adapter")) == ["adapter_config.json", "adapter_model.safetensors"]


def _greedy(out, ranks, *extra):
    proc = script("generate.py", "--checkpoint", str(out), "--prompt", "beta ", "--max-new-tokens", "12",
                  "--temperature", "0", *extra, ranks=ranks)
    assert proc.returncode == 0, output(proc)
    return proc.stdout


@pytest.mark.parametrize("arch", ["gpt2", "llama3"])
def test_generate_splits_a_lora_checkpoint_over_tensor_parallel_ranks(tune_dir, tmp_path, arch):  # noqa: F811
    shape = [a for a in LLAMA if a.startswith("model.")] if arch == "llama3" else []
    out = tmp_path / "lora"
    run(tiny_args(tune_dir, out, "train.num_iterations=4", *LORA, *shape, "lora.dropout=0.1"))
    one = _greedy(out, 1)
    assert one.startswith("beta ") and len(one) > len("beta ") + 4
    assert _greedy(out, 2) == one
    assert _greedy(out, 2, "--no-cache") == one


def test_generate_on_more_ranks_than_the_heads_split_over_names_the_rank_count(tune_dir, base, tmp_path):  # noqa: F811,E501
    proc = script("generate.py", "--checkpoint", str(base), "--prompt", "a", "--max-new-tokens", "2", ranks=3)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, output(proc)
    assert "error: mpirun -n 3: the model cannot be split over 3 ranks" in proc.stderr
    assert "HINT: start as many ranks as divide n_head = 2: mpirun -n 1 | 2" in proc.stderr


def test_the_base_digest_is_the_same_for_float32_and_float64_copies():
    import infini_train as it
    from infini_train.models.gpt2 import GPT2
    from infini_train.models.gpt2.config import GPT2Config
    from infini_train.run_state.lora_base import weights_digest

    it.manual_seed(0)
    model = GPT2(GPT2Config(block_size=8, vocab_size=17, n_layer=1, n_head=2, n_embd=8))
    digest = weights_digest(model)
    assert weights_digest(model.to(dtype=it.float64)) == digest
    with it.no_grad():
        model.transformer.h[0].mlp.c_fc.weight.array[0, 0] += 1e-6
    assert weights_digest(model) != digest
    assert json.dumps(digest) and len(digest) == 64
    assert np.all(np.isfinite(model.transformer.h[0].mlp.c_fc.weight.numpy()))
