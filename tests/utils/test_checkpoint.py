import json
import os

import numpy as np
import pytest

from infini_train.utils.checkpoint import (
    CheckpointError,
    flatten_state,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
    unflatten_state,
)


def opt_state():
    return {"state": {0: {"step": 3, "exp_avg": np.arange(4, dtype=np.float32)},
                      1: {"step": 3, "exp_avg": np.ones((2, 2), np.float32)}},
            "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.95), "params": [0, 1]}]}


def test_flatten_round_trip_keeps_int_keys_tuples_and_arrays():
    arrays, skeleton = flatten_state(opt_state())
    json.dumps(skeleton)  # JSON-serialisable
    back = unflatten_state(json.loads(json.dumps(skeleton)), arrays)
    assert back["param_groups"][0]["betas"] == (0.9, 0.95)
    assert set(back["state"]) == {0, 1}
    np.testing.assert_array_equal(back["state"][0]["exp_avg"], np.arange(4))


def test_save_load_and_keep_last(tmp_path):
    model = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "tied": None}
    model["tied"] = model["w"]  # shared memory, like tied embeddings
    for step in (10, 20, 30):
        save_checkpoint(tmp_path, step, model, opt_state(), {"data": {"position": step}}, keep_last=2)
    names = [os.path.basename(p) for p in list_checkpoints(tmp_path)]
    assert names == ["step_000020", "step_000030"]
    m, o, s = load_checkpoint(tmp_path)
    assert s["step"] == 30 and s["data"] == {"position": 30}
    np.testing.assert_array_equal(m["tied"], model["w"])
    assert o["state"][1]["step"] == 3


def test_incomplete_checkpoint_is_skipped_and_previous_stays_loadable(tmp_path):
    save_checkpoint(tmp_path, 1, {"w": np.ones(2, np.float32)}, {}, {})
    # a write killed midway: the temp dir exists, no state.json, never renamed
    broken = tmp_path / "checkpoints" / ".tmp-step_000002-abc"
    broken.mkdir()
    (broken / "model.safetensors").write_bytes(b"partial")
    half = tmp_path / "checkpoints" / "step_000003"
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"partial")
    assert latest_checkpoint(tmp_path).endswith("step_000001")
    m, _, s = load_checkpoint(tmp_path)
    assert s["step"] == 1


def test_missing_and_corrupt_checkpoints_are_clear(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint found"):
        load_checkpoint(tmp_path)
    path = save_checkpoint(tmp_path, 5, {"w": np.ones(2, np.float32)}, {}, {})
    with open(os.path.join(path, "model.safetensors"), "wb") as f:
        f.write(b"garbage")
    with pytest.raises(CheckpointError, match="unreadable"):
        load_checkpoint(path)
