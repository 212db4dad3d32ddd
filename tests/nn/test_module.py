"""Module and Parameter: registration, iteration, state dicts, modes, devices, hooks, repr — against torch.nn."""
import numpy as np
import pytest
import torch

import infini_train as it
from infini_train import nn
from infini_train.autograd.hooks import RemovableHandle


def build_net(lib):
    """The same structure in infini_train (lib=nn) or torch (lib=torch.nn), with a tied weight and a buffer."""
    base = lib.Module

    class Net(base):
        def __init__(self):
            super().__init__()
            self.fc = lib.Linear(3, 4)
            self.blocks = lib.ModuleList([lib.Linear(4, 4), lib.Linear(4, 4)])
            self.head = lib.Linear(4, 4, bias=False)
            self.head.weight = self.blocks[0].weight  # tied, like GPT-2's lm_head / wte
            self.register_buffer("scale", (it if lib is nn else torch).ones(4))
            self.register_buffer("cache", (it if lib is nn else torch).zeros(2), persistent=False)
            self.drop = lib.Dropout(0.5)

        def forward(self, x):
            x = self.fc(x).relu()
            for b in self.blocks:
                x = b(x)
            return self.drop(self.head(x)) * self.scale

    return Net()


def test_parameter_is_a_tensor_that_requires_grad_and_shares_memory():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    p = nn.Parameter(a)
    assert isinstance(p, it.Tensor) and p.requires_grad and p.is_leaf and p.grad is None
    a[0, 0] = 7
    assert p.numpy()[0, 0] == 7  # shares memory, as torch.nn.Parameter does
    t = it.ones(2)
    q = nn.Parameter(t, requires_grad=False)
    assert not q.requires_grad and q.array is t.array
    assert nn.Parameter([1, 2]).dtype == it.float32
    assert repr(nn.Parameter(it.zeros(1))).startswith("Parameter containing:\n")
    (p * 2).sum().backward()
    np.testing.assert_array_equal(p.grad.numpy(), np.full((2, 3), 2, np.float32))


def test_registration_iteration_and_state_dict_keys_match_torch():
    ours, theirs = build_net(nn), build_net(torch.nn)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert [n for n, _ in ours.named_buffers()] == [n for n, _ in theirs.named_buffers()] == ["scale", "cache"]
    assert [n for n, _ in ours.named_modules()] == [n for n, _ in theirs.named_modules()]
    assert [n for n, _ in ours.named_children()] == [n for n, _ in theirs.named_children()]
    # tied weights appear under both names in the state dict, non-persistent buffers not at all
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert "head.weight" in ours.state_dict() and "cache" not in ours.state_dict()
    assert len(list(ours.parameters())) == 6  # the tied weight once
    assert ours.num_parameters() == sum(p.numel() for p in theirs.parameters())
    assert ours.get_submodule("blocks.1") is ours.blocks[1]
    assert ours.get_parameter("blocks.0.weight") is ours.head.weight
    assert [n for n, _ in ours.named_parameters(prefix="model")][0] == "model.fc.weight"


def test_setattr_rules():
    m = nn.Linear(2, 2)
    with pytest.raises(TypeError, match="cannot assign Tensor as parameter 'weight'"):
        m.weight = it.ones(2, 2)
    m.bias = None
    assert m.bias is None and [n for n, _ in m.named_parameters()] == ["weight"]
    m.bias = nn.Parameter(it.zeros(2))
    assert [n for n, _ in m.named_parameters()] == ["weight", "bias"]
    m.register_buffer("buf", it.zeros(1))
    m.buf = it.ones(3)
    assert m.buf.shape == (3,) and "buf" in m.state_dict()
    with pytest.raises(TypeError, match="expected a Tensor"):
        m.buf = 3
    del m.buf
    assert "buf" not in m.state_dict()
    with pytest.raises(KeyError, match="contain no '.'"):
        m.register_buffer("a.b", it.zeros(1))

    class Early(nn.Module):
        def __init__(self):
            self.plain = 1  # allowed before Module.__init__, as in torch
            self.w = nn.Parameter(it.ones(1))

    with pytest.raises(AttributeError, match="before Module.__init__"):
        Early()


