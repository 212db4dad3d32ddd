"""infini_train.run_state in one process: the whole format is the sharded format's consolidation (a sharded
checkpoint consolidated is byte for byte the whole checkpoint of the same state), one reader fills a model and
optimizer from either format, tensor files are those safetensors writes, and the param groups' numbering."""
import json
import os
from types import SimpleNamespace

import numpy as np
import pytest

import infini_train as it
from infini_train.models.gpt2 import GPT2, GPT2Config
from infini_train.optim import AdamW
from infini_train.optim.param_groups import numbering, packed_groups, paired
from infini_train.run_state import RunState, load_checkpoint, param_groups
from infini_train.run_state.whole_files import write_tensor_file
from infini_train.tools.consolidate import consolidate

ONE = SimpleNamespace(tensor_parallel=False, pipeline_parallel=False, world=1, dp_rank=0, dp_size=1)
TENSOR_FILES = ("model.safetensors", "optimizer.safetensors")


def trained(seed=0, steps=2):
    """A tiny GPT-2 and its AdamW after ``steps`` updates."""
    it.manual_seed(seed)
    model = GPT2(GPT2Config(block_size=8, vocab_size=31, n_layer=2, n_head=2, n_embd=8))
    optimizer = AdamW(model.optimizer_groups(0.1), lr=1e-2)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        idx = it.tensor(rng.integers(0, 31, (2, 8)))
        model(idx, idx)[1].backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer


def read(path):
    with open(path, "rb") as f:
        return f.read()


def test_tensor_files_are_the_bytes_safetensors_writes(tmp_path):
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    arrays = {"b.weight": rng.standard_normal((3, 4)).astype(np.float32), "a": np.arange(5, dtype=np.int64),
              "z": rng.standard_normal(2), "h": np.ones((2, 2), np.float16), "m": np.array([True, False]),
              "c": np.arange(3, dtype=np.int32), "empty": np.zeros((0, 3), np.float32)}
    save_file(arrays, str(tmp_path / "theirs.safetensors"))
    infos = {k: (v.shape, {"f": {4: "F32", 8: "F64", 2: "F16"}, "i": {8: "I64", 4: "I32"}, "b": {1: "BOOL"}}
                 [v.dtype.kind][v.dtype.itemsize]) for k, v in arrays.items()}
    write_tensor_file(str(tmp_path / "ours.safetensors"), infos, arrays.__getitem__)
    assert read(tmp_path / "ours.safetensors") == read(tmp_path / "theirs.safetensors")


def test_a_consolidated_sharded_checkpoint_is_the_whole_checkpoint_byte_for_byte(tmp_path):
    model, optimizer = trained()
    state = RunState(model, optimizer, ONE)
    record = {"data": [{"shard": 0, "position": 3}], "arch": "gpt2"}
    whole = state.save(str(tmp_path / "whole"), 2, "whole", record, run_id="r")
    sharded = state.save(str(tmp_path / "sharded"), 2, "sharded", record, run_id="r")
    assert sorted(os.listdir(sharded)) == ["metadata.json", "shard00000.safetensors", "state.json"]
    out = consolidate(sharded, str(tmp_path / "consolidated"))
    for name in TENSOR_FILES:
        assert read(os.path.join(out, name)) == read(os.path.join(whole, name)), name
    ours, theirs = (json.load(open(os.path.join(p, "state.json"))) for p in (out, whole))
    ours.pop("state_sha256"), theirs.pop("state_sha256")
    assert list(ours) == list(theirs) and ours == theirs


@pytest.mark.parametrize("fmt", ["whole", "sharded"])
def test_one_reader_fills_a_model_and_optimizer_from_either_format(tmp_path, fmt):
    model, optimizer = trained()
    path = RunState(model, optimizer, ONE).save(str(tmp_path), 2, fmt, {"data": []})
    fresh, fresh_optimizer = trained(seed=1, steps=1)
    saved = RunState(fresh, fresh_optimizer, ONE).load(path)
    assert saved["step"] == 2 and saved.get("format") == ("sharded" if fmt == "sharded" else None)
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=name)
    ours, theirs = optimizer.state_dict(), fresh_optimizer.state_dict()
    assert ours["param_groups"] == theirs["param_groups"]
    for i, entry in ours["state"].items():
        assert entry["step"] == theirs["state"][i]["step"]
        for key in ("exp_avg", "exp_avg_sq"):
            np.testing.assert_array_equal(entry[key].numpy(), theirs["state"][i][key].numpy())
    model_state, optimizer_state, _ = load_checkpoint(path)  # either format, assembled in one process
    assert sorted(model_state) == sorted(model.state_dict())
    assert optimizer_state["param_groups"] == ours["param_groups"]


def test_gather_in_one_process_is_the_state_dicts():
    model, optimizer = trained()
    model_state, optimizer_state = RunState(model, optimizer, ONE).gather()
    assert list(model_state) == list(model.state_dict())
    ours = optimizer.state_dict()
    assert optimizer_state["param_groups"] == ours["param_groups"] and list(optimizer_state["state"]) == list(
        ours["state"])


def test_param_groups_number_across_groups_or_in_an_optimizers_order():
    groups = [{"params": ["w", "v"], "lr": 0.1}, {"params": ["b"], "lr": 0.2, "betas": (0.9, 0.95)}]
    index = numbering(groups, key=str)
    assert index == {"w": 0, "v": 1, "b": 2}
    assert packed_groups(groups, index, key=str) == [{"lr": 0.1, "params": [0, 1]},
                                                     {"lr": 0.2, "betas": (0.9, 0.95), "params": [2]}]
    assert numbering(groups, order=["b", "w", "v"], key=str) == {"b": 0, "w": 1, "v": 2}
    assert paired([{"params": [2, 0]}, {"params": ["1"]}], [{"params": "xy"}, {"params": "z"}]) == {2: "x", 0: "y",
                                                                                                   1: "z"}
    record = param_groups.record([{k: v for k, v in g.items() if k != "params"} for g in groups],
                                 [g["params"] for g in groups])
    assert param_groups.numbered(record)[1][1] == {"lr": 0.2, "betas": (0.9, 0.95), "params": [2]}
    assert param_groups.numbered(record, order=["v", "b", "w"])[1][0]["params"] == [2, 0]
    assert param_groups.names_by_number([{"params": [1, 0]}], [["w", "v"]]) == {1: "w", 0: "v"}
    assert param_groups.names_by_number([{"params": [1, 0]}], [["w"]]) is None
