"""generate.py and evaluate.py against a checkpoint of a short training run."""
import importlib.util
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import infini_train as it
from infini_train.data.shards import read_shard, write_shard
from infini_train.models.gpt2 import GPT2
from infini_train.run_state import load_checkpoint
from tests.training.tiny_run import run, tiny_args

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(REPO, "examples", "gpt2")


@pytest.fixture(scope="module")
def trained(data_dir, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("gen") / "run"
    run(tiny_args(data_dir, out, "train.num_iterations=4", "train.save_every=0"))
    return out


def script(name, *args):
    return subprocess.run([sys.executable, os.path.join(SCRIPTS, name), *args], capture_output=True, text=True,
                          timeout=300, cwd=REPO)


def test_generate_streams_text_from_a_checkpoint(trained):
    proc = script("generate.py", "--checkpoint", str(trained), "--prompt", "def ", "--max-new-tokens", "20",
                  "--temperature", "0")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("def ")
    assert "20 tokens in" in proc.stderr
    again = script("generate.py", "--checkpoint", str(trained), "--prompt", "def ", "--max-new-tokens", "20",
                   "--temperature", "0", "--no-cache")
    assert again.stdout == proc.stdout  # greedy with and without the KV cache


def test_generate_errors_are_clear(trained, tmp_path):
    proc = script("generate.py", "--checkpoint", str(tmp_path), "--prompt", "x")
    assert proc.returncode != 0 and "no checkpoint found" in proc.stderr
    proc = script("generate.py", "--checkpoint", str(trained), "--prompt", "x" * 40)
    assert proc.returncode != 0 and "more than the model's block_size 32" in proc.stderr


def test_top_k_0_is_no_top_k_and_bad_sampling_options_are_usage_errors(trained):
    args = ("generate.py", "--checkpoint", str(trained), "--prompt", "def ", "--max-new-tokens", "12", "--seed", "5")
    plain, no_top_k = script(*args), script(*args, "--top-k", "0")
    assert no_top_k.returncode == 0, no_top_k.stderr
    assert no_top_k.stdout == plain.stdout and len(plain.stdout) > len("def \n")  # top_k=0 means none, as in HF
    for option, value, expected in (("--temperature", "-1", "expected a number >= 0 (0: greedy), got -1"),
                                    ("--top-k", "-2", "expected an integer >= 0 (0: no top-k), got -2"),
                                    ("--top-p", "1.5", "expected a number in (0, 1], got 1.5"),
                                    ("--num-samples", "0", "expected an integer >= 1, got 0")):
        proc = script(*args, option, value)
        assert proc.returncode == 2 and proc.stdout == "", (option, proc.stdout, proc.stderr)  # before the prompt
        assert proc.stderr.startswith("usage: generate.py")
        assert proc.stderr.endswith(f"generate.py: error: argument {option}: {expected}\n"), proc.stderr


def test_evaluate_loss_equals_the_training_loss_function(trained, data_dir):  # noqa: F811
    proc = script("evaluate.py", "--checkpoint", str(trained), "--data", f"{data_dir}/val_*.bin",
                  "--batch-size", "2", "--seq-len", "32", "--max-batches", "3")
    assert proc.returncode == 0, proc.stderr
    reported = float(proc.stdout.split("loss ")[1].split()[0])
    state, _, meta = load_checkpoint(trained)
    from infini_train.models.gpt2.config import GPT2Config
    model = GPT2(GPT2Config(**meta["model_config"]))
    model.load_state_dict(state)
    tokens = np.asarray(read_shard(str(sorted(data_dir.glob("val_*.bin"))[0])), dtype=np.int64)
    losses = []
    with it.no_grad():
        for b in range(3):
            w = tokens[b * 64:(b + 1) * 64 + 1]
            _, loss = model(it.tensor(w[:-1].reshape(2, 32)), it.tensor(w[1:].reshape(2, 32)))
            losses.append(loss.item())
    assert reported == pytest.approx(float(np.mean(losses)), rel=1e-5)
    assert "perplexity" in proc.stdout


def reported_loss(proc):
    assert proc.returncode == 0, proc.stderr
    return float(proc.stdout.split("loss ")[1].split()[0])


def checkpoint_loss(trained, tokens, batch_size, seq_len, n_batches):
    """Mean loss of the checkpoint over the first n_batches consecutive windows of tokens, computed here."""
    from infini_train.models.gpt2.config import GPT2Config
    state, _, meta = load_checkpoint(trained)
    model = GPT2(GPT2Config(**meta["model_config"]))
    model.load_state_dict(state)
    tokens, per_batch, losses = np.asarray(tokens, dtype=np.int64), batch_size * seq_len, []
    with it.no_grad():
        for b in range(n_batches):
            w = tokens[b * per_batch:(b + 1) * per_batch + 1]
            x, y = w[:-1].reshape(batch_size, seq_len), w[1:].reshape(batch_size, seq_len)
            _, loss = model(it.tensor(x), it.tensor(y))
            losses.append(loss.item())
    return float(np.mean(losses))


@pytest.mark.parametrize("name", ["generate.py", "evaluate.py"])
@pytest.mark.parametrize("option, value, expected", [
    ("--device", "gpu", "error: --device: expected cpu, cpu:N, cuda or cuda:N, got 'gpu'\nHINT: "),
    ("--device", "cuda:x", "error: --device: expected cpu, cpu:N, cuda or cuda:N, got 'cuda:x'\nHINT: "),
    ("--dtype", "fp16", "error: --dtype: expected one of float32, float64, got 'fp16'\nHINT: ")])
def test_bad_device_or_dtype_names_the_option_and_the_accepted_forms(trained, data_dir, name, option, value,  # noqa: F811
                                                                     expected):
    data = ["--data", f"{data_dir}/val_*.bin"] if name == "evaluate.py" else []
    proc = script(name, "--checkpoint", str(trained), *data, option, value)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "unknown dtype" not in proc.stderr
    assert proc.stderr.startswith(expected), proc.stderr


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="cupy is installed")
def test_cuda_without_cupy_is_a_clear_error(trained):
    proc = script("generate.py", "--checkpoint", str(trained), "--device", "cuda", "--max-new-tokens", "2")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: --device cuda:0: a cuda device needs cupy"), proc.stderr


