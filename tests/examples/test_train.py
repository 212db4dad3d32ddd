"""The training script end to end on a tiny model and a small corpus (each run takes seconds)."""
import os
import re
import shutil

import numpy as np

from infini_train.run_state import list_checkpoints, load_checkpoint
from tests.training.tiny_run import metrics, run, tiny_args


def test_tiny_run_writes_metrics_checkpoints_and_config(data_dir, tmp_path):
    out = tmp_path / "run"
    proc = run(tiny_args(data_dir, out, "train.num_iterations=12", "train.save_every=5", "train.keep_last=2"))
    rows = metrics(out)
    assert [r["step"] for r in rows] == list(range(13))  # steps 0..11, then the final evaluation at 12
    assert {"loss", "lr", "grad_norm", "tokens_per_s", "skipped", "skipped_steps"} <= set(rows[0])
    assert "val_loss" in rows[0] and "val_loss" in rows[5] and "val_loss" not in rows[11]
    assert set(rows[12]) == {"step", "val_loss"}  # measured after the last update: the saved model's loss
    assert rows[11]["loss"] < rows[0]["loss"] and rows[12]["val_loss"] < rows[0]["val_loss"]
    names = [os.path.basename(p) for p in list_checkpoints(out)]
    assert names == ["step_000010", "step_000012"]  # keep_last=2 dropped step_000005
    _, _, state = load_checkpoint(out)
    assert state["step"] == 12 and state["data"][0]["position"] >= 0 and state["tokenizer"] == "byte"
    assert (out / "config.yaml").exists()
    assert "step    12/12" in proc.stdout


def test_interrupted_then_resumed_equals_uninterrupted_bitwise(data_dir, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    common = ["train.num_iterations=10", "train.save_every=5", "model.dropout=0.1"]
    run(tiny_args(data_dir, a, *common))
    run(tiny_args(data_dir, b, *common))
    shutil.rmtree(b / "checkpoints" / "step_000010")  # as if killed after the step-5 checkpoint
    proc = run(tiny_args(data_dir, b, *common, "resume=auto"))
    assert "resumed from" in proc.stdout and "step_000005" in proc.stdout
    assert metrics(a) == [dict(r, ms=a_row["ms"], tokens_per_s=a_row["tokens_per_s"], mfu=a_row["mfu"])
                          if "ms" in r else r for r, a_row in zip(metrics(b), metrics(a))]
    wa, _, _ = load_checkpoint(a)
    wb, _, _ = load_checkpoint(b)
    for k in wa:
        np.testing.assert_array_equal(wa[k], wb[k], err_msg=k)


def test_grad_accumulation_equals_one_big_batch(data_dir, tmp_path):
    big, acc = tmp_path / "big", tmp_path / "acc"
    run(tiny_args(data_dir, big, "train.num_iterations=3", "train.batch_size=4", "train.total_batch_size=128",
                  "train.val_loss_every=0"))
    run(tiny_args(data_dir, acc, "train.num_iterations=3", "train.batch_size=2", "train.total_batch_size=128",
                  "train.val_loss_every=0"))
    losses = [[r["loss"] for r in metrics(out) if "loss" in r] for out in (big, acc)]
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    wa, _, _ = load_checkpoint(big)
    wb, _, _ = load_checkpoint(acc)
    # float32 sums in another order; Adam divides near-zero gradients of rarely seen byte embeddings by their
    # own magnitude, so those entries can move by a few percent of one lr-sized step (1e-3): atol 1e-4
    for k in wa:
        np.testing.assert_allclose(wa[k], wb[k], rtol=1e-4, atol=1e-4, err_msg=k)


def test_nan_loss_stops_with_step_and_keeps_last_checkpoint(data_dir, tmp_path):
    out = tmp_path / "nan"
    proc = run(tiny_args(data_dir, out, "train.num_iterations=20", "train.save_every=1", "train.learning_rate=1e6",
                         "train.grad_clip=0", "train.warmup_iters=0"), check=False)
    assert proc.returncode == 1
    assert re.search(r"error: (loss|gradient norm) became (nan|inf) at step \d+ \(1 non-finite step\(s\) in a row, "
                     r"train.skip_nonfinite=0\)", proc.stderr), proc.stderr[-2000:]
    assert list_checkpoints(out), "the last good checkpoint stays"
    load_checkpoint(out)


def test_bad_config_fails_before_any_work(tmp_path):
    proc = run([f"out_dir={tmp_path / 'x'}", "train.learning_rat=1"], check=False)
    assert proc.returncode != 0
    assert "train.learning_rat: unknown key (did you mean 'train.learning_rate'?)" in proc.stderr
    assert not (tmp_path / "x").exists()


def test_step_seed_differs_per_rank_and_step_and_repeats_exactly():
    from infini_train.training import step_seed

    seeds = {(r, s): step_seed(1337, r, s) for r in range(2) for s in range(3)}
    assert len(set(seeds.values())) == 6  # dropout masks differ across ranks and steps
    assert step_seed(1337, 1, 2) == seeds[(1, 2)]  # a resumed run redraws the same masks


def test_missing_validation_shards_are_one_clear_error(data_dir, tmp_path):
    proc = run(tiny_args(data_dir, tmp_path / "run", "train.num_iterations=2", f"data.val={tmp_path}/nowhere_*.bin"),
               check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"error: data.val: no token shards match '{tmp_path}/nowhere_*.bin'" in proc.stderr
    assert "data.val=null" in proc.stderr