def test_reassigning_a_submodule_or_parameter_keeps_its_place_as_in_torch():
    ours, theirs = nn.Module(), torch.nn.Module()
    for m, lib in ((ours, nn), (theirs, torch.nn)):
        m.a, m.b, m.c = lib.Linear(1, 1), lib.Linear(1, 1), lib.Linear(1, 1)
        m.b = lib.Linear(1, 2)  # e.g. a layer swapped for its tensor-parallel shard
        m.a.weight = lib.Parameter(m.a.weight.detach().clone())
    assert list(ours._modules) == list(theirs._modules) == ["a", "b", "c"]
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert [n for n, _ in ours.named_parameters()][:2] == ["a.weight", "a.bias"]


def test_load_state_dict_copies_in_place_and_accepts_arrays():
    a, b = build_net(nn), build_net(nn)
    w = b.fc.weight
    result = b.load_state_dict(a.state_dict())
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert b.fc.weight is w  # identity kept: optimizers stay valid
    for (k, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        np.testing.assert_array_equal(x.numpy(), y.numpy(), err_msg=k)
    # numpy arrays (float64 is cast), and loading from a torch state dict
    b.load_state_dict({k: np.full(v.shape, 0.5) for k, v in a.state_dict().items()})
    assert b.fc.weight.dtype == it.float32 and np.all(b.fc.weight.numpy() == 0.5)
    t = build_net(torch.nn)
    b.load_state_dict({k: v.numpy() for k, v in t.state_dict().items()})
    np.testing.assert_array_equal(b.blocks[1].bias.numpy(), t.blocks[1].bias.detach().numpy())


def test_load_state_dict_errors_name_missing_unexpected_and_mismatched_keys():
    a, b = build_net(nn), build_net(nn)
    sd = a.state_dict()
    sd.pop("fc.bias")
    sd["extra.weight"] = np.zeros(2)
    sd["fc.weight"] = np.zeros((5, 3))
    with pytest.raises(RuntimeError) as info:
        b.load_state_dict(sd)
    msg = str(info.value)
    assert "missing keys (1): fc.bias" in msg
    assert "unexpected keys (1): extra.weight" in msg
    assert "size mismatch for fc.weight: expected shape (4, 3), got (5, 3)" in msg
    assert "HINT" in msg
    before = b.fc.bias.numpy().copy()
    with pytest.raises(RuntimeError, match="size mismatch"):  # shapes are checked even when not strict
        b.load_state_dict(sd, strict=False)
    np.testing.assert_array_equal(b.fc.bias.numpy(), before)  # nothing was half-loaded
    missing, unexpected = b.load_state_dict({"fc.bias": np.ones(4), "junk": np.ones(1)}, strict=False)
    assert "fc.weight" in missing and unexpected == ["junk"]
    assert np.all(b.fc.bias.numpy() == 1)
    wrapped = {"module." + k: v for k, v in a.state_dict().items()}
    with pytest.raises(RuntimeError, match="'module.' prefix"):
        b.load_state_dict(wrapped)


def test_train_eval_propagate_and_dropout_follows():
    net = build_net(nn)
    assert net.training and net.drop.training and net.blocks[0].training
    assert net.eval() is net
    assert not any(m.training for m in net.modules())
    x = it.randn(8, 3)
    np.testing.assert_array_equal(net(x).numpy(), net(x).numpy())
    net.train()
    assert all(m.training for m in net.modules())
    net.blocks.eval()
    assert net.training and not net.blocks[1].training


def test_to_dtype_and_device_keep_parameter_objects():
    net = build_net(nn)
    net.register_buffer("steps", it.tensor([1, 2]))
    w = net.fc.weight
    net(it.randn(2, 3)).sum().backward()
    assert net.to(it.float64) is net
    assert net.fc.weight is w and w.dtype == it.float64 and net.scale.dtype == it.float64
    assert w.grad.dtype == it.float64  # grads follow, as torch's Module.to does
    assert net.steps.dtype == it.int64  # only floating tensors are cast
    out = net.to(it.float32)(it.randn(2, 3))
    assert out.dtype == it.float32
    net.to("cpu:1")
    assert w.device is it.device("cpu:1") and net.scale.device is it.device("cpu:1") and w.grad.device is w.device
    net.zero_grad()
    net.eval()(it.ones(1, 3, device="cpu:1")).sum().backward()
    assert w.grad.device is it.device("cpu:1")
    net.cpu()
    assert w.device is it.device("cpu")


def test_zero_grad_and_requires_grad():
    net = build_net(nn)
    net(it.randn(2, 3)).sum().backward()
    net.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.numpy().any() for p in net.parameters())
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())
    net.requires_grad_(False)
    assert not any(p.requires_grad for p in net.parameters())