def test_dtype_is_float32_unless_chosen(trained):
    sys.path.insert(0, SCRIPTS)
    try:
        from common import load_model
    finally:
        sys.path.remove(SCRIPTS)
    model, _ = load_model(str(trained))
    assert {p.dtype for p in model.parameters()} == {np.dtype("float32")}
    model, _ = load_model(str(trained), dtype="float64")
    assert {p.dtype for p in model.parameters()} == {np.dtype("float64")}
    args = ("generate.py", "--checkpoint", str(trained), "--prompt", "def ", "--max-new-tokens", "4", "--dtype",
            "float64")
    uncached = script(*args, "--no-cache")
    assert uncached.returncode == 0 and uncached.stdout.startswith("def ") and "4 tokens in" in uncached.stderr
    cached = script(*args)  # the KV cache holds keys and values in the model's dtype
    assert cached.returncode == 0 and cached.stdout == uncached.stdout, cached.stderr


def error_text(proc):
    """stderr from its "error:" line on (the progress bar comes before it)."""
    return proc.stderr[proc.stderr.index("error: "):] if "error: " in proc.stderr else proc.stderr


def test_evaluate_few_batches_opens_only_the_shards_it_reads(trained, data_dir, tmp_path):  # noqa: F811
    tokens = np.asarray(read_shard(str(sorted(data_dir.glob("val_*.bin"))[0])))[:300]  # a few batches: read fast
    write_shard(str(tmp_path / "val_000000.bin"), tokens)
    for i in range(1, 6):
        (tmp_path / f"val_{i:06d}.bin").write_bytes(b"not a token shard")  # opened: an error
    args = ("--checkpoint", str(trained), "--data", str(tmp_path / "val_*.bin"), "--batch-size", "2", "--seq-len", "32")
    loss = reported_loss(script("evaluate.py", *args, "--max-batches", "1"))
    assert loss == pytest.approx(checkpoint_loss(trained, tokens, 2, 32, 1), rel=1e-5)
    proc = script("evaluate.py", *args)  # every shard: the first corrupt one is named
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert error_text(proc).startswith(f"error: {tmp_path / 'val_000001.bin'}: 17 bytes, shorter than"), proc.stderr


def test_evaluate_reads_every_shard_once(trained, data_dir, tmp_path):  # noqa: F811
    tokens = np.asarray(read_shard(str(sorted(data_dir.glob("val_*.bin"))[0])))[:300]
    write_shard(str(tmp_path / "val_000000.bin"), tokens[:200])  # 3 batches of 64 (+1)
    write_shard(str(tmp_path / "val_000001.bin"), tokens[200:])  # 1 batch
    proc = script("evaluate.py", "--checkpoint", str(trained), "--data", str(tmp_path / "val_*.bin"),
                  "--batch-size", "2", "--seq-len", "32")
    expected = (3 * checkpoint_loss(trained, tokens[:200], 2, 32, 3) + checkpoint_loss(trained, tokens[200:], 2, 32, 1))
    assert reported_loss(proc) == pytest.approx(expected / 4, rel=1e-5) and "batches 4 |" in proc.stdout


def test_evaluate_data_errors_name_the_option(trained, tmp_path):
    proc = script("evaluate.py", "--checkpoint", str(trained), "--data", str(tmp_path / "none_*.bin"))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"error: --data: no token shards match {str(tmp_path / 'none_*.bin')!r}")
    write_shard(str(tmp_path / "small.bin"), np.arange(50))
    proc = script("evaluate.py", "--checkpoint", str(trained), "--data", str(tmp_path / "small.bin"),
                  "--batch-size", "2", "--seq-len", "32")
    assert proc.returncode == 1
    assert error_text(proc) == (f"error: {tmp_path / 'small.bin'}: 50 tokens, fewer than one batch needs (65)\n"
                           "HINT: lower --batch-size or --seq-len\n")


