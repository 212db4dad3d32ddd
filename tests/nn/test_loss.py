"""Loss modules against torch.nn's with the same constructor arguments: values, input and target gradients,
weight buffers (state_dict, to), the legacy size_average / reduce arguments, repr and errors."""
import numpy as np
import pytest
import torch

import infini_train as it
from infini_train import nn


def randn(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def weights(n, seed=1):
    return np.random.default_rng(seed).uniform(0.3, 2.0, n).astype(np.float32)


def compare(make, x, target, target_grad=False, rtol=1e-5, atol=1e-6):
    """Run ``make(nn)`` and ``make(torch.nn)`` (a module factory taking a tensor constructor) on the same inputs;
    compare the outputs, the input gradients and (for float targets that take part) the target gradients."""
    ours, theirs = make(nn, it.tensor), make(torch.nn, torch.tensor)
    xi, xt = it.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    ti, tt = it.tensor(target, requires_grad=target_grad), torch.tensor(target, requires_grad=target_grad)
    yi, yt = ours(xi, ti), theirs(xt, tt)
    np.testing.assert_allclose(yi.numpy(), yt.detach().numpy(), rtol=rtol, atol=atol)
    upstream = randn(*yt.shape, seed=9)
    yi.backward(it.tensor(upstream))
    yt.backward(torch.tensor(upstream))
    np.testing.assert_allclose(xi.grad.numpy(), xt.grad.numpy(), rtol=rtol, atol=atol)
    if target_grad:
        np.testing.assert_allclose(ti.grad.numpy(), tt.grad.numpy(), rtol=rtol, atol=atol)
    return ours, theirs


CLASS_TARGET = np.array([0, 4, -1, 2, 2, -1])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("kw", [{}, {"label_smoothing": 0.2}, {"weight": True},
                                {"weight": True, "label_smoothing": 0.1}],
                         ids=["plain", "smoothing", "weight", "weight_smoothing"])
def test_cross_entropy_loss(reduction, kw):
    def make(lib, tensor):
        args = dict(kw, ignore_index=-1, reduction=reduction)
        if "weight" in args:
            args["weight"] = tensor(weights(5))
        return lib.CrossEntropyLoss(**args)
    compare(make, randn(6, 5), CLASS_TARGET)


def test_cross_entropy_loss_probabilities_and_kdim():
    probs = np.random.default_rng(2).dirichlet(np.ones(5), size=4).astype(np.float32)
    compare(lambda lib, tensor: lib.CrossEntropyLoss(weight=tensor(weights(5)), label_smoothing=0.3),
            randn(4, 5), probs, target_grad=True)
    compare(lambda lib, tensor: lib.CrossEntropyLoss(reduction="none"), randn(2, 5, 3),
            np.array([[0, 1, 4], [3, 3, -100]]))
    default = nn.CrossEntropyLoss()(it.tensor(randn(2, 5)), it.tensor(np.array([1, -100])))
    assert default.item() == pytest.approx(float(torch.nn.functional.cross_entropy(
        torch.tensor(randn(2, 5)[:1]), torch.tensor([1]))), rel=1e-6)  # the ignored row counts for nothing


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss(reduction):
    compare(lambda lib, tensor: lib.NLLLoss(weight=tensor(weights(5)), ignore_index=-1, reduction=reduction),
            randn(6, 5), CLASS_TARGET)
    compare(lambda lib, tensor: lib.NLLLoss(reduction=reduction), randn(2, 5, 3), np.array([[0, 1, 4], [3, 3, 2]]))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_loss(reduction):
    compare(lambda lib, tensor: lib.MSELoss(reduction=reduction), randn(3, 4), randn(3, 4, seed=1), target_grad=True)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_bce_with_logits_loss(reduction):
    target = np.random.default_rng(3).uniform(0, 1, (5, 3)).astype(np.float32)
    compare(lambda lib, tensor: lib.BCEWithLogitsLoss(weight=tensor(weights(3)), reduction=reduction,
                                                       pos_weight=tensor(weights(3, seed=4) * 2)),
            randn(5, 3) * 3, target, target_grad=True)
    compare(lambda lib, tensor: lib.BCEWithLogitsLoss(reduction=reduction), randn(5, 3), target, target_grad=True)


def test_weights_are_buffers_like_torch():
    w = weights(3)
    pairs = [(nn.CrossEntropyLoss(it.tensor(w)), torch.nn.CrossEntropyLoss(torch.tensor(w))),
             (nn.NLLLoss(), torch.nn.NLLLoss()),
             (nn.BCEWithLogitsLoss(pos_weight=it.tensor(w)), torch.nn.BCEWithLogitsLoss(pos_weight=torch.tensor(w))),
             (nn.MSELoss(), torch.nn.MSELoss())]
    for ours, theirs in pairs:
        assert list(ours.state_dict()) == list(theirs.state_dict())
        assert [n for n, _ in ours.named_buffers()] == [n for n, _ in theirs.named_buffers()]
        assert list(ours.parameters()) == []
        assert repr(ours) == repr(theirs)
    loss = nn.CrossEntropyLoss(weight=w)  # an array-like weight becomes a Tensor buffer
    assert isinstance(loss.weight, it.Tensor) and loss.state_dict()["weight"].numpy().tolist() == w.tolist()
    loss.to(it.float64)  # the weight follows the module's dtype, so float64 logits pass the dtype check
    assert loss.weight.dtype == it.float64
    x = randn(2, 3).astype(np.float64)
    expected = torch.nn.functional.cross_entropy(torch.tensor(x), torch.tensor([2, 0]), torch.tensor(w, dtype=float))
    assert loss(it.tensor(x), it.tensor([2, 0])).item() == pytest.approx(expected.item(), rel=1e-12)


@pytest.mark.parametrize("size_average,reduce,expected", [(None, False, "none"), (False, None, "sum"),
                                                          (True, True, "mean"), (False, False, "none")])
def test_legacy_size_average_and_reduce(size_average, reduce, expected):
    with pytest.warns(UserWarning, match=f"please use reduction='{expected}' instead"):
        ours = nn.MSELoss(size_average=size_average, reduce=reduce, reduction="mean")
    with pytest.warns(UserWarning):
        theirs = torch.nn.MSELoss(size_average=size_average, reduce=reduce, reduction="mean")
    assert ours.reduction == theirs.reduction == expected
    assert nn.NLLLoss(None, None, -1).ignore_index == -1  # torch's positions: weight, size_average, ignore_index


def test_errors():
    for cls in (nn.CrossEntropyLoss, nn.NLLLoss, nn.MSELoss, nn.BCEWithLogitsLoss):
        with pytest.raises(ValueError, match=rf"{cls.__name__}: reduction must be 'mean', 'sum' or 'none', got 'avg'"):
            cls(reduction="avg")
    with pytest.raises(TypeError, match=r"CrossEntropyLoss: weight must be a Tensor or None, got -1\nHINT: .*"
                                        r"CrossEntropyLoss\(ignore_index=...\)"):
        nn.CrossEntropyLoss(-1)
    with pytest.raises(ValueError, match=r"cross_entropy: expected a weight of shape \(4,\), one per class"):
        nn.CrossEntropyLoss(weight=it.ones(3))(it.zeros(2, 4), it.tensor([0, 1]))
