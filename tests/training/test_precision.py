"""precision: bf16-mixed and fp16-mixed runs against the fp32 run, GradScaler state in checkpoints (resume stays
bitwise), evaluate.py / generate.py under autocast, and a bf16 llm.c export from a bf16-mixed run."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from infini_train.models.gpt2 import GPT2, GPT2Config
from infini_train.run_state import list_checkpoints, load_checkpoint
from tests.distributed.mpi_jobs import needs_mpiexec
from tests.training.tiny_run import REPO, job_env, metrics, run, same_run, tiny_args

STEPS = ["train.num_iterations=50", "train.val_loss_every=25", "train.save_every=0"]
SCRIPTS = os.path.join(REPO, "examples", "gpt2")


@pytest.fixture(scope="module")
def fp32_run(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("fp32")
    run(tiny_args(data_dir, out, *STEPS))
    return out


def _losses(out):
    return np.array([r["loss"] for r in metrics(out) if "loss" in r])


@pytest.mark.parametrize("precision", ["bf16-mixed", "fp16-mixed"])
def test_mixed_precision_runs_follow_the_fp32_loss_curve(data_dir, fp32_run, tmp_path, precision):
    out = tmp_path / precision
    proc = run(tiny_args(data_dir, out, *STEPS, f"precision={precision}"))
    assert f"precision: {precision}" in proc.stdout
    ours, reference = _losses(out), _losses(fp32_run)
    # the same data, init and dropout seeds: the curves differ only by rounding; averaged over windows of 10
    # steps they stay within 3% of each other, and both fall
    np.testing.assert_allclose(ours.reshape(5, 10).mean(1), reference.reshape(5, 10).mean(1), rtol=3e-2)
    assert ours[-10:].mean() < 0.75 * ours[:10].mean()
    final = [r for r in metrics(out) if "val_loss" in r][-1]["val_loss"]
    reference_final = [r for r in metrics(fp32_run) if "val_loss" in r][-1]["val_loss"]
    assert abs(final - reference_final) < 0.03 * reference_final
    rows = [r for r in metrics(out) if "loss" in r]
    if precision == "fp16-mixed":
        assert all("loss_scale" in r for r in rows) and rows[0]["loss_scale"] == 2.0 ** 16
    weights, _, state = load_checkpoint(out)
    assert {w.dtype for w in weights.values()} == {np.dtype("float32")}  # float32 master weights
    assert (state["grad_scaler"] is not None) == (precision == "fp16-mixed")


def test_fp16_mixed_resume_is_bitwise(data_dir, tmp_path):
    common = ["train.num_iterations=12", "train.save_every=4", "train.keep_last=3", "precision=fp16-mixed",
              "model.dropout=0.1", "train.val_loss_every=4"]
    full, part = tmp_path / "full", tmp_path / "part"
    run(tiny_args(data_dir, full, *common))
    shutil.copytree(full, part)
    shutil.rmtree(part / "checkpoints" / "step_000012")
    shutil.rmtree(part / "checkpoints" / "step_000008")
    _, _, state = load_checkpoint(part)
    assert state["grad_scaler"]["scale"] == 2.0 ** 16 and state["grad_scaler"]["_growth_tracker"] == 4
    run(tiny_args(data_dir, part, *common, "resume=auto"))
    same_run(full, part)


def _script(name, *args):
    return subprocess.run([sys.executable, os.path.join(SCRIPTS, name), *args], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env=job_env())


def test_evaluate_and_generate_run_under_autocast(data_dir, fp32_run):
    losses = {}
    for precision in ("fp32", "bf16-mixed"):
        proc = _script("evaluate.py", "--checkpoint", str(fp32_run), "--data", f"{data_dir}/val_*.bin",
                       "--max-batches", "4", "--precision", precision)
        assert proc.returncode == 0, proc.stderr[-2000:]
        losses[precision] = float(proc.stdout.split("loss ")[1].split()[0])
    assert losses["bf16-mixed"] != losses["fp32"] and abs(losses["bf16-mixed"] - losses["fp32"]) < 0.02
    proc = _script("generate.py", "--checkpoint", str(fp32_run), "--prompt", "def ", "--max-new-tokens", "8",
                   "--precision", "bf16-mixed", "--temperature", "0")
    assert proc.returncode == 0 and proc.stdout.startswith("def "), proc.stderr[-2000:]
    proc = _script("generate.py", "--checkpoint", str(fp32_run), "--precision", "bf16")
    assert proc.returncode != 0 and "--precision: expected one of fp32, bf16-mixed, fp16-mixed, got 'bf16' (did " \
                                    "you mean 'bf16-mixed'?)" in proc.stderr


def test_a_bf16_mixed_run_exports_bfloat16_llmc_weights(data_dir, tmp_path):
    out = tmp_path / "bf16"
    run(tiny_args(data_dir, out, "train.num_iterations=3", "precision=bf16-mixed", "train.val_loss_every=0"))
    weights, _, state = load_checkpoint(list_checkpoints(out)[-1])
    model = GPT2(GPT2Config(**state["model_config"]))
    model.load_state_dict(weights)
    model.save_llmc(str(tmp_path / "model.bin"), dtype="bfloat16")
    back = GPT2.from_pretrained(str(tmp_path / "model.bin"))
    for name, p in back.state_dict().items():
        theirs = model.state_dict()[name].numpy()
        np.testing.assert_allclose(p.numpy(), theirs, rtol=2 ** -8, atol=1e-30, err_msg=name)  # bf16 rounding


def test_a_precision_typo_is_rejected_with_a_suggestion(data_dir, tmp_path):
    proc = run(tiny_args(data_dir, tmp_path / "x", "precision=bf16"), check=False)
    assert proc.returncode != 0
    assert "precision: expected one of ('fp32', 'bf16-mixed', 'fp16-mixed') (did you mean 'bf16-mixed'?), got " \
           "'bf16'" in proc.stderr


@pytest.mark.layouts
@needs_mpiexec
@pytest.mark.parametrize("precision", ["bf16-mixed", "fp16-mixed"])
def test_mixed_precision_under_ddp_follows_the_one_rank_run(data_dir, tmp_path, precision):
    common = ["train.num_iterations=8", "train.val_loss_every=0", "train.total_batch_size=256",
              f"precision={precision}"]
    one, two = tmp_path / "one", tmp_path / "two"
    run(tiny_args(data_dir, one, *common, "train.batch_size=4"))  # 2 accumulation steps of 4 sequences
    run(tiny_args(data_dir, two, *common, "train.batch_size=4"), ranks=2)  # 2 ranks of 4
    # the same global batch; the per-rank products round to bf16/fp16 like the one-rank ones, but their sums
    # over the batch are formed in another order: bf16 losses agree to bf16-level noise
    if precision == "bf16-mixed":
        np.testing.assert_allclose(_losses(two), _losses(one), rtol=1e-2)
        return
    # fp16: each rank backpropagates its whole scaled loss (DDP averages after backward), twice the one-rank
    # run's per-micro-batch value, so an overflow can hit one run and not the other. Where it hits, every rank
    # skips the step together and the scale halves; the curves stay within a few percent.
    rows = [r for r in metrics(two) if "loss" in r]
    for before, after in zip(rows, rows[1:]):
        assert after["loss_scale"] == before["loss_scale"] / (2 if before["skipped"] else 1)
    np.testing.assert_allclose(_losses(two), _losses(one), rtol=3e-2)
    assert _losses(two)[-1] < _losses(two)[0]
