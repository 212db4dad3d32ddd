"""it.save / it.load keep a tensor and its views sharing storage, as torch.save / torch.load do, and hold NumPy arrays
(loaded back as NumPy arrays, as torch's pickle-based save keeps them); files of the previous format version load."""
import io

import numpy as np
import torch

import infini_train as it
from infini_train import serialization


def roundtrip(obj):
    buffer = io.BytesIO()
    it.save(obj, buffer)
    buffer.seek(0)
    return it.load(buffer)


def torch_roundtrip(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def test_views_come_back_sharing_storage_as_torchs_do(tmp_path):
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = it.tensor(base)
    saved = {"a": t, "b": t[1:], "c": t[:, 1::2], "d": t.t()}
    tt = torch.tensor(base)
    theirs = torch_roundtrip({"a": tt, "b": tt[1:]})
    it.save(saved, tmp_path / "views.it")
    ours = it.load(tmp_path / "views.it")
    for key in saved:
        np.testing.assert_array_equal(ours[key].numpy(), saved[key].numpy(), err_msg=key)
    ours["a"].array[1, 1] = 100.0
    theirs["a"][1, 1] = 100.0
    assert ours["b"].numpy()[0, 1] == theirs["b"][0, 1].item() == 100.0
    assert ours["c"].numpy()[1, 0] == 100.0 and ours["d"].numpy()[1, 1] == 100.0
    ours["b"].array[...] = -1
    assert (ours["a"].numpy()[1:] == -1).all() and ours["a"].numpy()[0, 0] == 0


def test_only_the_covered_span_of_a_base_is_stored():
    base = it.tensor(np.arange(1000, dtype=np.float32))
    buffer = io.BytesIO()
    it.save({"x": base[10:20], "y": base[15:30]}, buffer)
    assert len(buffer.getvalue()) < 1000  # 20 floats, not the whole base
    buffer.seek(0)
    ours = it.load(buffer)
    ours["x"].array[5] = -7
    assert ours["y"].numpy()[0] == -7


def test_numpy_arrays_are_saved_and_loaded_as_numpy_arrays():
    a = np.arange(6, dtype=np.int64).reshape(2, 3)
    loaded = roundtrip({"rng": a, "again": a, "t": it.tensor(a.astype(np.float32))})
    theirs = torch_roundtrip({"rng": a})
    assert type(loaded["rng"]) is type(theirs["rng"]) is np.ndarray
    np.testing.assert_array_equal(loaded["rng"], a)
    assert loaded["again"] is loaded["rng"] and loaded["rng"].dtype == np.int64


def test_files_of_format_version_1_still_load(monkeypatch):
    monkeypatch.setattr(serialization, "VERSION", "1")
    buffer = io.BytesIO()
    it.save({"w": it.tensor([1.0, 2.0])}, buffer)
    buffer.seek(0)
    monkeypatch.undo()
    np.testing.assert_array_equal(it.load(buffer)["w"].numpy(), [1.0, 2.0])
