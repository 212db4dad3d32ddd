"""Layers and containers against torch.nn modules holding identical weights: outputs, input and parameter
gradients; default initialisation; Dropout's train/eval behaviour. (Loss modules: test_loss.py.)"""
import math

import numpy as np
import pytest
import torch

import infini_train as it
from infini_train import nn


def copy_weights(ours, theirs):
    theirs.load_state_dict({k: torch.tensor(v.numpy()) for k, v in ours.state_dict().items()})


def compare(ours, theirs, x, rtol=1e-5, atol=1e-6, int_input=False):
    """Forward both on x, backprop a fixed random upstream gradient, compare outputs and all gradients."""
    copy_weights(ours, theirs)
    xi = it.tensor(x, requires_grad=not int_input)
    xt = torch.tensor(x, requires_grad=not int_input)
    yi, yt = ours(xi), theirs(xt)
    np.testing.assert_allclose(yi.numpy(), yt.detach().numpy(), rtol=rtol, atol=atol)
    upstream = np.random.default_rng(7).standard_normal(yt.shape).astype(np.float32)
    yi.backward(it.tensor(upstream))
    yt.backward(torch.tensor(upstream))
    if not int_input:
        np.testing.assert_allclose(xi.grad.numpy(), xt.grad.numpy(), rtol=rtol, atol=atol)
    theirs_params = dict(theirs.named_parameters())
    names = [n for n, _ in ours.named_parameters()]
    assert names == list(theirs_params)
    for n, p in ours.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), theirs_params[n].grad.numpy(), rtol=rtol, atol=atol, err_msg=n)


def randn(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(5,), (3, 5), (2, 3, 5)])
def test_linear(bias, shape):
    compare(nn.Linear(5, 4, bias=bias), torch.nn.Linear(5, 4, bias=bias), randn(*shape))


def test_embedding_with_and_without_padding():
    ids = np.array([[1, 0, 3, 3], [9, 0, 2, 1]])
    compare(nn.Embedding(10, 4), torch.nn.Embedding(10, 4), ids, int_input=True)
    emb = nn.Embedding(10, 4, padding_idx=0)
    assert not emb.weight.numpy()[0].any()
    compare(emb, torch.nn.Embedding(10, 4, padding_idx=0), ids, int_input=True)
    assert not emb.weight.grad.numpy()[0].any()
    assert nn.Embedding(10, 4, padding_idx=-1).padding_idx == 9
    with pytest.raises(ValueError, match="padding_idx"):
        nn.Embedding(10, 4, padding_idx=10)
    table = it.randn(6, 3)
    frozen = nn.Embedding.from_pretrained(table)
    assert not frozen.weight.requires_grad and frozen.weight.array is table.array


@pytest.mark.parametrize("kw", [{}, {"bias": False}, {"elementwise_affine": False}])
def test_layer_norm(kw):
    ours, theirs = nn.LayerNorm(6, **kw), torch.nn.LayerNorm(6, **kw)
    if ours.weight is not None:  # non-trivial affine parameters
        ours.weight.array[:] = randn(6, seed=3)
    if ours.bias is not None:
        ours.bias.array[:] = randn(6, seed=4)
    compare(ours, theirs, randn(2, 3, 6) * 3 + 1, rtol=1e-4, atol=1e-5)
    assert nn.LayerNorm((2, 3)).weight.shape == (2, 3)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(approximate):
    compare(nn.GELU(approximate), torch.nn.GELU(approximate), randn(3, 7) * 2)
    with pytest.raises(ValueError, match="approximate"):
        nn.GELU("fast")


@pytest.mark.parametrize("ours,theirs", [(nn.ReLU(), torch.nn.ReLU()), (nn.Tanh(), torch.nn.Tanh()),
                                         (nn.Sigmoid(), torch.nn.Sigmoid()), (nn.SiLU(), torch.nn.SiLU()),
                                         (nn.Softmax(-1), torch.nn.Softmax(-1)),
                                         (nn.LogSoftmax(0), torch.nn.LogSoftmax(0)),
                                         (nn.Identity(3, foo=1), torch.nn.Identity(3, foo=1))], ids=repr)
