"""A fully_shard model's state as FSDP2 users take it: ``model.state_dict()`` and ``optimizer.state_dict()`` hold each
rank's shards with their placement (ShardedTensor, as DTensor), it.distributed.checkpoint's get_/set_model_state_dict
and get_/set_optimizer_state_dict (torch 2.13's names and layout) give and load them sharded or full, and
it.distributed.checkpoint.save / load write and read them, nested with their other values. One process here; 2 and 3
ranks under mpiexec (worker_fsdp_state_dict.py), whose checkpoint then loads into a one-process model."""
import os

import numpy as np
import pytest

import infini_train as it
from infini_train import nn
from infini_train.distributed import checkpoint as dcp
from infini_train.distributed.checkpoint import (FlatShard, ShardedTensor, StateDictOptions, get_model_state_dict,
                                                 get_optimizer_state_dict, set_model_state_dict,
                                                 set_optimizer_state_dict)
from infini_train.distributed.fsdp import ShardedError
from infini_train.distributed.process_group import SingleProcessGroup
from tests.distributed.fsdp_cases import CONFIG, batches, build, sharded
from tests.distributed.mpi_jobs import mpirun, needs_mpiexec, output

FULL = StateDictOptions(full_state_dict=True)


def trained(model, steps=2, lr=1e-2):
    optimizer = it.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)
    for x, y in batches(steps):
        model(it.tensor(x), it.tensor(y))[1].backward()
        optimizer.step()
        optimizer.zero_grad()
    return optimizer


def test_state_dict_holds_each_shard_with_its_placement():
    model, reference = sharded(build()), build()
    state = model.state_dict()
    assert list(state) == list(reference.state_dict())
    wte, wpe = state["transformer.wte.weight"], state["transformer.wpe.weight"]
    assert isinstance(wte, ShardedTensor) and wte.shape == (CONFIG.vocab_size, CONFIG.n_embd)
    assert wte.dtype == np.float32 and list(wte.group.ranks) == [0] and wte.rank == 0
    root_numel = sum(p.numel() for p in model._fsdp.unit.params)
    assert wte.placement == FlatShard(offset=0, shard_size=root_numel)
    assert wpe.placement == FlatShard(offset=CONFIG.vocab_size * CONFIG.n_embd, shard_size=root_numel)
    assert state["lm_head.weight"].placement == wte.placement  # tied: the same shard under both names
    for key, value in reference.state_dict().items():
        np.testing.assert_array_equal(state[key].to_local().numpy(), value.numpy().reshape(-1), err_msg=key)
        np.testing.assert_array_equal(state[key].full_tensor().numpy(), value.numpy(), err_msg=key)
    with pytest.raises(ShardedError, match=r"(?s)holds only elements \[0, 2048\).*HINT: full_tensor\(\)"):
        wte.numpy()


def test_a_sharded_parameters_values_error_names_what_was_asked_and_the_way_out():
    weight = sharded(build()).transformer.wte.weight
    with pytest.raises(ShardedError) as caught:
        weight.numpy()
    message = str(caught.value)
    assert message.startswith("fully_shard: cannot read the values of a parameter of shape (64, 32) that is sharded "
                              "across the data-parallel ranks")
    assert ".get" not in message and "HINT: model.state_dict()" in message and "full_state_dict=True" in message


def test_inside_unsharded_the_state_dict_is_whole_and_loading_writes_through_to_the_shards():
    model, reference, other = sharded(build()), build(), build(2)
    with model.unsharded():
        state = model.state_dict()
        assert not any(isinstance(v, ShardedTensor) for v in state.values())
        for key, value in reference.state_dict().items():
            np.testing.assert_array_equal(state[key].numpy(), value.numpy(), err_msg=key)
        model.load_state_dict(other.state_dict())  # (as a run's whole-format resume does)
    full = get_model_state_dict(model, options=FULL)
    for key, value in other.state_dict().items():
        np.testing.assert_array_equal(full[key].numpy(), value.numpy(), err_msg=key)


def test_it_save_of_a_sharded_state_names_the_checkpoint_functions(tmp_path):
    with pytest.raises(TypeError, match=r"(?s)of type ShardedTensor.*HINT: .*it\.distributed\.checkpoint\.save"):
        it.save(sharded(build()).state_dict(), tmp_path / "model.it")


