"""Module.bfloat16() / half() / float() / double() against torch 2.13: floating parameters, buffers and gradients
cast in place (the same Parameter objects), integer buffers kept, self returned, training still works after."""
import numpy as np
import pytest

from tests.torch_parity import same

X = np.random.default_rng(3).standard_normal((4, 2)).astype(np.float32)


def trained(m):
    """Sequential(Linear(2, 3), BatchNorm1d(3)) after one backward (so the weights have gradients)."""
    net = m.nn.Sequential(m.nn.Linear(2, 3), m.nn.BatchNorm1d(3))
    with m.no_grad():
        for i, p in enumerate(net.parameters()):
            p.copy_(m.tensor(np.linspace(-1, 1, p.numel(), dtype=np.float32).reshape(tuple(p.shape)) + i))
    net(m.tensor(X)).sum().backward()
    return net


def name(dtype):
    return str(dtype).replace("torch.", "")


def snapshot(net):
    return ([(n, name(p.dtype), name(p.grad.dtype), p.requires_grad, p.is_leaf) for n, p in net.named_parameters()],
            [(n, name(b.dtype)) for n, b in net.named_buffers()])


@pytest.mark.parametrize("cast", ["bfloat16", "half", "double", "float"])
def test_casts_floating_parameters_buffers_and_grads_in_place(cast):
    def run(m):
        net = trained(m).double() if cast == "float" else trained(m)
        weight = net[0].weight
        result = getattr(net, cast)()
        assert result is net and net[0].weight is weight
        return snapshot(net), weight.detach().float(), weight.grad.float()

    same(run)


def test_cast_then_train_a_step():
    def run(m):
        net = trained(m).double()
        net.zero_grad()
        net(m.tensor(X, dtype=m.float64)).sum().backward()
        return net[0].weight.grad, net[1].running_mean, net[1].num_batches_tracked

    same(run)
