"""saved_tensors_hooks: every tensor a Function saves goes through pack, and backward reads what unpack returns;
hooks nest, are off outside their block, and give the gradients of the unhooked graph (checked against torch's
hooks on the same ops)."""
import numpy as np
import pytest
import torch

import infini_train as it
from infini_train.autograd.graph import saved_tensors_hooks


def _graph(x, w, b):
    return (it.nn.functional.gelu(it.nn.functional.linear(x, w, b)) * x.sum()).tanh().sum()


def test_pack_sees_each_saved_tensor_and_backward_reads_unpack():
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal((3, 4)), rng.standard_normal((5, 4)), rng.standard_normal(5)
    mine = [it.tensor(a, requires_grad=True) for a in (x, w, b)]
    theirs = [torch.tensor(a, requires_grad=True) for a in (x, w, b)]
    packed, unpacked = [], []

    def pack(t):
        packed.append(tuple(t.shape))
        return ("copy", t.array.copy())

    def unpack(p):
        unpacked.append(p[1].shape)
        return p[1]

    with saved_tensors_hooks(pack, unpack):
        loss = _graph(*mine)
    loss.backward()
    t_packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t_packed.append(tuple(t.shape)) or t, lambda t: t):
        t_loss = (torch.nn.functional.gelu(torch.nn.functional.linear(*theirs)) * theirs[0].sum()).tanh().sum()
    t_loss.backward()
    assert packed and len(unpacked) == len(packed)
    assert (3, 4) in packed and (5, 4) in packed  # the linear's input and weight
    for ours, ref in zip(mine, theirs):
        np.testing.assert_allclose(ours.grad.numpy(), ref.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_unpack_reads_the_storage_at_backward_time():
    """What unpack returns is what backward uses: packing a reference and changing the referenced array between
    forward and backward changes the gradient (the way fully_shard re-gathers parameters)."""
    w_values = np.ones((2, 2))
    x = it.tensor(np.eye(2), requires_grad=True)
    w = it.tensor(w_values.copy(), requires_grad=True)
    store = {}

    def pack(t):
        key = len(store)
        store[key] = t.array
        return key

    with saved_tensors_hooks(pack, lambda key: store[key]):
        y = it.nn.functional.linear(x, w).sum()
    store[1] = np.full((2, 2), 3.0)  # the weight's saved entry now reads 3s
    y.backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full((2, 2), 6.0))  # dx = 1s @ W with W = 3s


def test_hooks_nest_and_are_off_outside():
    seen = []
    x = it.tensor(np.arange(4.0), requires_grad=True)
    with saved_tensors_hooks(lambda t: seen.append("outer") or t.array, lambda a: a):
        with saved_tensors_hooks(lambda t: seen.append("inner") or t.array, lambda a: a):
            y = (x * x).sum()
        z = (x * x).sum()
    w = (x * x).sum()
    (y + z + w).backward()
    assert seen == ["inner", "inner", "outer", "outer"]
    np.testing.assert_array_equal(x.grad.numpy(), 6 * np.arange(4.0))


def test_an_unpack_of_the_wrong_shape_is_refused():
    x = it.tensor(np.ones(3), requires_grad=True)
    with saved_tensors_hooks(lambda t: t.array, lambda a: a[:2]):
        y = (x * x).sum()
    with pytest.raises(RuntimeError, match="unpack returned shape"):
        y.backward()
