import numpy as np
import pytest

import infini_train as it
from infini_train import nn
from infini_train.models.gpt2 import GPT2, GPT2Config
from infini_train.nn.parallel import DataParallel


def mlp(seed=0):
    it.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 16), nn.GELU("tanh"), nn.Linear(16, 3))


def grads(model):
    return {n: p.grad.numpy().copy() for n, p in model.named_parameters()}


def step_and_compare_grads(plain, wrapped, loss_a, loss_b, opt_a, opt_b, rtol, atol):
    """Backward both losses, require equal parameter gradients, then take one optimizer step on each."""
    opt_a.zero_grad()
    opt_b.zero_grad()
    loss_a.backward()
    loss_b.backward()
    ga, gb = grads(plain), grads(wrapped)
    for n in ga:
        np.testing.assert_allclose(gb[n], ga[n], rtol=rtol, atol=atol, err_msg=n)
    opt_a.step()
    opt_b.step()


@pytest.mark.parametrize("devices", [["cpu:0", "cpu:1"], ["cpu:0", "cpu:1", "cpu:2"]])
@pytest.mark.parametrize("batch", [6, 7])  # 7 is not divisible by the device count
def test_mlp_outputs_loss_and_grads_equal_plain_module_over_steps(devices, batch):
    plain, wrapped = mlp(), mlp()
    dp = DataParallel(wrapped, devices)
    opt_a = it.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9)
    opt_b = it.optim.SGD(wrapped.parameters(), lr=0.1, momentum=0.9)
    rng = np.random.default_rng(0)
    for _ in range(3):
        x = it.tensor(rng.standard_normal((batch, 5)).astype(np.float32))
        out_a, out_b = plain(x), dp(x)
        assert out_b.device is it.device(devices[0])
        np.testing.assert_allclose(out_b.numpy(), out_a.numpy(), rtol=1e-6, atol=1e-7)
        loss_a, loss_b = (out_a ** 2).sum(), (out_b ** 2).sum()
        np.testing.assert_allclose(loss_b.item(), loss_a.item(), rtol=1e-6)
        step_and_compare_grads(plain, wrapped, loss_a, loss_b, opt_a, opt_b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("ndev", [2, 3])
def test_tiny_gpt2_loss_and_grads_equal_plain_module(ndev):
    cfg = GPT2Config(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32)
    it.manual_seed(0)
    plain = GPT2(cfg)
    it.manual_seed(0)
    wrapped = GPT2(cfg)
    dp = DataParallel(wrapped, [f"cpu:{i}" for i in range(ndev)])
    rng = np.random.default_rng(1)
    B = 6  # divisible by 2 and 3, so the mean of per-replica mean losses is the full-batch mean
    x, y = rng.integers(0, 64, (B, 16)), rng.integers(0, 64, (B, 16))
    opt_a, opt_b = plain.configure_optimizers(0.1, 1e-3), wrapped.configure_optimizers(0.1, 1e-3)
    for _ in range(3):
        _, loss_a = plain(it.tensor(x), it.tensor(y))
        _, losses = dp(it.tensor(x), it.tensor(y))
        assert losses.shape == (ndev,)
        loss_b = losses.mean()
        np.testing.assert_allclose(loss_b.item(), loss_a.item(), rtol=1e-6)
        step_and_compare_grads(plain, wrapped, loss_a, loss_b, opt_a, opt_b, rtol=1e-5, atol=1e-7)


def test_no_grad_forward_builds_no_graph():
    dp = DataParallel(mlp(), ["cpu:0", "cpu:1"])
    with it.no_grad():
        out = dp(it.randn(4, 5))
    assert out.grad_fn is None and not out.requires_grad


class Fails(nn.Module):
    def forward(self, x):
        if x.device is it.device("cpu:1"):
            raise ValueError("bad shard")
        return x * 2


def test_exception_in_a_replica_names_replica_and_device():
    dp = DataParallel(Fails(), ["cpu:0", "cpu:1"])
    with pytest.raises(RuntimeError, match=r"replica 1 on device cpu:1 raised ValueError: bad shard"):
        dp(it.randn(4, 2))


def test_module_on_the_wrong_device_is_a_clear_error():
    with pytest.raises(ValueError, match="parameter 0.weight is on cpu, expected device_ids\\[0\\] = cpu:1"):
        DataParallel(mlp(), ["cpu:1", "cpu:2"])


def test_replica_threads_reapply_grad_mode():
    seen = {}

    class Probe(nn.Module):
        def forward(self, x):
            seen[str(x.device)] = it.is_grad_enabled()
            return x

    dp = DataParallel(Probe(), ["cpu:0", "cpu:1"])
    with it.no_grad():
        dp(it.randn(4, 2))
    assert seen == {"cpu": False, "cpu:1": False}
    dp(it.randn(4, 2))
    assert seen == {"cpu": True, "cpu:1": True}


def gpu_devices(n):
    try:
        import cupy
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception:
        pytest.skip("cupy or a GPU is missing")
    if count < n:
        pytest.skip(f"needs {n} GPUs, found {count}")
    return [f"cuda:{i}" for i in range(n)]


@pytest.mark.cuda
def test_mlp_on_two_gpus_equals_plain_module():
    devices = gpu_devices(2)
    plain, wrapped = mlp(), mlp().to(devices[0])
    dp = DataParallel(wrapped, devices)
    x = np.random.default_rng(0).standard_normal((7, 5)).astype(np.float32)
    out_a = plain(it.tensor(x))
    out_b = dp(it.tensor(x, device=devices[0]))
    np.testing.assert_allclose(out_b.numpy(), out_a.numpy(), rtol=1e-5, atol=1e-6)
    (out_a ** 2).sum().backward()
    (out_b ** 2).sum().backward()
    for n, g in grads(plain).items():
        np.testing.assert_allclose(grads(wrapped)[n], g, rtol=1e-4, atol=1e-6, err_msg=n)
