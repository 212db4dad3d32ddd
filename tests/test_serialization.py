"""it.save / it.load: round trips of every supported kind, training resumes exactly, the file is plain
safetensors (no pickle), atomic writes, device mapping and the errors."""
import io
import json
import math
import os
import re
import struct
from collections import OrderedDict

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

import infini_train as it
from infini_train import backend, nn, optim
from infini_train import serialization

DTYPES = ["float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "uint16", "bool"]


def random_array(name, shape, seed=0):
    """Every bit pattern counts: floats get random bits (nan payloads, infs, subnormals included)."""
    rng = np.random.default_rng(seed)
    dtype = backend.as_dtype(name)
    if name == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    raw = rng.integers(0, 256, int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


def assert_identical(got, want, where="obj"):
    """Same types all the way down, same dict key order and key types, floats and tensors bitwise equal."""
    assert type(got) is type(want), (where, type(got), type(want))
    if isinstance(want, it.Tensor):
        assert (got.dtype, got.shape, got.requires_grad, got.device) == \
            (want.dtype, want.shape, want.requires_grad, want.device), where
        assert got.numpy().tobytes() == want.numpy().tobytes(), where
    elif isinstance(want, dict):
        assert [(type(k), k) for k in got] == [(type(k), k) for k in want], where
        for k in want:
            assert_identical(got[k], want[k], f"{where}[{k!r}]")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want)):
            assert_identical(a, b, f"{where}[{i}]")
    elif isinstance(want, float):
        assert struct.pack("<d", got) == struct.pack("<d", want), (where, got, want)
    else:
        assert got == want, where


def everything():
    tensors = {name: it.tensor(random_array(name, (3, 5), seed=i)) for i, name in enumerate(DTYPES)}
    return {
        "none": None, "true": True, "false": False, "int": -7, "big": 2 ** 80, "zero": 0,
        "float": 0.1, "neg_zero": -0.0, "tiny": 5e-324, "inf": math.inf, "neg_inf": -math.inf, "nan": math.nan,
        "str": 'héllo "quoted" {"dict": 1} \n', "": "empty key",
        3: "int key", -1: [1, 2.5, "x"], True: "bool key",
        "list": [1, [2, (3, "a", None)], []], "tuple": (), "one_tuple": ({"a": (1.5,)},),
        "empty_dict": {}, "ordered": OrderedDict([("b", 1), ("a", 2)]),
        "tensors": tensors,
        "scalar": it.tensor(np.float32(3.25)), "scalar_bf16": it.tensor(np.array(-1.5, backend.bfloat16)),
        "empty": it.zeros((0, 3)), "empty_int": it.tensor(np.zeros((2, 0, 4), np.int64)),
        "strided": it.tensor(np.arange(24, dtype=np.float32).reshape(4, 6)).transpose(0, 1),
        "needs_grad": it.tensor(np.array([1.0, 2.0], np.float32), requires_grad=True),
        "param": nn.Parameter(it.tensor(random_array("float32", (2, 2), seed=9))),
        "frozen_param": nn.Parameter(it.ones(3), requires_grad=False),
        "logical_device": it.tensor(np.array([1.0, 2.0], np.float32), device="cpu:1"),
    }


@pytest.mark.parametrize("target", ["str", "pathlib", "file_object"])
def test_round_trip_of_every_kind(tmp_path, target):
    obj = everything()
    if target == "file_object":
        buf = io.BytesIO()
        it.save(obj, buf)
        buf.seek(0)
        back = it.load(buf)
    else:
        path = str(tmp_path / "obj.it") if target == "str" else tmp_path / "obj.it"
        it.save(obj, path)
        back = it.load(path)
    assert_identical(back, obj)
    assert back["tensors"]["bfloat16"].dtype == it.bfloat16 and back["tensors"]["bfloat16"].dtype.itemsize == 2
    assert back["scalar"].shape == () and back["empty"].shape == (0, 3)
    assert isinstance(back["param"], nn.Parameter) and not isinstance(back["needs_grad"], nn.Parameter)
    assert back["param"].requires_grad and not back["frozen_param"].requires_grad
    assert back["logical_device"].device == it.device("cpu:1")
    assert back["tensors"]["float32"].array.flags.writeable  # loaded tensors are ordinary, writable tensors
    back["tensors"]["float32"].array[0, 0] = 1.0
    for plain in (None, 3, -2.5, "s", [], (1, (2,)), math.nan):  # a bare value is an object too
        buf = io.BytesIO()
        it.save(plain, buf)
        assert_identical(it.load(io.BytesIO(buf.getvalue())), plain)


def header_of(data):
    (length,) = struct.unpack("<Q", data[:8])
    return length, json.loads(data[8:8 + length])