def test_optimizer_state_dict_places_state_as_its_parameter_and_loads_back():
    model = sharded(build())
    optimizer = trained(model)
    state = optimizer.state_dict()
    exp_avg = state["state"][0]["exp_avg"]
    assert isinstance(exp_avg, ShardedTensor) and exp_avg.shape == (CONFIG.vocab_size, CONFIG.n_embd)
    assert exp_avg.placement == model.state_dict()["transformer.wte.weight"].placement
    assert state["state"][0]["step"] == 2
    again = sharded(build(3))
    again_optimizer = it.optim.AdamW(again.parameters(), lr=1.0)
    again.load_state_dict(model.state_dict())
    again_optimizer.load_state_dict(state)
    for i, entry in state["state"].items():
        got = again_optimizer.state_dict()["state"][i]
        np.testing.assert_array_equal(got["exp_avg_sq"].to_local().numpy(), entry["exp_avg_sq"].to_local().numpy())
    elsewhere = ShardedTensor(np.zeros(9, np.float32), (CONFIG.vocab_size, CONFIG.n_embd), FlatShard(1, 10),
                              SingleProcessGroup())
    with pytest.raises(ValueError, match=r"(?s)expected a piece placed as this rank's.*HINT: a sharded state loads"):
        again.load_state_dict({**model.state_dict(), "transformer.wte.weight": elsewhere})


def test_full_state_dicts_equal_the_one_process_model_and_optimizer_bitwise():
    model, reference = sharded(build()), build()
    optimizer, reference_optimizer = trained(model), trained(reference)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    assert list(full) == list(reference.state_dict())
    for key, value in reference.state_dict().items():
        np.testing.assert_array_equal(full[key].numpy(), value.numpy(), err_msg=key)
    full_optimizer = get_optimizer_state_dict(model, optimizer, options=FULL)
    plain = get_optimizer_state_dict(reference, reference_optimizer)
    assert list(full_optimizer["state"]) == list(plain["state"]) == [n for n, _ in reference.named_parameters()]
    assert full_optimizer["param_groups"] == plain["param_groups"]
    for name, entry in plain["state"].items():
        assert full_optimizer["state"][name]["step"] == entry["step"] == 2
        for key in ("exp_avg", "exp_avg_sq"):
            np.testing.assert_array_equal(full_optimizer["state"][name][key].numpy(), entry[key].numpy())


def test_full_state_loads_into_a_sharded_model_and_optimizer():
    reference = build()
    reference_optimizer = trained(reference)
    model = sharded(build(4))
    optimizer = it.optim.AdamW(model.parameters(), lr=0.5)
    assert set_model_state_dict(model, get_model_state_dict(reference), options=FULL) == ([], [])
    set_optimizer_state_dict(model, optimizer, get_optimizer_state_dict(reference, reference_optimizer), options=FULL)
    x, y = batches(1, seed=9)[0]
    losses = []
    for m, o in ((reference, reference_optimizer), (model, optimizer)):
        m(it.tensor(x), it.tensor(y))[1].backward()
        o.step()
        losses.append(m(it.tensor(x), it.tensor(y))[1].item())
    assert losses[0] == losses[1]


def mlp(seed=0):
    it.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 4), nn.GELU("none"), nn.Linear(4, 3))


def test_optimizer_state_dict_by_name_is_torchs():
    torch = pytest.importorskip("torch")
    from torch.distributed.checkpoint import state_dict as torch_state

    ours = mlp()
    theirs = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.GELU(), torch.nn.Linear(4, 3))
    with torch.no_grad():
        for p, q in zip(ours.parameters(), theirs.parameters()):
            q.copy_(torch.from_numpy(p.numpy()))
    optimizer = it.optim.AdamW(ours.parameters(), lr=1e-2)
    torch_optimizer = torch.optim.AdamW(theirs.parameters(), lr=1e-2)
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    for steps in (1, 2):  # 1: both give a fresh optimizer its (zero) state, a step at learning rate 0
        if steps == 2:
            ours(it.tensor(x)).sum().backward()
            theirs(torch.from_numpy(x)).sum().backward()
            optimizer.step()
            torch_optimizer.step()
        a = get_optimizer_state_dict(ours, optimizer)
        b = torch_state.get_optimizer_state_dict(theirs, torch_optimizer)
        assert list(a["state"]) == list(b["state"]) == ["0.weight", "0.bias", "2.weight", "2.bias"]
        assert a["param_groups"][0]["params"] == b["param_groups"][0]["params"]
        assert a["param_groups"][0]["lr"] == b["param_groups"][0]["lr"] == 1e-2
        for name, entry in b["state"].items():
            assert set(a["state"][name]) == set(entry) and a["state"][name]["step"] == int(entry["step"]) == steps
            for key in ("exp_avg", "exp_avg_sq"):
                np.testing.assert_allclose(a["state"][name][key].numpy(), entry[key].numpy(), rtol=1e-5, atol=1e-8)
        for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
            np.testing.assert_allclose(p.numpy(), q.detach().numpy(), rtol=1e-5, atol=1e-7, err_msg=name)
    assert list(get_model_state_dict(ours)) == list(torch_state.get_model_state_dict(theirs))