def test_evaluate_text_takes_the_exact_bytes(trained, tmp_path):
    data = ("Grüße aus Köln.\r\n" * 20).encode("latin-1")  # not UTF-8: each byte is one token
    (tmp_path / "latin1.txt").write_bytes(data)
    proc = script("evaluate.py", "--checkpoint", str(trained), "--text", str(tmp_path / "latin1.txt"),
                  "--batch-size", "2", "--seq-len", "32", "--max-batches", "2")
    assert reported_loss(proc) == pytest.approx(checkpoint_loss(trained, list(data), 2, 32, 2), rel=1e-5)


@pytest.fixture(scope="module")
def two_checkpoints(data_dir, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("gen2") / "run"
    run(tiny_args(data_dir, out, "train.num_iterations=4", "train.save_every=2", "train.keep_last=0"))
    return out


def _copy_with_damage(source, tmp_path, step, name):
    out = tmp_path / "run"
    shutil.copytree(source, out)
    target = out / "checkpoints" / f"step_{step:06d}"
    with open(target / name, "r+b") as f:
        f.truncate(os.path.getsize(f.name) // 2)
    return out, target


def _eval_args(path, data_dir):  # noqa: F811
    return ("evaluate.py", "--checkpoint", str(path), "--data", f"{data_dir}/val_*.bin", "--batch-size", "2",
            "--seq-len", "32", "--max-batches", "2")


def _loss(proc):
    assert proc.returncode == 0, proc.stderr
    return float(proc.stdout.split("loss ")[1].split()[0])


def test_a_damaged_optimizer_file_does_not_stop_generate_or_evaluate(two_checkpoints, data_dir, tmp_path):  # noqa: F811
    reference = _loss(script(*_eval_args(two_checkpoints, data_dir)))
    out, _ = _copy_with_damage(two_checkpoints, tmp_path, 4, "optimizer.safetensors")
    proc = script(*_eval_args(out, data_dir))
    assert _loss(proc) == reference and "warning" not in proc.stderr
    gen = script("generate.py", "--checkpoint", str(out), "--prompt", "def ", "--max-new-tokens", "4")
    assert gen.returncode == 0 and gen.stdout.startswith("def "), gen.stderr


def test_an_out_dir_whose_newest_model_is_damaged_falls_back_to_the_newest_good_checkpoint(two_checkpoints, data_dir,  # noqa: F811,E501
                                                                                          tmp_path):
    older = _loss(script(*_eval_args(two_checkpoints / "checkpoints" / "step_000002", data_dir)))
    out, damaged = _copy_with_damage(two_checkpoints, tmp_path, 4, "model.safetensors")
    proc = script(*_eval_args(out, data_dir))
    assert _loss(proc) == older
    assert (f"warning: --checkpoint: skipping checkpoint {damaged} is damaged: model.safetensors is truncated"
            in proc.stderr)
    # naming the damaged checkpoint itself is one error that points at the good one
    proc = script(*_eval_args(damaged, data_dir))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"error: --checkpoint: checkpoint {damaged} is damaged: model.safetensors is truncated" in proc.stderr
    assert f"HINT: use the newest good one, {out / 'checkpoints' / 'step_000002'}" in proc.stderr


def test_missing_and_wholly_damaged_checkpoints_are_one_message(two_checkpoints, data_dir, tmp_path):  # noqa: F811
    missing = tmp_path / "nowhere" / "checkpoints" / "step_000004"
    for name in ("generate.py", "evaluate.py"):
        args = ("generate.py", "--checkpoint", str(missing), "--prompt", "x") if name == "generate.py" else \
            _eval_args(missing, data_dir)
        proc = script(*args)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert f"error: --checkpoint: no checkpoint found at {missing}: the path does not exist" in proc.stderr
    out, _ = _copy_with_damage(two_checkpoints, tmp_path, 4, "model.safetensors")
    os.remove(out / "checkpoints" / "step_000002" / "model.safetensors")
    proc = script("generate.py", "--checkpoint", str(out), "--prompt", "x")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"error: --checkpoint: none of the 2 checkpoint(s) in {out} has a model file that verifies" in proc.stderr
    assert "model.safetensors is truncated" in proc.stderr and "model.safetensors is missing" in proc.stderr


def test_generate_help_describes_every_option_it_names():
    help_text = " ".join(script("generate.py", "--help").stdout.split())
    assert "--chat talks to the model through its chat template" in help_text  # what "--chat ... (see above)" means
    assert "each stdin line is a user turn (see the description above)" in help_text
    assert "--pretrained PRETRAINED a Hugging Face directory (config.json + safetensors: GPT-2, LLaMA, Qwen3, " \
           "Qwen3-MoE, Mixtral)" in help_text
    assert "--checkpoint CHECKPOINT a checkpoints/step_XXXXXX directory or a run's out_dir (its newest good " \
           "checkpoint)" in help_text
