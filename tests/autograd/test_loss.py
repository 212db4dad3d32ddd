import numpy as np
import pytest
import torch

import infini_train as it
from tests.op_check import check_op

F = torch.nn.functional
REDUCTIONS = ["mean", "sum", "none"]


def targets(*shape, classes=5, seed=0, ignore=None):
    t = np.random.default_rng(seed).integers(0, classes, size=shape).astype(np.int64)
    if ignore is not None:
        t.reshape(-1)[::3] = ignore
    return t


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cross_entropy_2d(reduction):
    check_op([(6, 5), targets(6)], lambda x, t: it.cross_entropy(x, t, reduction=reduction),
             lambda x, t: F.cross_entropy(x, t, reduction=reduction))


@pytest.mark.parametrize("ignore_index", [-100, -1, 2])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cross_entropy_ignore_index(reduction, ignore_index):
    t = targets(7, ignore=ignore_index)
    check_op([(7, 5), t], lambda x, t: it.cross_entropy(x, t, ignore_index=ignore_index, reduction=reduction),
             lambda x, t: F.cross_entropy(x, t, ignore_index=ignore_index, reduction=reduction))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cross_entropy_all_targets_ignored(reduction):
    # mean over zero targets is nan (torch too); gradients are zero
    t = np.full(3, -100, np.int64)
    x = it.randn(3, 4, requires_grad=True)
    loss = it.cross_entropy(x, t, reduction=reduction)
    ref = F.cross_entropy(torch.tensor(x.numpy()), torch.tensor(t), reduction=reduction).numpy()
    np.testing.assert_array_equal(loss.numpy(), ref)
    loss.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.zeros((3, 4), np.float32))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cross_entropy_single_sample_and_spatial_dims(reduction):
    check_op([(5,), np.array(2)], lambda x, t: it.cross_entropy(x, t, reduction=reduction),
             lambda x, t: F.cross_entropy(x, t, reduction=reduction))
    check_op([(2, 5, 3), targets(2, 3)], lambda x, t: it.cross_entropy(x, t, reduction=reduction),
             lambda x, t: F.cross_entropy(x, t, reduction=reduction))
    check_op([(2, 4, 3, 2), targets(2, 3, 2, classes=4, ignore=-100)],
             lambda x, t: it.cross_entropy(x, t, reduction=reduction),
             lambda x, t: F.cross_entropy(x, t, reduction=reduction))


def test_cross_entropy_on_btv_logits_as_gpt2_calls_it():
    # (B, T, V) logits and (B, T) targets, flattened to rows; the gradient arrives in (B, T, V)
    t = targets(2, 3, classes=7, ignore=-1)
    check_op([(2, 3, 7), t], lambda x, t: it.cross_entropy(x.view(-1, 7), t.view(-1), ignore_index=-1),
             lambda x, t: F.cross_entropy(x.view(-1, 7), t.view(-1), ignore_index=-1))
    check_op([(4, 8, 300), targets(4, 8, classes=300)],
             lambda x, t: it.cross_entropy(x.reshape(-1, 300), t.reshape(-1)),
             lambda x, t: F.cross_entropy(x.reshape(-1, 300), t.reshape(-1)), low=-10, high=10, fd=False)


def test_cross_entropy_empty_batch():
    check_op([(0, 5), np.zeros(0, np.int64)], lambda x, t: it.cross_entropy(x, t, reduction="sum"),
             lambda x, t: F.cross_entropy(x, t, reduction="sum"))
    assert np.isnan(it.cross_entropy(it.zeros(0, 5), np.zeros(0, np.int64)).item())


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cross_entropy_on_extreme_logits_is_finite(reduction):
    x = np.array([[1e4, -1e4, 0.0], [-1e4, 1e4, 1e4], [-1e4, -1e4 + 1, -1e4 + 0.5]], np.float32)
    check_op([x, np.array([1, 2, 0])], lambda x, t: it.cross_entropy(x, t, reduction=reduction),
             lambda x, t: F.cross_entropy(x, t, reduction=reduction), fd=False)
    assert np.isfinite(it.cross_entropy(it.tensor(x), it.tensor([1, 2, 0]), reduction="none").numpy()).all()