def test_get_model_state_dict_leaves_out_ddps_prefix_as_torch(tmp_path):
    torch = pytest.importorskip("torch")
    import torch.distributed as tdist
    from torch.distributed.checkpoint import state_dict as torch_state

    from infini_train.nn.parallel import DistributedDataParallel

    tdist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        theirs = torch.nn.parallel.DistributedDataParallel(
            torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.GELU(), torch.nn.Linear(4, 3)))
        want = list(torch_state.get_model_state_dict(theirs))
    finally:
        tdist.destroy_process_group()
    ddp = DistributedDataParallel(mlp())
    assert list(get_model_state_dict(ddp)) == want == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert list(ddp.state_dict())[0] == "module.0.weight"


def test_nested_checkpoint_writes_tensors_as_pieces_and_keeps_other_values(tmp_path):
    model = sharded(build())
    optimizer = trained(model)
    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer),
             "step": 7, "note": ("tuple", 1.5)}
    dcp.save(state, checkpoint_id=tmp_path)
    metadata = dcp.read_metadata(tmp_path)
    assert metadata["objects"]["step"] == 7 and metadata["objects"]["optim/param_groups"][0]["betas"] == [0.9, 0.999]
    assert metadata["tensors"]["model/transformer.wte.weight"]["shape"] == [CONFIG.vocab_size, CONFIG.n_embd]
    plain = build(8)
    plain_optimizer = it.optim.AdamW(plain.parameters(), lr=3.0)
    back = {"model": get_model_state_dict(plain), "optim": get_optimizer_state_dict(plain, plain_optimizer),
            "step": 0, "note": None}
    dcp.load(back, checkpoint_id=tmp_path)
    assert back["step"] == 7 and back["note"] == ["tuple", 1.5]
    assert back["optim"]["param_groups"][0]["betas"] == (0.9, 0.999)  # a tuple where the state had one
    set_model_state_dict(plain, back["model"])
    set_optimizer_state_dict(plain, plain_optimizer, back["optim"])
    want = get_optimizer_state_dict(model, optimizer, options=FULL)
    got = get_optimizer_state_dict(plain, plain_optimizer)
    for name, entry in want["state"].items():
        np.testing.assert_array_equal(got["state"][name]["exp_avg"].numpy(), entry["exp_avg"].numpy(), err_msg=name)
    full = get_model_state_dict(model, options=FULL)
    for key, value in plain.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), full[key].numpy(), err_msg=key)


@needs_mpiexec
@pytest.mark.parametrize("ranks", [2, 3])
def test_sharded_checkpoint_of_several_ranks_round_trips_and_loads_in_one_process(ranks, tmp_path):
    proc = mpirun(ranks, "worker_fsdp_state_dict.py", str(tmp_path), timeout=240)
    assert proc.returncode == 0, output(proc)
    assert proc.stdout.count("fsdp state dict ok") == ranks, output(proc)
    plain = build(8)
    plain_optimizer = it.optim.AdamW(plain.parameters(), lr=3.0)
    state = {"model": get_model_state_dict(plain), "optim": get_optimizer_state_dict(plain, plain_optimizer)}
    dcp.load(state, checkpoint_id=os.path.join(tmp_path, "checkpoint"))  # N ranks' flat pieces into whole tensors
    set_model_state_dict(plain, state["model"])
    set_optimizer_state_dict(plain, plain_optimizer, state["optim"])
    full_model = it.load(os.path.join(tmp_path, "full_model.it"))
    full_optim = it.load(os.path.join(tmp_path, "full_optim.it"))
    assert list(full_model) == list(plain.state_dict())
    for key, value in plain.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), full_model[key].numpy(), err_msg=key)
    got = get_optimizer_state_dict(plain, plain_optimizer)
    assert got["param_groups"] == [{**g, "betas": tuple(g["betas"])} for g in full_optim["param_groups"]]
    for name, entry in full_optim["state"].items():
        assert got["state"][name]["step"] == entry["step"] == 2
        for key in ("exp_avg", "exp_avg_sq"):
            np.testing.assert_array_equal(got["state"][name][key].numpy(), entry[key].numpy(), err_msg=name)
