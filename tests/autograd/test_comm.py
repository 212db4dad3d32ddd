import numpy as np
import pytest

import infini_train as it
from infini_train.autograd import comm

DEVICES = ["cpu:0", "cpu:1", "cpu:2"]


def test_chunk_sizes_are_even_and_drop_empty_chunks():
    assert comm.chunk_sizes(5, 3) == [2, 2, 1]
    assert comm.chunk_sizes(6, 3) == [2, 2, 2]
    assert comm.chunk_sizes(2, 4) == [1, 1]


@pytest.mark.parametrize("n,dim", [(6, 0), (7, 0), (5, 1)])
def test_scatter_forward_and_backward_is_gather(n, dim):
    data = np.arange(n * 4, dtype=np.float32).reshape((n, 4) if dim == 0 else (4, n))
    x = it.tensor(data, requires_grad=True)
    parts = comm.scatter(x, DEVICES, dim=dim)
    sizes = comm.chunk_sizes(n, 3)
    assert [str(p.device) for p in parts] == ["cpu", "cpu:1", "cpu:2"][:len(sizes)]
    np.testing.assert_array_equal(np.concatenate([p.numpy() for p in parts], axis=dim), data)
    assert all(p.array is not x.array and not np.shares_memory(p.array, x.array) for p in parts)
    # backward of Scatter is Gather: distinct upstream grads per chunk come back in order
    weights = [it.tensor(np.full(p.shape, i + 1.0, np.float32), device=p.device) for i, p in enumerate(parts)]
    total = comm.gather([(p * w).sum() for p, w in zip(parts, weights)], "cpu:0").sum()
    total.backward()
    expect = np.concatenate([np.full(p.shape, i + 1.0) for i, p in enumerate(parts)], axis=dim)
    np.testing.assert_array_equal(x.grad.numpy(), expect)


def test_gather_forward_and_backward_is_scatter():
    xs = [it.tensor(np.full((2, 3), float(i), np.float32), device=d, requires_grad=True)
          for i, d in enumerate(DEVICES)]
    out = comm.gather(xs, "cpu:1", dim=0)
    assert out.device is it.device("cpu:1") and out.shape == (6, 3)
    g = np.arange(18, dtype=np.float32).reshape(6, 3)
    out.backward(it.tensor(g, device="cpu:1"))
    for i, x in enumerate(xs):
        assert x.grad.device is x.device
        np.testing.assert_array_equal(x.grad.numpy(), g[2 * i:2 * i + 2])


def test_gather_of_scalars_stacks_them():
    xs = [it.tensor(float(i + 1), device=d, requires_grad=True) for i, d in enumerate(DEVICES)]
    out = comm.gather(xs, "cpu:0")
    np.testing.assert_array_equal(out.numpy(), [1.0, 2.0, 3.0])
    (out * it.tensor([1.0, 10.0, 100.0])).sum().backward()
    assert [x.grad.item() for x in xs] == [1.0, 10.0, 100.0]
    assert all(x.grad.shape == () for x in xs)


def test_broadcast_copies_and_backward_is_reduce_add():
    w = it.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    b = it.tensor([0.5, -0.5], requires_grad=True)
    replicas = comm.broadcast([w, b], DEVICES)
    assert [[str(t.device) for t in r] for r in replicas] == [["cpu", "cpu"], ["cpu:1", "cpu:1"],
                                                               ["cpu:2", "cpu:2"]]
    for r in replicas:
        np.testing.assert_array_equal(r[0].numpy(), w.numpy())
        assert not np.shares_memory(r[0].array, w.array)
    losses = [((r[0] * (i + 1)).sum() + (r[1] * r[1]).sum()) for i, r in enumerate(replicas)]
    comm.gather(losses, "cpu:0").sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), np.full((2, 2), 1.0 + 2.0 + 3.0))
    np.testing.assert_allclose(b.grad.numpy(), 3 * 2 * np.array([0.5, -0.5]))


def test_reduce_add_coalesced_sums_and_backward_is_broadcast():
    per_device = [[it.tensor(np.full((2, 2), i + 1.0, np.float32), device=d, requires_grad=True),
                   it.tensor(np.full((3,), 10.0 * (i + 1), np.float32), device=d, requires_grad=True)]
                  for i, d in enumerate(DEVICES)]
    a, b = comm.reduce_add_coalesced(per_device, "cpu:2")
    assert a.device is it.device("cpu:2")
    np.testing.assert_array_equal(a.numpy(), np.full((2, 2), 6.0))
    np.testing.assert_array_equal(b.numpy(), np.full((3,), 60.0))
    (a.sum() * 2 + b.sum()).backward()
    for group in per_device:
        assert group[0].grad.device is group[0].device
        np.testing.assert_array_equal(group[0].grad.numpy(), np.full((2, 2), 2.0))
        np.testing.assert_array_equal(group[1].grad.numpy(), np.ones(3))


def test_unused_replica_output_gets_zero_gradient():
    w = it.tensor([1.0, 2.0], requires_grad=True)
    replicas = comm.broadcast([w], DEVICES[:2])
    (replicas[1][0] * 3).sum().backward()  # replica 0 never used
    np.testing.assert_array_equal(w.grad.numpy(), [3.0, 3.0])


def test_mixing_devices_without_comm_is_a_clear_error():
    with pytest.raises(ValueError, match="expected all tensor inputs on one device"):
        it.ones(2, device="cpu:0") + it.ones(2, device="cpu:1")


@pytest.mark.cuda
def test_scatter_gather_broadcast_reduce_on_gpus():
    try:
        import cupy
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception:
        pytest.skip("cupy or a GPU is missing")
    if count < 2:
        pytest.skip(f"needs 2 GPUs, found {count}")
    gpus = ["cuda:0", "cuda:1"]
    x = it.tensor(np.arange(12, dtype=np.float32).reshape(6, 2), device="cuda:0", requires_grad=True)
    parts = comm.scatter(x, gpus)
    assert [str(p.device) for p in parts] == gpus
    w = it.tensor([2.0, 3.0], device="cuda:0", requires_grad=True)
    replicas = comm.broadcast([w], gpus)
    losses = [(p * r[0]).sum() for p, r in zip(parts, replicas)]
    total = comm.gather(losses, "cuda:0").sum()
    total.backward()
    np.testing.assert_allclose(x.grad.numpy(), np.tile([2.0, 3.0], (6, 1)))
    np.testing.assert_allclose(w.grad.numpy(), np.arange(12, dtype=np.float32).reshape(6, 2).sum(0))
    summed = comm.reduce_add_coalesced([[p.detach()] for p in parts[:1]] + [[parts[1].detach()]], "cuda:1")
    np.testing.assert_allclose(summed[0].numpy(), data_sum(x.numpy()))


def data_sum(a):
    return a[:3] + a[3:]
