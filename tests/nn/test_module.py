import numpy as np
import pytest
import torch

import infini_train as it
from infini_train import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        self.head = nn.Linear(4, 4, bias=False)
        self.head.weight = self.blocks[0].weight  # tied
        self.register_buffer("scale", it.ones(4))
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        x = self.fc(x).relu()
        for b in self.blocks:
            x = b(x)
        return self.drop(self.head(x)) * self.scale


def test_registration_and_tied_parameters_once():
    net = Net()
    names = [n for n, _ in net.named_parameters()]
    assert names == ["fc.weight", "fc.bias", "blocks.0.weight", "blocks.0.bias", "blocks.1.weight", "blocks.1.bias"]
    assert [n for n, _ in net.named_buffers()] == ["scale"]
    sd = net.state_dict()
    # torch's order: a module's own parameters and buffers, then its children's
    assert list(sd) == ["scale", "fc.weight", "fc.bias", "blocks.0.weight", "blocks.0.bias", "blocks.1.weight",
                        "blocks.1.bias", "head.weight"]


def test_load_state_dict_strict_errors_and_copy_in_place():
    a, b = Net(), Net()
    w = b.fc.weight
    b.load_state_dict(a.state_dict())
    assert b.fc.weight is w
    np.testing.assert_array_equal(b.fc.weight.numpy(), a.fc.weight.numpy())
    sd = a.state_dict()
    sd.pop("fc.bias")
    sd["extra.weight"] = np.zeros(2)
    with pytest.raises(RuntimeError, match="missing keys: fc.bias(.|\n)*unexpected keys: extra.weight"):
        b.load_state_dict(sd)
    sd = a.state_dict()
    sd["fc.weight"] = np.zeros((5, 3))
    with pytest.raises(RuntimeError, match=r"size mismatch for fc.weight: expected shape \(4, 3\), got \(5, 3\)"):
        b.load_state_dict(sd)
    missing, unexpected = b.load_state_dict({"fc.bias": np.zeros(4)}, strict=False)
    assert "fc.weight" in missing and not unexpected


def test_train_eval_to_zero_grad_apply_hooks_repr():
    net = Net()
    net.eval()
    assert not net.drop.training and not net.training
    x = it.randn(2, 3)
    np.testing.assert_array_equal(net(x).numpy(), net(x).numpy())  # dropout off in eval
    net.train()
    assert net.drop.training
    net.to(it.float64)
    assert net.fc.weight.dtype == it.float64 and net.scale.dtype == it.float64
    net.to(it.float32)
    out = net(x).sum()
    out.backward()
    assert net.fc.weight.grad is not None
    net.zero_grad()
    assert net.fc.weight.grad is None
    seen = []
    net.apply(lambda m: seen.append(type(m).__name__))
    assert seen[-1] == "Net" and seen.count("Linear") == 4
    calls = []
    h = net.head.register_forward_hook(lambda m, i, o: calls.append(o.shape) or o * 0)
    net.eval()
    assert np.all(net(x).numpy() == 0)
    h.remove()
    assert calls == [(2, 4)]
    assert "(fc): Linear(in_features=3, out_features=4, bias=True)" in repr(net)


def test_module_to_logical_device_moves_params():
    lin = nn.Linear(2, 2).to("cpu:1")
    assert lin.weight.device is it.device("cpu:1")
    out = lin(it.ones(1, 2, device="cpu:1"))
    assert out.device is it.device("cpu:1")


@pytest.mark.parametrize("build", [
    lambda: (nn.Linear(5, 3), torch.nn.Linear(5, 3)),
    lambda: (nn.LayerNorm(5), torch.nn.LayerNorm(5)),
    lambda: (nn.Sequential(nn.Linear(5, 4), nn.GELU("tanh"), nn.Linear(4, 5)),
             torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.GELU("tanh"), torch.nn.Linear(4, 5))),
])
def test_layers_match_torch_with_same_weights(build):
    ours, theirs = build()
    theirs.load_state_dict({k: torch.tensor(v.numpy()) for k, v in ours.state_dict().items()})
    x = np.random.default_rng(0).standard_normal((2, 5)).astype(np.float32)
    xi, xt = it.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    yi, yt = ours(xi), theirs(xt)
    np.testing.assert_allclose(yi.numpy(), yt.detach().numpy(), rtol=1e-5, atol=1e-6)
    yi.sum().backward()
    yt.sum().backward()
    np.testing.assert_allclose(xi.grad.numpy(), xt.grad.numpy(), rtol=1e-5, atol=1e-6)
    for (n, p), (_, tp) in zip(ours.named_parameters(), theirs.named_parameters()):
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=1e-5, atol=1e-6, err_msg=n)


def test_embedding_and_cross_entropy_loss_modules():
    emb = nn.Embedding(10, 4, padding_idx=0)
    assert np.all(emb.weight.numpy()[0] == 0)
    ids = it.tensor([[1, 0, 3]])
    assert emb(ids).shape == (1, 3, 4)
    loss = nn.CrossEntropyLoss(ignore_index=-1)(it.tensor([[1.0, 2.0], [0.0, 0.0]]), it.tensor([1, -1]))
    assert loss.item() == pytest.approx(float(torch.nn.functional.cross_entropy(torch.tensor([[1.0, 2.0]]),
                                                                                 torch.tensor([1]))))


def test_module_dict_and_list_containers():
    d = nn.ModuleDict({"a": nn.Linear(2, 2), "b": nn.ReLU()})
    assert list(d.keys()) == ["a", "b"] and "a" in d and len(d) == 2
    lst = nn.ModuleList([nn.Linear(2, 2)]).append(nn.Linear(2, 3))
    assert len(lst) == 2 and lst[-1].out_features == 3
    assert len(list(nn.Sequential(d["a"], lst[0]).parameters())) == 4


def test_init_statistics_and_seeding():
    w = it.empty(200, 300)
    it.manual_seed(0)
    nn.init.xavier_uniform_(w)
    bound = np.sqrt(6 / 500)
    assert np.abs(w.numpy()).max() <= bound and abs(w.numpy().std() - bound / np.sqrt(3)) < 1e-3
    nn.init.kaiming_normal_(w, nonlinearity="relu")
    assert abs(w.numpy().std() - np.sqrt(2 / 300)) < 2e-3
    it.manual_seed(5)
    a = nn.init.normal_(it.empty(10)).numpy().copy()
    it.manual_seed(5)
    np.testing.assert_array_equal(a, nn.init.normal_(it.empty(10)).numpy())


def test_clip_grad_norm_matches_torch():
    arrays = [np.random.default_rng(i).standard_normal(s).astype(np.float32) * 3 for i, s in enumerate([(3, 4), (5,)])]
    ps = [it.nn.Parameter(it.tensor(a)) for a in arrays]
    tps = [torch.nn.Parameter(torch.tensor(a)) for a in arrays]
    for p, tp, a in zip(ps, tps, arrays):
        p.grad = it.tensor(a * 2)
        tp.grad = torch.tensor(a * 2)
    total = nn.utils.clip_grad_norm_(ps, 1.0)
    ttotal = torch.nn.utils.clip_grad_norm_(tps, 1.0)
    assert total.item() == pytest.approx(ttotal.item(), rel=1e-6)
    for p, tp in zip(ps, tps):
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=1e-6)