def test_parameterless_layers(ours, theirs):
    compare(ours, theirs, randn(4, 5) * 2 + 0.1)


def test_dropout_train_and_eval():
    drop = nn.Dropout(0.25)
    x = it.ones(200, 100, requires_grad=True)
    it.manual_seed(0)
    y = drop(x)
    kept = y.numpy() != 0
    assert abs(kept.mean() - 0.75) < 0.01
    np.testing.assert_allclose(y.numpy()[kept], 1 / 0.75, rtol=1e-6)
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy() != 0, kept)  # gradient flows through the kept elements only
    it.manual_seed(0)
    np.testing.assert_array_equal(drop(x).numpy(), y.numpy())  # seeded
    drop.eval()
    assert drop(x) is x or np.array_equal(drop(x).numpy(), x.numpy())
    assert nn.Dropout(0.0)(x).numpy().all()
    with pytest.raises(ValueError, match="p in"):
        nn.Dropout(1.5)


def test_sequential_and_containers_match_torch():
    def build(lib):
        return lib.Sequential(lib.Linear(5, 8), lib.GELU("tanh"), lib.LayerNorm(8), lib.Linear(8, 3))

    compare(build(nn), build(torch.nn), randn(4, 5), rtol=1e-4, atol=1e-5)
    seq = build(nn)
    assert isinstance(seq[1], nn.GELU) and seq[-1].out_features == 3
    head = seq[2:]
    assert isinstance(head, nn.Sequential) and len(head) == 2 and list(head.state_dict()) == [
        "2.weight", "2.bias", "3.weight", "3.bias"]  # slices keep the names, as torch's
    with pytest.raises(IndexError):
        seq[4]


def test_module_list_and_dict():
    lst = nn.ModuleList([nn.Linear(2, 2)]).append(nn.Linear(2, 3))
    lst += [nn.ReLU()]
    assert len(lst) == 3 and lst[1].out_features == 3 and isinstance(lst[-1], nn.ReLU)
    lst.insert(0, nn.Identity())
    assert [type(m).__name__ for m in lst] == ["Identity", "Linear", "Linear", "ReLU"]
    del lst[0]
    assert [n for n, _ in lst.named_parameters()] == ["0.weight", "0.bias", "1.weight", "1.bias"]
    d = nn.ModuleDict({"a": nn.Linear(2, 2), "b": nn.ReLU()})
    d["c"] = nn.Linear(2, 1)
    assert list(d.keys()) == ["a", "b", "c"] and "a" in d and len(d) == 3
    assert [n for n, _ in d.named_parameters()] == ["a.weight", "a.bias", "c.weight", "c.bias"]
    d.pop("a")
    assert list(d) == ["b", "c"]


def test_default_initialisation_like_torch():
    it.manual_seed(0)
    lin = nn.Linear(400, 300)
    bound = 1 / math.sqrt(400)  # kaiming_uniform(a=sqrt(5)) gives 1/sqrt(fan_in), as does the bias
    w, b = lin.weight.numpy(), lin.bias.numpy()
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.99 * bound
    assert abs(w.std() - bound / math.sqrt(3)) < 0.01 * bound and abs(w.mean()) < 0.01 * bound
    assert np.abs(b).max() <= bound and b.std() > 0.4 * bound
    emb = nn.Embedding(1000, 64).weight.numpy()
    assert abs(emb.mean()) < 0.01 and abs(emb.std() - 1) < 0.01
    ln = nn.LayerNorm(8)
    assert np.all(ln.weight.numpy() == 1) and np.all(ln.bias.numpy() == 0)
    assert lin.weight.dtype == it.float32 and nn.Linear(2, 2, dtype=it.float64).weight.dtype == it.float64
    assert nn.Linear(2, 2, device="cpu:2").weight.device is it.device("cpu:2")
    it.manual_seed(3)
    first = nn.Linear(4, 4).weight.numpy().copy()
    it.manual_seed(3)
    np.testing.assert_array_equal(nn.Linear(4, 4).weight.numpy(), first)
