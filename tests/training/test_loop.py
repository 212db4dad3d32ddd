"""The run loop: validation and samples in eval mode, the final validation loss measured on the saved model,
non-finite steps skipped up to train.skip_nonfinite, a clear note when the loss plot cannot be drawn, and rank 0's
slow I/O never tripping the other ranks' collective timeout."""
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import infini_train as it
from infini_train.data.loader import DistributedDataLoader
from infini_train.models.gpt2 import GPT2, GPT2Config
from infini_train.models import finalize_grads
from infini_train.training import Run, TrainingDiverged
from infini_train.training.evaluation import evaluate, sample_text
from infini_train.data.tokenizer import get_tokenizer
from infini_train.run_state import list_checkpoints, load_checkpoint
from infini_train.training.config import parse_args
from tests.distributed.mpi_jobs import MPIEXEC, needs_mpiexec
from tests.training.tiny_run import CONFIG, REPO, job_env, metrics, tiny_args

HERE = os.path.dirname(os.path.abspath(__file__))


def _config(data_dir, out, *extra):
    return parse_args(["--config", CONFIG, *tiny_args(data_dir, out, *extra)])


def test_validation_and_samples_run_in_eval_mode_and_restore_the_mode(data_dir):
    it.manual_seed(0)
    model = GPT2(GPT2Config(block_size=32, vocab_size=257, n_layer=2, n_head=2, n_embd=64, dropout=0.5))
    loader = DistributedDataLoader(f"{data_dir}/val_*.bin", 4, 32, 0, 1)
    model.train()
    val = evaluate(model, loader, 2, it.device("cpu"))
    assert model.training
    model.eval()
    expected = evaluate(model, loader, 2, it.device("cpu"))
    assert val == expected  # dropout off: the same number twice
    tokenizer = get_tokenizer("byte")
    model.train()
    text = sample_text(model, tokenizer, 20, seed=3, device=it.device("cpu"))
    model.eval()
    assert text == sample_text(model, tokenizer, 20, seed=3, device=it.device("cpu")) and not model.training


def test_the_final_validation_loss_is_the_saved_models(data_dir, tmp_path):
    out = tmp_path / "run"
    cfg = _config(data_dir, out, "train.num_iterations=6", "train.val_loss_every=3", "model.dropout=0.2")
    assert Run(cfg).train() == 0
    final = metrics(out)[-1]
    assert final["step"] == 6 and set(final) == {"step", "val_loss"}
    weights, _, state = load_checkpoint(list_checkpoints(out)[-1])
    assert state["step"] == 6
    model = GPT2(GPT2Config(**state["model_config"]))
    model.load_state_dict(weights)
    loader = DistributedDataLoader(f"{data_dir}/val_*.bin", 4, 32, 0, 1)
    assert evaluate(model, loader, cfg.train.val_max_steps, it.device("cpu")) == final["val_loss"]


def test_a_run_at_learning_rate_0_keeps_the_weights(data_dir, tmp_path):
    out = tmp_path / "run"
    cfg = _config(data_dir, out, "train.learning_rate=0", "train.weight_decay=0.1", "train.num_iterations=2",
                  "train.val_loss_every=0")
    run = Run(cfg)
    before = {k: v.numpy().copy() for k, v in run.raw_model.state_dict().items()}
    assert run.train() == 0
    weights, _, state = load_checkpoint(list_checkpoints(out)[-1])
    assert state["step"] == 2 and set(weights) == set(before)
    for name, value in before.items():
        np.testing.assert_array_equal(weights[name], value, err_msg=name)  # bitwise: no update, no decay
    steps = metrics(out)
    assert [r["lr"] for r in steps] == [0.0, 0.0] and all(math.isfinite(r["loss"]) for r in steps)


def _poisoned_norms(monkeypatch, bad_steps):
    """Make clip_grad_norm_ report nan at the given steps, as a gradient overflow would."""
    real = finalize_grads.clip_grad_norm_
    calls = {"n": 0}

    def clip(params, max_norm):
        norm = real(params, max_norm)
        calls["n"] += 1
        return it.tensor(float("nan")) if calls["n"] - 1 in bad_steps else norm

    monkeypatch.setattr(finalize_grads, "clip_grad_norm_", clip)


