"""generate.py and evaluate.py against a checkpoint of a short training run."""
import os
import subprocess
import sys

import numpy as np
import pytest

import infini_train as it
from infini_train.data.shards import read_shard
from infini_train.models.gpt2 import GPT2
from infini_train.utils.checkpoint import load_checkpoint
from tests.examples.test_train import REPO, data_dir, run, tiny_args  # noqa: F401 (fixture)

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


def test_evaluate_loss_equals_the_training_loss_function(trained, data_dir):  # noqa: F811
    proc = script("evaluate.py", "--checkpoint", str(trained), "--data", f"{data_dir}/val_*.bin",
                  "--batch-size", "2", "--seq-len", "32", "--max-batches", "3")
    assert proc.returncode == 0, proc.stderr
    reported = float(proc.stdout.split("loss ")[1].split()[0])
    state, _, meta = load_checkpoint(trained)
    from infini_train.models.gpt2_config import GPT2Config
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
