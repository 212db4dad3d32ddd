"""Fine-tuning a Hugging Face LLaMA on chat data end to end (configs/llama3_lora_sft.yaml on a tiny random model with
its own BPE tokenizer and chat template): the first step's loss is HF's on the same packed samples one by one; a LoRA
run's adapter loads in PEFT and gives our logits, and generate.py --chat replies as HF's greedy generate through the
template; full fine-tuning under data, tensor and pipeline parallelism gives the one process's losses."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from peft import PeftModel
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

import infini_train as it
from infini_train.data.sft_loader import SFTDataLoader
from infini_train.data.tokenizer import get_tokenizer
from tests.distributed.mpi_jobs import needs_mpiexec
from tests.training.sft_setup import conversation, make_model_dir, write_chat_set
from tests.training.tiny_run import REPO, job_env, losses_by_step, metrics, run

CONFIG = os.path.join(REPO, "configs", "llama3_lora_sft.yaml")
B, T = 2, 256


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft")
    make_model_dir(root / "model")
    write_chat_set(root / "train.jsonl", 48, seed=1)
    write_chat_set(root / "val.jsonl", 8, seed=2)
    return root


def args(setup, out, *extra):
    return [f"out_dir={out}", f"model.pretrained={setup / 'model'}", f"data.train={setup / 'train.jsonl'}",
            f"data.val={setup / 'val.jsonl'}", f"train.batch_size={B}", f"train.sequence_length={T}",
            f"train.total_batch_size={2 * B * T}", "train.num_iterations=6", "train.warmup_iters=1",
            "train.learning_rate=3e-3", "train.val_loss_every=3", "train.val_max_steps=2", "train.save_every=0",
            "train.log_every=1", "device=cpu", "plot=false", *extra]


def _train(setup, out, *extra, ranks=1):
    return run(args(setup, out, *extra), ranks=ranks, config=CONFIG)


def hf_loss_over_rows(setup, rows):
    """HF's cross-entropy summed over every trained token of the first ``rows`` packed rows (each sample run alone),
    over the count of those tokens."""
    tok = get_tokenizer(f"hf:{setup / 'model'}")
    batch = SFTDataLoader(str(setup / "train.jsonl"), tok, rows, T, format="chat", seed=1337).next_batch()
    hf = LlamaForCausalLM.from_pretrained(setup / "model").eval()
    total, count = 0.0, 0
    for r in range(rows):
        for segment in range(1, batch.segments[r].max() + 1):
            at = batch.segments[r] == segment
            logits = hf(torch.tensor(batch.inputs[r][at][None])).logits[0]
            targets = torch.tensor(batch.targets[r][at])
            total += torch.nn.functional.cross_entropy(logits, targets, ignore_index=-1, reduction="sum").item()
            count += int((batch.targets[r][at] != -1).sum())
    assert (batch.segments.max(axis=1) > 1).any()  # rows hold several samples
    trained = (batch.targets != -1).sum(axis=1)
    assert len(set(trained.tolist())) > 1  # rows train different numbers of tokens: a mean of row means would differ
    return total / count


def test_first_step_loss_is_hf_on_the_packed_samples_one_by_one(setup, tmp_path):
    proc = _train(setup, tmp_path / "run", "lora.rank=0", f"train.total_batch_size={B * T}")
    assert "chat data" in proc.stdout and "packed rows per epoch" in proc.stdout
    np.testing.assert_allclose(losses_by_step(tmp_path / "run")[0], hf_loss_over_rows(setup, B), rtol=1e-5)
    assert [r["step"] for r in metrics(tmp_path / "run") if "val_loss" in r] == [0, 3, 6]


@pytest.mark.layouts
@pytest.mark.parametrize("ranks,batch_size", [(1, 4), (1, 1), pytest.param(2, 2, marks=needs_mpiexec),
                                              pytest.param(2, 1, marks=needs_mpiexec)])
def test_the_loss_is_over_every_trained_token_of_the_global_batch_however_it_is_split(setup, tmp_path, ranks,
                                                                                        batch_size):
    # a global batch of 4 packed rows: B4; B1 x 4 micro-batches; 2 ranks x B2; 2 ranks x B1 x 2 micro-batches
    _train(setup, tmp_path / "run", "lora.rank=0", f"train.batch_size={batch_size}", f"train.total_batch_size={4 * T}",
           "train.num_iterations=1", "train.val_loss_every=0", ranks=ranks)
    np.testing.assert_allclose(losses_by_step(tmp_path / "run")[0], hf_loss_over_rows(setup, 4), rtol=1e-5)


def hf_answer_loss(setup, name):
    """HF's mean cross-entropy over every trained (answer) token of the samples of ``name``, each sample alone."""
    tok = get_tokenizer(f"hf:{setup / 'model'}")
    loader = SFTDataLoader(str(setup / name), tok, 1, T, format="chat", packing=False, shuffle=False)
    hf = LlamaForCausalLM.from_pretrained(setup / "model").eval()
    total, count = 0.0, 0
    for _ in range(loader.rows_in_epoch(0)):
        batch = loader.next_batch()
        at = batch.segments[0] == 1
        logits = hf(torch.tensor(batch.inputs[0][at][None])).logits[0]
        targets = torch.tensor(batch.targets[0][at])
        total += torch.nn.functional.cross_entropy(logits, targets, ignore_index=-1, reduction="sum").item()
        count += int((targets != -1).sum())
    return total / count, count


