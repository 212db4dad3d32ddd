import json
import os
import stat

import numpy as np
import pytest

from infini_train.run_state import (
    CheckpointError,
    flatten_state,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
    unflatten_state,
    verify_checkpoint,
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
    with pytest.raises(CheckpointError, match=r"checkpoint .*step_000005 is damaged: model.safetensors is truncated "
                                              r"\(7 bytes, \d+ written\)"):
        load_checkpoint(path)


# ----------------------------------------------------------------------------- ownership, durability, umask
def _save(out, step, run_id, keep_last=None):
    return save_checkpoint(str(out), step, {"w": np.arange(4, dtype=np.float32) + step},
                           {"state": {}, "param_groups": []}, {"data": []}, keep_last=keep_last, run_id=run_id)


def test_pruning_touches_only_the_current_runs_checkpoints(tmp_path):
    foreign = _save(tmp_path, 100, "earlier-run")
    for step in (1, 2, 3):
        _save(tmp_path, step, "this-run", keep_last=2)
    names = [os.path.basename(p) for p in list_checkpoints(str(tmp_path))]
    assert names == ["step_000002", "step_000003", "step_000100"] and os.path.isdir(foreign)
    assert [os.path.basename(p) for p in list_checkpoints(str(tmp_path), run_id="this-run")] == ["step_000002",
                                                                                                 "step_000003"]


def test_a_killed_saves_temporary_directory_is_removed_by_the_next_save(tmp_path):
    stale = tmp_path / "checkpoints" / ".tmp-step_000005-abcd1234"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"half written")
    _save(tmp_path, 6, "run")
    assert not stale.exists() and [os.path.basename(p) for p in list_checkpoints(str(tmp_path))] == ["step_000006"]


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_checkpoint_directories_and_files_honour_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        path = _save(tmp_path, 1, "run")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o777 & ~umask
    for name in ("model.safetensors", "optimizer.safetensors", "state.json"):
        assert stat.S_IMODE(os.stat(os.path.join(path, name)).st_mode) == 0o666 & ~umask, name


def test_tensor_files_and_directory_are_fsynced_before_the_completion_marker(tmp_path, monkeypatch):
    events = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    real_open = open

    def recording_open(path, mode="r", *args, **kwargs):
        if str(path).endswith("state.json") and "w" in mode:
            events.append(("write", str(path)))
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr("builtins.open", recording_open)
    path = _save(tmp_path, 1, "run")
    marker = next(i for i, e in enumerate(events) if e[0] == "write")
    synced_first = {os.path.basename(p) for kind, p in events[:marker] if kind == "fsync"}
    assert {"model.safetensors", "optimizer.safetensors"} <= synced_first
    assert any(os.path.basename(p).startswith(".tmp-step_000001-") for kind, p in events[:marker] if kind == "fsync"), \
        "the temporary directory itself"
    assert ("fsync", str(tmp_path / "checkpoints")) in events[marker:], "the parent after the rename"
    verify_checkpoint(path)