def test_non_finite_steps_are_skipped_up_to_the_limit_and_counted(data_dir, tmp_path, monkeypatch, capsys):
    _poisoned_norms(monkeypatch, {3, 4, 7})
    out = tmp_path / "run"
    assert Run(_config(data_dir, out, "train.num_iterations=10", "train.skip_nonfinite=2")).train() == 0
    rows = [r for r in metrics(out) if "loss" in r]
    assert [r["skipped"] for r in rows] == [s in {3, 4, 7} for s in range(10)]
    assert [r["skipped_steps"] for r in rows] == [0, 0, 0, 1, 2, 2, 2, 3, 3, 3]
    # metrics.jsonl is strict JSON: the nan gradient norms are null, flagged
    with open(out / "metrics.jsonl") as f:
        assert "NaN" not in f.read()
    assert [(r["grad_norm"], r.get("nonfinite")) for r in rows if r["skipped"]] == [(None, {"grad_norm": "nan"})] * 3
    # the skip messages number steps as the step lines do: the 4th step line is the first skipped update
    printed = capsys.readouterr().out.splitlines()
    skips = [line.split(":")[0] for line in printed if "skipped the update" in line]
    assert skips == ["step 4", "step 5", "step 8"]
    fourth = next(line for line in printed if line.startswith("step     4/10"))
    assert "norm nan" in fourth
    _, optimizer_state, state = load_checkpoint(out)
    assert state["skipped_steps"] == 3
    assert {s["step"] for s in optimizer_state["state"].values()} == {7}  # AdamW stepped 10 - 3 times


def test_more_non_finite_steps_in_a_row_than_allowed_stop_the_run(data_dir, tmp_path, monkeypatch):
    _poisoned_norms(monkeypatch, {3, 4})  # the 4th and 5th steps (step lines 4/10 and 5/10)
    with pytest.raises(TrainingDiverged, match=r"(?s)gradient norm became nan at step 5 \(2 non-finite step\(s\) in "
                                                r"a row, train.skip_nonfinite=1\).*HINT"):
        Run(_config(data_dir, tmp_path / "run", "train.num_iterations=10", "train.skip_nonfinite=1")).train()


def test_plot_without_matplotlib_says_so(data_dir, tmp_path, monkeypatch, capsys):
    from infini_train.training import loop

    monkeypatch.setattr(loop, "plot_loss_curve", lambda *args: False)
    Run(_config(data_dir, tmp_path / "run", "train.num_iterations=2", "plot=true")).train()
    out = capsys.readouterr().out
    assert out.count("plot: matplotlib is not installed, so no loss.png was written") == 1
    assert "HINT: pip install -e '.[plot]'" in out


@needs_mpiexec
def test_slow_rank0_checkpoints_and_samples_do_not_trip_the_collective_timeout(data_dir, tmp_path):
    args = tiny_args(data_dir, tmp_path / "run", "train.num_iterations=4", "train.save_every=2",
                     "train.sample_every=2", "train.sample_length=4", "train.batch_size=2", "train.val_loss_every=0")
    proc = subprocess.run([MPIEXEC, "-n", "2", sys.executable, os.path.join(HERE, "worker_slow_io.py"), "--config",
                           CONFIG, *args], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env=job_env(PYTHONPATH=REPO, INFINI_TRAIN_COLLECTIVE_TIMEOUT="1"))
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    assert [os.path.basename(p) for p in list_checkpoints(tmp_path / "run")] == ["step_000002", "step_000004"]
    assert proc.stdout.count("--- sample at step") == 2 and "did not complete within" not in proc.stderr
    assert math.isfinite(metrics(tmp_path / "run")[-1]["loss"])
    assert np.isfinite([r["loss"] for r in metrics(tmp_path / "run")]).all()