def test_cross_entropy_large_logits_and_confident_rows_per_sample():
    # logits of 60 keep the unshifted exp path; the per-row losses (some ~1e-9) must still match torch
    x = np.random.default_rng(4).uniform(-60, 60, (8, 50)).astype(np.float32)
    t = x.argmax(1)
    t[::2] = np.arange(4)
    check_op([x, t], lambda x, t: it.cross_entropy(x, t, reduction="none"),
             lambda x, t: F.cross_entropy(x, t, reduction="none"), fd=False)


def test_cross_entropy_retain_graph_keeps_the_stash_intact():
    x = it.randn(4, 6, requires_grad=True)
    loss = it.cross_entropy(x, it.tensor([0, 5, 2, 1]))
    loss.backward(retain_graph=True)
    first = x.grad.numpy().copy()
    loss.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * first, rtol=1e-6)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        loss.backward()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cross_entropy_half_precision_logits(dtype):
    x32 = np.random.default_rng(0).uniform(-5, 5, (6, 40)).astype(np.float32)
    x = it.tensor(x32).to(dtype).requires_grad_(True)
    t = targets(6, classes=40)
    loss = it.cross_entropy(x, t)
    assert loss.dtype == x.dtype
    loss.backward()
    assert x.grad.dtype == x.dtype
    xt = torch.tensor(x.to("float32").numpy(), requires_grad=True)
    ref = F.cross_entropy(xt, torch.tensor(t))
    ref.backward()
    np.testing.assert_allclose(loss.to("float32").item(), ref.item(), rtol=1e-2)
    np.testing.assert_allclose(x.grad.to("float32").numpy(), xt.grad.numpy(), rtol=2e-2, atol=1e-3)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_nll_loss(reduction):
    check_op([(6, 5), targets(6, ignore=-100)], lambda x, t: it.nll_loss(x.log_softmax(-1), t, reduction=reduction),
             lambda x, t: F.nll_loss(x.log_softmax(-1), t, reduction=reduction))
    check_op([(2, 4, 3), targets(2, 3, classes=4, ignore=1)],
             lambda x, t: it.nll_loss(x, t, ignore_index=1, reduction=reduction),
             lambda x, t: F.nll_loss(x, t, ignore_index=1, reduction=reduction))
    check_op([(4,), np.array(3)], lambda x, t: it.nll_loss(x, t, reduction=reduction),
             lambda x, t: F.nll_loss(x, t, reduction=reduction))


@pytest.mark.parametrize("name", ["cross_entropy", "nll_loss"])
def test_errors(name):
    fn = getattr(it, name)
    with pytest.raises(ValueError, match=rf"{name}: expected target values in \[0, C\) with C=5 classes, or "
                                         r"ignore_index=-100, got target value 7"):
        fn(it.zeros(2, 5), it.tensor([1, 7]))
    with pytest.raises(ValueError, match=r"got target value -3"):
        fn(it.zeros(3, 5), it.tensor([1, -100, -3]))
    with pytest.raises(ValueError, match=rf"{name}: expected integer class-index targets, got targets of dtype float"):
        fn(it.zeros(2, 5), it.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match=rf"{name}: expected target of shape \(2,\) for input of shape \(2, 5\), "
                                         r"got target of shape \(3,\)\nHINT: .*logits.view\(-1, V\)"):
        fn(it.zeros(2, 5), it.tensor([1, 2, 3]))
    # (B, T, V) logits with (B, T) targets read as (N, C, d1): torch rejects them too; the hint says what to do
    with pytest.raises(ValueError, match=rf"{name}: expected target of shape \(2, 7\) for input of shape \(2, 3, 7\), "
                                         r"got target of shape \(2, 3\)\nHINT: .*targets.view\(-1\)"):
        fn(it.zeros(2, 3, 7), it.zeros(2, 3).long())
    with pytest.raises(ValueError, match=rf"{name}: expected reduction in"):
        fn(it.zeros(2, 5), it.tensor([1, 2]), reduction="avg")
    with pytest.raises(ValueError, match=rf"{name}: expected floating-point input, got input of dtype int64"):
        fn(it.tensor([[1, 2]]), it.tensor([0]))