def test_file_is_plain_safetensors_without_pickle(tmp_path):
    path = tmp_path / "obj.safetensors"
    obj = everything()
    it.save(obj, path)
    data = path.read_bytes()
    length, header = header_of(data)
    meta = header.pop("__metadata__")
    assert meta["format"] == "infini_train" and meta["version"] == "2"
    json.loads(meta["structure"])  # the object's description is JSON
    # every byte is accounted for: the header, then exactly the tensors' bytes back to back
    spans = sorted(spec["data_offsets"] for spec in header.values())
    assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert 8 + length + spans[-1][1] == len(data)
    assert sorted(s["shape"] for s in header.values() if s["dtype"] == "BF16") == [[], [3, 5]]
    assert not data.startswith(b"PK") and b"\x80\x04\x95" not in data[:8 + length]
    # other safetensors readers see the tensors: torch reads the bfloat16 tensor as bfloat16
    from safetensors.torch import load_file

    theirs = load_file(str(path))
    bf16 = [v for v in theirs.values() if v.dtype == torch.bfloat16]
    assert len(bf16) == 2  # the (3, 5) tensor and the 0-d one
    want = obj["tensors"]["bfloat16"].numpy().view(np.uint16)
    got = next(v for v in bf16 if v.dim() == 2).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(got, want)


def test_shared_arrays_are_stored_once_and_come_back_shared(tmp_path):
    tied = it.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    view = tied.detach()
    obj = {"a": tied, "b": view, "c": [tied], "other": it.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))}
    path = tmp_path / "tied"
    it.save(obj, path)
    _, header = header_of(path.read_bytes())
    assert len(header) - 1 == 2  # one entry for the tied array, one for "other"
    back = it.load(path)
    assert back["c"][0] is back["a"]  # the same Tensor object comes back as one object
    assert back["b"] is not back["a"] and back["b"].array is back["a"].array
    assert back["other"].array is not back["a"].array
    back["a"].array[0, 0] = 42.0
    assert back["b"].array[0, 0] == 42.0
    moved = it.load(path, map_location="cpu:3")
    assert moved["a"].device == moved["b"].device == it.device("cpu:3") and moved["a"].array is moved["b"].array


def small_model(seed):
    it.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 3))


def train(model, opt, steps, x, y):
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()


def test_model_and_adamw_state_resume_the_exact_trajectory(tmp_path):
    rng = np.random.default_rng(0)
    x, y = it.tensor(rng.standard_normal((16, 4)).astype(np.float32)), it.tensor(rng.integers(0, 3, 16))
    model = small_model(0)
    opt = optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1, betas=(0.8, 0.95))
    train(model, opt, 3, x, y)
    it.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 3}, tmp_path / "ckpt")
    train(model, opt, 4, x, y)

    fresh = small_model(1)  # different initial weights: everything must come from the file
    fresh_opt = optim.AdamW(fresh.parameters(), lr=0.5)
    ckpt = it.load(tmp_path / "ckpt")
    assert ckpt["step"] == 3 and type(ckpt["model"]) is OrderedDict
    assert sorted(ckpt["optimizer"]["state"]) == [0, 1, 2, 3]  # int keys stay ints
    assert ckpt["optimizer"]["param_groups"][0]["betas"] == (0.8, 0.95)  # tuples stay tuples
    fresh.load_state_dict(ckpt["model"])
    fresh_opt.load_state_dict(ckpt["optimizer"])
    train(fresh, fresh_opt, 4, x, y)
    for (name, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items()):
        assert a.numpy().tobytes() == b.numpy().tobytes(), name