def evaluate_script(*args):
    proc = subprocess.run([sys.executable, os.path.join(REPO, "examples", "gpt2", "evaluate.py"), *args],
                          capture_output=True, text=True, cwd=REPO, env=job_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    fields = dict(part.split() for part in proc.stdout.strip().splitlines()[-1].split(" | "))
    return float(fields["loss"]), int(fields["tokens"])


@pytest.mark.parametrize("batch_size", ["1", "3"])
def test_evaluate_gives_the_answer_loss_of_chat_data(setup, tmp_path, batch_size):
    expected, count = hf_answer_loss(setup, "val.jsonl")
    model = ["--pretrained", str(setup / "model"), "--seq-len", str(T), "--batch-size", batch_size]
    loss, tokens = evaluate_script(*model, "--data", str(setup / "val.jsonl"))  # the format read off the records
    assert tokens == count  # each sample once, though the last batch wraps into the next pass's rows
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    assert evaluate_script(*model, "--data", str(setup / "val.jsonl"), "--format", "chat") == (loss, tokens)
    subprocess.run([sys.executable, os.path.join(REPO, "examples", "gpt2", "prepare_data.py"), str(setup / "val.jsonl"),
                    "--format", "chat", "--tokenizer", f"hf:{setup / 'model'}", "--val-samples", "0", "--out-dir",
                    str(tmp_path / "shards")], check=True, capture_output=True, cwd=REPO, env=job_env(), timeout=120)
    shards = str(tmp_path / "shards" / "*.sft")
    assert evaluate_script(*model, "--data", shards) == (loss, tokens)


def test_evaluate_help_and_sft_errors(setup):
    script = os.path.join(REPO, "examples", "gpt2", "evaluate.py")
    help_text = " ".join(subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, cwd=REPO,
                                        env=job_env(), timeout=60).stdout.split())
    assert "or fine-tuning data (JSONL or .sft shards" in help_text and "--data val.jsonl --format chat" in help_text
    for option in ("--checkpoint CHECKPOINT a run's out_dir", "--pretrained PRETRAINED a Hugging Face directory",
                   "--format {text,chat,instruction} how fine-tuning JSONL records read"):
        assert option in help_text
    proc = subprocess.run([sys.executable, script, "--pretrained", str(setup / "model"), "--data",
                           str(setup / "val.jsonl"), "--format", "instruction"], capture_output=True, text=True,
                          cwd=REPO, env=job_env(), timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "this record looks like data.format=chat (set data.format: chat, or --format chat)" in proc.stderr


def test_lora_adapter_loads_in_peft_and_chat_replies_as_hf_generate(setup, tmp_path):
    out = tmp_path / "lora"
    _train(setup, out)
    adapter = out / "adapter"
    assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 16
    base = LlamaForCausalLM.from_pretrained(setup / "model").eval()
    hf = PeftModel.from_pretrained(base, str(adapter)).eval()
    hf_tok = PreTrainedTokenizerFast.from_pretrained(setup / "model")
    messages = conversation(4, 3)[:1]
    text = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt = hf_tok.encode(text, add_special_tokens=False)
    eot = hf_tok.convert_tokens_to_ids("<|eot_id|>")
    generated = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=[eot],
                            pad_token_id=eot)[0, len(prompt):].tolist()
    expected = hf_tok.decode([t for t in generated if t != eot])

    chat = subprocess.run([sys.executable, os.path.join(REPO, "examples", "gpt2", "generate.py"), "--checkpoint",
                           str(out), "--chat", "--temperature", "0", "--max-new-tokens", "12"],
                          input=messages[0]["content"] + "\n", capture_output=True, text=True, cwd=REPO,
                          env=job_env(), timeout=120)
    assert chat.returncode == 0, chat.stderr
    assert chat.stdout.splitlines()[0] == expected
    assert len(generated) > 1

    sys.path.insert(0, os.path.join(REPO, "examples", "gpt2"))
    from common import load_model  # the checkpoint as generate.py loads it: base + adapters

    ours, _ = load_model(checkpoint=str(out))
    ids = prompt + generated
    np.testing.assert_allclose(ours(it.tensor([ids]))[0].numpy(), hf(torch.tensor([ids])).logits.detach().numpy(),
                               rtol=1e-4, atol=1e-5)


@pytest.mark.layouts
@needs_mpiexec
@pytest.mark.parametrize("layout", ["parallel.zero_stage=0", "parallel.tensor=2", "parallel.pipeline=2",
                                    "parallel.zero_stage=1", "parallel.zero_stage=3"])
def test_full_fine_tuning_layouts_equal_one_process(setup, tmp_path, layout):
    _train(setup, tmp_path / "one", "lora.rank=0")
    proc = _train(setup, tmp_path / "two", "lora.rank=0", layout, ranks=2)
    assert "world 2" in proc.stdout
    one, two = losses_by_step(tmp_path / "one"), losses_by_step(tmp_path / "two")
    np.testing.assert_allclose([two[s] for s in sorted(two)], [one[s] for s in sorted(one)], rtol=2e-5)
    val = [r["val_loss"] for r in metrics(tmp_path / "two") if "val_loss" in r]  # the same rows, whatever the layout
    np.testing.assert_allclose(val, [r["val_loss"] for r in metrics(tmp_path / "one") if "val_loss" in r], rtol=2e-5)
    assert len(val) == 3


def test_resume_mid_epoch_continues_the_uninterrupted_run(setup, tmp_path):
    import shutil

    _train(setup, tmp_path / "run", "lora.rank=0", "train.save_every=3", "train.val_loss_every=0")
    shutil.copytree(tmp_path / "run", tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "step_000006")
    proc = _train(setup, tmp_path / "resumed", "lora.rank=0", "train.save_every=3", "train.val_loss_every=0",
                  "resume=auto")
    assert "resumed from" in proc.stdout
    assert losses_by_step(tmp_path / "resumed") == losses_by_step(tmp_path / "run")  # bitwise