def test_apply_visits_children_first_like_torch():
    ours, theirs = build_net(nn), build_net(torch.nn)
    seen, tseen = [], []
    ours.apply(lambda m: seen.append(type(m).__name__))
    theirs.apply(lambda m: tseen.append(type(m).__name__))
    assert seen == tseen
    ours.apply(lambda m: nn.init.zeros_(m.bias) if isinstance(m, nn.Linear) and m.bias is not None else None)
    assert not ours.fc.bias.numpy().any()


def test_forward_hooks_and_pre_hooks_with_removable_handles():
    net = build_net(nn).eval()
    x = it.randn(2, 3)
    calls = []
    h = net.head.register_forward_hook(lambda m, args, out: calls.append((m, args[0].shape, out.shape)) or out * 0)
    assert isinstance(h, RemovableHandle)
    assert not net(x).numpy().any()
    assert calls == [(net.head, (2, 4), (2, 4))]
    h.remove()
    assert net(x).numpy().any() and len(calls) == 1
    with net.fc.register_forward_pre_hook(lambda m, args: args[0] * 0):
        zeroed = net(x).numpy()
    np.testing.assert_allclose(zeroed, net(it.zeros(2, 3)).numpy(), rtol=1e-6)
    assert not net.fc._forward_pre_hooks  # the with-block removed it


def test_repr_matches_torch():
    ours, theirs = build_net(nn), build_net(torch.nn)
    assert repr(ours) == repr(theirs)
    seq = lambda lib: lib.Sequential(lib.Embedding(10, 4, padding_idx=0), lib.LayerNorm(4), lib.GELU("tanh"),  # noqa
                                     lib.ModuleList([lib.Linear(4, 4) for _ in range(3)] + [lib.ReLU()]),
                                     lib.ModuleDict({"a": lib.Identity(), "b": lib.Dropout(0.1)}),
                                     lib.CrossEntropyLoss())
    assert repr(seq(nn)) == repr(seq(torch.nn))


@pytest.mark.cuda
@pytest.mark.skipif(not it.backend.cuda_available(), reason="needs cupy and an NVIDIA GPU")
def test_module_on_cuda_matches_cpu():
    cpu_net = build_net(nn).eval()
    gpu_net = build_net(nn).eval()
    gpu_net.load_state_dict(cpu_net.state_dict())
    w = gpu_net.fc.weight
    gpu_net.to("cuda:0")
    assert w.device is it.device("cuda:0") and gpu_net.fc.weight is w
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    y_cpu, y_gpu = cpu_net(it.tensor(x)), gpu_net(it.tensor(x, device="cuda:0"))
    np.testing.assert_allclose(y_gpu.numpy(), y_cpu.numpy(), rtol=1e-5, atol=1e-6)
    y_gpu.sum().backward()
    y_cpu.sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), cpu_net.fc.weight.grad.numpy(), rtol=1e-5, atol=1e-6)
    total = nn.utils.clip_grad_norm_(gpu_net.parameters(), 0.1)
    assert total.device is it.device("cuda:0")
    assert total.item() == pytest.approx(nn.utils.clip_grad_norm_(cpu_net.parameters(), 0.1).item(), rel=1e-5)
    gpu_net.load_state_dict({k: np.zeros(v.shape, np.float32) for k, v in cpu_net.state_dict().items()})
    assert not w.numpy().any()
    it.manual_seed(0)
    a = nn.init.trunc_normal_(it.empty(100, device="cuda:0"), a=-1, b=1).numpy()
    it.manual_seed(0)
    np.testing.assert_array_equal(nn.init.trunc_normal_(it.empty(100, device="cuda:0"), a=-1, b=1).numpy(), a)
    assert np.abs(a).max() <= 1
