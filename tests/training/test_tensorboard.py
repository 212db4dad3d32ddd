"""tensorboard=true: out_dir/tb/ event files that TensorBoard's EventAccumulator reads back with the same values as
metrics.jsonl at every step; a resumed run continues the series (the earlier attempt's later steps hidden); a
missing tensorboardX is one ConfigError naming the key."""
import builtins
import glob
import os
import shutil

import numpy as np
import pytest

from infini_train.training import tensorboard_log
from infini_train.training.config import ConfigError
from tests.training.tiny_run import metrics, run, tiny_args

pytest.importorskip("tensorboardX")
event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
event_file_loader = pytest.importorskip("tensorboard.backend.event_processing.event_file_loader")

COMMON = ["tensorboard=true", "train.num_iterations=12", "train.save_every=4", "train.keep_last=3"]
TRAIN_TAGS = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm",
              "tokens_per_s": "train/tokens_per_s", "mfu": "train/mfu"}


def scalars(out_dir):
    """tag -> [(step, value)] as TensorBoard shows them (orphaned steps of an earlier attempt purged)."""
    acc = event_accumulator.EventAccumulator(os.path.join(out_dir, "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def raw_steps(out_dir, tag):
    """Every step at which ``tag`` was written, in every event file, before any purging."""
    steps = []
    for path in sorted(glob.glob(os.path.join(out_dir, "tb", "events.*"))):
        for event in event_file_loader.EventFileLoader(path).Load():
            steps += [event.step for v in event.summary.value if v.tag == tag]
    return steps


def assert_same_as_metrics(out_dir):
    rows = metrics(out_dir)
    tb = scalars(out_dir)
    assert set(tb) == set(TRAIN_TAGS.values()) | {"val/loss"}
    train_rows = [r for r in rows if "loss" in r]
    for key, tag in TRAIN_TAGS.items():
        assert [s for s, _ in tb[tag]] == [r["step"] for r in train_rows], tag
        # TensorBoard keeps float32 scalars: equal to the logged value rounded to float32
        np.testing.assert_array_equal([v for _, v in tb[tag]], np.float32([r[key] for r in train_rows]), err_msg=tag)
    val_rows = [r for r in rows if "val_loss" in r]
    assert [s for s, _ in tb["val/loss"]] == [r["step"] for r in val_rows]
    np.testing.assert_array_equal([v for _, v in tb["val/loss"]], np.float32([r["val_loss"] for r in val_rows]))
    return tb


@pytest.fixture(scope="module")
def finished(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("tb_run")
    run(tiny_args(data_dir, out, *COMMON))
    return out


def test_event_files_hold_the_metrics_of_every_step(finished):
    assert len(glob.glob(os.path.join(finished, "tb", "events.out.tfevents.*"))) == 1
    tb = assert_same_as_metrics(finished)
    assert [s for s, _ in tb["train/loss"]] == list(range(12))
    assert [s for s, _ in tb["val/loss"]] == [0, 5, 10, 12]  # val_loss_every=5 and the final model's at 12
    assert tb["train/loss"][-1][1] < tb["train/loss"][0][1]
    assert all(0 < v < 1 for _, v in tb["train/mfu"]) and all(v > 0 for _, v in tb["train/tokens_per_s"])


def test_a_resumed_run_continues_the_series(data_dir, finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    shutil.rmtree(out / "checkpoints" / "step_000012")  # as if it died after logging steps 8..11
    run(tiny_args(data_dir, out, *COMMON, "resume=auto"))
    assert len(glob.glob(os.path.join(out, "tb", "events.*"))) == 2
    # both attempts wrote steps 8..11; TensorBoard shows the series once, with the resumed attempt's values
    assert raw_steps(out, "train/loss") == list(range(12)) + list(range(8, 12))
    tb = assert_same_as_metrics(out)
    assert [s for s, _ in tb["train/loss"]] == list(range(12))
    assert [s for s, _ in tb["val/loss"]] == [0, 5, 10, 12]
    # the resume is bitwise, so the continued series equals the uninterrupted one
    assert tb["train/loss"] == scalars(finished)["train/loss"]


def test_tensorboard_off_writes_no_tb_dir(data_dir, tmp_path):
    run(tiny_args(data_dir, tmp_path, "train.num_iterations=2", "train.val_loss_every=0"))
    assert not (tmp_path / "tb").exists() and len(metrics(tmp_path)) == 2


def test_missing_tensorboardx_is_a_config_error_naming_the_key(monkeypatch, tmp_path):
    real_import = builtins.__import__

    def blocked(name, *args, **kwargs):
        if name == "tensorboardX":
            raise ModuleNotFoundError("No module named 'tensorboardX'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", blocked)
    with pytest.raises(ConfigError, match=r"^tensorboard: true needs the tensorboardX package[\s\S]*"
                                          r"HINT: pip install 'infini_train\[tensorboard\]', or set tensorboard=false"):
        tensorboard_log.RunLog(None, str(tmp_path), tensorboard=True, enabled=False)  # every rank checks
    tensorboard_log.RunLog(None, str(tmp_path), tensorboard=False)  # not asked for: not needed
    assert not (tmp_path / "tb").exists()


def test_a_run_without_tensorboardx_stops_with_one_message(data_dir, tmp_path):
    blocker = tmp_path / "blocked"
    blocker.mkdir()
    (blocker / "tensorboardX.py").write_text("raise ImportError('tensorboardX is blocked for this test')\n")
    from tests.training.tiny_run import job_env

    env = job_env(PYTHONPATH=os.pathsep.join([str(blocker), os.environ.get("PYTHONPATH", "")]))
    proc = run(tiny_args(data_dir, tmp_path / "out", "tensorboard=true", "train.num_iterations=2"), check=False,
               env=env)
    assert proc.returncode == 1
    assert ("error: tensorboard: true needs the tensorboardX package, which could not be imported (tensorboardX is "
            "blocked for this test)\nHINT: pip install 'infini_train[tensorboard]'") in proc.stderr
    assert not (tmp_path / "out" / "tb").exists()


def test_a_moe_run_logs_its_router_metrics_too(data_dir, tmp_path):
    from tests.training.test_moe_runs import CONFIGS, MOE_KEYS, SMALL

    run(tiny_args(data_dir, tmp_path, "tensorboard=true", "train.num_iterations=3", "train.val_loss_every=0",
                  *SMALL["qwen3_moe"]), config=CONFIGS["qwen3_moe"])
    rows = [r for r in metrics(tmp_path) if "loss" in r]
    tb = scalars(tmp_path)
    for key in MOE_KEYS:
        tag = f"train/{key}"
        assert [s for s, _ in tb[tag]] == [r["step"] for r in rows] == [0, 1, 2], tag
        np.testing.assert_array_equal([v for _, v in tb[tag]], np.float32([r[key] for r in rows]), err_msg=tag)
