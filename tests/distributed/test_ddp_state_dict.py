"""DistributedDataParallel's and DataParallel's state dicts as torch 2.13's: the keys carry the wrapped module's
``module.`` prefix, ``it.save(ddp.state_dict(), f)`` round-trips into another wrapper, and a plain model's state
loads into ``ddp.module`` (into the wrapper it fails with a hint, as torch's fails). One process here; two ranks
under mpiexec (worker_ddp_state_dict.py)."""
import numpy as np
import pytest

import infini_train as it
from infini_train import nn
from infini_train.nn.parallel import DataParallel, DistributedDataParallel
from tests.distributed.mpi_jobs import mpirun, needs_mpiexec, output

torch = pytest.importorskip("torch")


def mlp(seed=0):
    it.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 16), nn.GELU("tanh"), nn.LayerNorm(16), nn.Linear(16, 3))


def torch_mlp():
    return torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.GELU("tanh"), torch.nn.LayerNorm(16),
                               torch.nn.Linear(16, 3))


@pytest.fixture(scope="module")
def torch_ddp_keys(tmp_path_factory):
    """The keys of torch's DistributedDataParallel over the same layers (a gloo world of one)."""
    import torch.distributed as tdist

    store = tmp_path_factory.mktemp("gloo") / "store"
    tdist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        return list(torch.nn.parallel.DistributedDataParallel(torch_mlp()).state_dict())
    finally:
        tdist.destroy_process_group()


@pytest.mark.parametrize("wrap", ["ddp", "dp"])
def test_wrapper_state_dict_has_torchs_keys_and_the_modules_values(wrap, torch_ddp_keys):
    model = mlp()
    wrapper = DistributedDataParallel(model) if wrap == "ddp" else DataParallel(model, ["cpu:0", "cpu:1"])
    want = torch_ddp_keys if wrap == "ddp" else list(torch.nn.DataParallel(torch_mlp()).state_dict())
    state = wrapper.state_dict()
    assert list(state) == want == ["module." + k for k in model.state_dict()]
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(state["module." + key].numpy(), value.numpy(), err_msg=key)


@pytest.mark.parametrize("wrap", ["ddp", "dp"])
def test_saved_wrapper_state_loads_into_another_wrapper_and_plain_state_into_its_module(wrap, tmp_path):
    def wrapped(model):
        return DistributedDataParallel(model) if wrap == "ddp" else DataParallel(model, ["cpu:0", "cpu:1"])

    source = wrapped(mlp(0))
    it.save(source.state_dict(), tmp_path / "wrapped.it")
    target = wrapped(mlp(1))
    assert target.load_state_dict(it.load(tmp_path / "wrapped.it")) == ([], [])
    for (name, p), q in zip(target.module.named_parameters(), source.module.parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy(), err_msg=name)
    plain = mlp(2).state_dict()
    with pytest.raises(RuntimeError, match=r"(?s)missing keys.*HINT: this model is a wrapper.*ddp\.module"):
        target.load_state_dict(plain)
    target.module.load_state_dict(plain)
    np.testing.assert_array_equal(target.module[0].weight.numpy(), plain["0.weight"].numpy())


def test_torch_refuses_a_plain_state_in_its_wrapper_too():
    wrapper = torch.nn.DataParallel(torch_mlp())
    with pytest.raises(RuntimeError, match="Missing key"):
        wrapper.load_state_dict(torch_mlp().state_dict())


@needs_mpiexec
def test_ddp_state_dict_saves_and_loads_on_two_ranks(tmp_path):
    proc = mpirun(2, "worker_ddp_state_dict.py", str(tmp_path), timeout=120)
    assert proc.returncode == 0, output(proc)
    assert proc.stdout.count("ddp state ok") == 2, output(proc)