def test_interrupted_write_leaves_no_partial_file(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.it"
    it.save({"v": 1}, path)
    before = path.read_bytes()
    real_fsync, seen = os.fsync, []

    def interrupted_fsync(fd):
        seen.append((path.read_bytes() == before, os.path.exists(tmp_path / "new.it"), len(os.listdir(tmp_path))))
        raise KeyboardInterrupt  # e.g. Ctrl-C after the data was written but before the rename

    monkeypatch.setattr(serialization.os, "fsync", interrupted_fsync)
    with pytest.raises(KeyboardInterrupt):
        it.save({"v": it.ones(1000)}, path)
    with pytest.raises(KeyboardInterrupt):
        it.save({"v": 2}, tmp_path / "new.it")
    monkeypatch.setattr(serialization.os, "fsync", real_fsync)
    # while the data was being made durable it sat in a temporary file beside the untouched destination
    assert seen == [(True, False, 2), (True, False, 2)]
    assert path.read_bytes() == before and it.load(path) == {"v": 1}
    assert sorted(os.listdir(tmp_path)) == ["ckpt.it"]  # no temporary files left, no partial new.it
    synced = []
    monkeypatch.setattr(serialization.os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    it.save({"v": 3}, path)
    assert synced and it.load(path) == {"v": 3} and sorted(os.listdir(tmp_path)) == ["ckpt.it"]


def test_map_location(tmp_path):
    obj = {"a": it.tensor(np.ones(2, np.float32), device="cpu:2"), "b": it.ones(3)}
    it.save(obj, tmp_path / "f")
    back = it.load(tmp_path / "f")
    assert (back["a"].device, back["b"].device) == (it.device("cpu:2"), it.device("cpu"))
    for where in ("cpu", it.device("cpu:1")):
        moved = it.load(tmp_path / "f", map_location=where)
        assert moved["a"].device == moved["b"].device == it.device(where)
        np.testing.assert_array_equal(moved["a"].numpy(), obj["a"].numpy())
    with pytest.raises(TypeError, match="map_location"):
        it.load(tmp_path / "f", map_location={"cuda:0": "cpu"})


def rewrite_metadata(path, edit):
    """The same file with its structure description edited (as if written on another machine)."""
    data = path.read_bytes()
    length, header = header_of(data)
    meta = header.pop("__metadata__")
    arrays = {k: np.frombuffer(data[8 + length + s["data_offsets"][0]:8 + length + s["data_offsets"][1]],
                               {"F32": np.float32}[s["dtype"]]).reshape(s["shape"]) for k, s in header.items()}
    meta["structure"] = edit(meta["structure"])
    save_file(arrays, str(path), metadata=meta)


def test_cuda_tensors_without_a_gpu_need_map_location(tmp_path):
    path = tmp_path / "gpu"
    it.save({"w": it.ones(2)}, path)
    rewrite_metadata(path, lambda s: s.replace('"device":"cpu"', '"device":"cuda:7"'))
    if backend.device_count("cuda") <= 7:
        with pytest.raises(RuntimeError, match=r"cuda:7.*\n.*map_location='cpu'"):
            it.load(path)
    back = it.load(path, map_location="cpu")
    assert back["w"].device == it.device("cpu") and back["w"].numpy().tolist() == [1.0, 1.0]


class Opaque:
    pass


@pytest.mark.parametrize("obj,where,hint", [
    ({"model": nn.Linear(2, 2)}, r"obj\['model'\] of type Linear", r"model\.state_dict\(\)"),
    ({"opt": [optim.SGD([nn.Parameter(it.ones(1))], lr=0.1)]}, r"obj\['opt'\]\[0\] of type SGD",
     r"optimizer\.state_dict\(\)"),
    ([1, {"x": Opaque()}], r"obj\[1\]\['x'\] of type Opaque", "convert it"),
    ({"x": {(1, 2): 3}}, r"obj\['x'\] has a key \(1, 2\) of type tuple", "keys"),
    ({"n": np.int64(3)}, r"obj\['n'\] of type int64", r"\.item\(\)"),
    ({1.5: "float key"}, "key 1.5 of type float", "keys"),
    ({"s": {1, 2}}, r"obj\['s'\] of type set", "convert"),
])
def test_save_rejects_unsupported_objects_and_says_where(tmp_path, obj, where, hint):
    with pytest.raises(TypeError, match=where) as error:
        it.save(obj, tmp_path / "bad")
    assert "HINT" in str(error.value) and re.search(hint, str(error.value))
    assert not os.listdir(tmp_path)  # nothing written


def test_save_rejects_cycles_and_bad_targets():
    loop = []
    loop.append(loop)
    with pytest.raises(ValueError, match="contains itself"):
        it.save({"loop": loop}, io.BytesIO())
    with pytest.raises(TypeError, match="path.*or a binary file object"):
        it.save({}, 42)


def test_load_rejects_files_it_did_not_write(tmp_path):
    torch_file = tmp_path / "model.pt"
    torch.save({"w": torch.ones(2)}, torch_file)
    legacy = tmp_path / "legacy.pt"
    torch.save({"w": torch.ones(2)}, legacy, _use_new_zipfile_serialization=False)
    plain = tmp_path / "plain.safetensors"
    save_file({"w": np.ones(2, np.float32)}, str(plain))
    good = tmp_path / "good"
    it.save({"w": it.ones(100)}, good)
    truncated = tmp_path / "truncated"
    truncated.write_bytes(good.read_bytes()[:-7])
    header_cut = tmp_path / "header_cut"
    header_cut.write_bytes(good.read_bytes()[:20])
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    cases = [(torch_file, "zip/pickle"), (legacy, "zip/pickle"), (plain, "without infini_train.save's metadata"),
             (truncated, "truncated"), (header_cut, "truncated"), (empty, "only 0 bytes"), (garbage, "not JSON")]
    for path, why in cases:
        with pytest.raises(ValueError, match=why) as error:
            it.load(path)
        assert str(path) in str(error.value) and "HINT" in str(error.value), path
    with pytest.raises(ValueError, match=r"<BytesIO> .*truncated"):
        it.load(io.BytesIO(good.read_bytes()[:-1]))
    rewrite_metadata(good, lambda s: s.replace('"storage":"0"', '"storage":"9"'))
    with pytest.raises(ValueError, match="corrupted structure"):
        it.load(good)
    with pytest.raises(FileNotFoundError):
        it.load(tmp_path / "missing")
