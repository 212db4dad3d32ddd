import warnings

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


# ---------------------------------------------------------------------------- class weights and label smoothing
def class_weights(classes=5, seed=1):
    return np.random.default_rng(seed).uniform(0.2, 2.0, classes).astype(np.float32)


LAYOUTS = {  # input shape, target shape (classes 5)
    "2d": ((7, 5), (7,)),
    "kdim": ((2, 5, 3, 2), (2, 3, 2)),
    "unbatched": ((5,), ()),
}


def layout_targets(target_shape, ignore_index, seed=0):
    t = targets(*target_shape, seed=seed) if target_shape else np.array(3)
    if ignore_index is not None and t.ndim:
        t.reshape(-1)[::3] = ignore_index
    return t


@pytest.mark.parametrize("layout", list(LAYOUTS), ids=list(LAYOUTS))
@pytest.mark.parametrize("ignore_index", [None, 2])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.3])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cross_entropy_weight_smoothing_ignore(layout, ignore_index, label_smoothing, weighted, reduction):
    input_shape, target_shape = LAYOUTS[layout]
    t = layout_targets(target_shape, ignore_index)
    kw = dict(ignore_index=-100 if ignore_index is None else ignore_index, reduction=reduction,
              label_smoothing=label_smoothing)
    if not weighted:
        check_op([input_shape, t], lambda x, t: it.cross_entropy(x, t, **kw), lambda x, t: F.cross_entropy(x, t, **kw))
        return
    check_op([input_shape, t, class_weights()], lambda x, t, w: it.cross_entropy(x, t, weight=w, **kw),
             lambda x, t, w: F.cross_entropy(x, t, weight=w, **kw), grad_mask=[True, False, False])


def test_cross_entropy_weighted_mean_divides_by_target_weights():
    x = np.zeros((3, 2), np.float32)  # every row's unweighted loss is log 2
    w = np.array([1.0, 3.0], np.float32)
    loss = it.cross_entropy(it.tensor(x), it.tensor([0, 1, 1]), weight=it.tensor(w))
    assert loss.item() == pytest.approx(np.log(2), rel=1e-6)  # (1 + 3 + 3) log 2 / (1 + 3 + 3)
    summed = it.cross_entropy(it.tensor(x), it.tensor([0, 1, 1]), weight=it.tensor(w), reduction="sum")
    assert summed.item() == pytest.approx(7 * np.log(2), rel=1e-6)
    smoothed = it.cross_entropy(it.tensor(x), it.tensor([0, 1, 1]), label_smoothing=1.0, reduction="none")
    np.testing.assert_allclose(smoothed.numpy(), [np.log(2)] * 3, rtol=1e-6)  # uniform target: still log 2


def test_cross_entropy_weighted_large_logits_and_retain_graph():
    x = np.random.default_rng(2).uniform(-60, 60, (6, 9)).astype(np.float32)
    t, w = targets(6, classes=9), class_weights(9)
    check_op([x, t, w], lambda x, t, w: it.cross_entropy(x, t, weight=w, label_smoothing=0.1),
             lambda x, t, w: F.cross_entropy(x, t, weight=w, label_smoothing=0.1), fd=False, rtol=1e-5, atol=1e-5,
             grad_mask=[True, False, False])
    xi = it.tensor(x, requires_grad=True)
    loss = it.cross_entropy(xi, it.tensor(t), weight=it.tensor(w), label_smoothing=0.1)
    loss.backward(retain_graph=True)
    first = xi.grad.numpy().copy()
    loss.backward()
    np.testing.assert_allclose(xi.grad.numpy(), 2 * first, rtol=1e-6)


@pytest.mark.parametrize("name,kw", [("cross_entropy", {}), ("cross_entropy", {"label_smoothing": 0.2}),
                                     ("nll_loss", {})], ids=["cross_entropy", "smoothed", "nll_loss"])
def test_all_ignored_or_zero_weight_denominator_like_torch(name, kw):
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    w = np.array([0.0, 0.0, 1.0, 1.0], np.float32)
    for t in ([-100, -100, -100], [0, 1, 1]):  # all ignored: nan mean, zero gradient; zero weight sum: nan
        xi, xt = it.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
        ours = getattr(it, name)(xi, it.tensor(t), weight=it.tensor(w), **kw)
        theirs = getattr(F, name)(xt, torch.tensor(t), weight=torch.tensor(w), **kw)
        assert np.isnan(ours.item()) and np.isnan(theirs.item())
        ours.backward()
        theirs.backward()
        np.testing.assert_array_equal(xi.grad.numpy(), xt.grad.numpy())


def test_negative_label_smoothing_is_none_as_in_torch():
    x, t = it.randn(4, 3), it.tensor([0, 2, 1, 1])
    np.testing.assert_array_equal(it.cross_entropy(x, t, label_smoothing=-0.5).numpy(), it.cross_entropy(x, t).numpy())


# ------------------------------------------------------------------------------------- probability targets
def soft_targets(shape, class_dim, seed=3):
    p = np.random.default_rng(seed).uniform(0.0, 1.0, shape)
    return (p / p.sum(axis=class_dim, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize("layout", list(LAYOUTS), ids=list(LAYOUTS))
@pytest.mark.parametrize("label_smoothing", [0.0, 0.25])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cross_entropy_probability_targets(layout, label_smoothing, weighted, reduction):
    input_shape, _ = LAYOUTS[layout]
    probs = soft_targets(input_shape, 0 if len(input_shape) == 1 else 1)
    kw = dict(reduction=reduction, label_smoothing=label_smoothing)
    # gradients for the input, the soft target and (as torch's composite gives them) the class weights
    if not weighted:
        check_op([input_shape, probs], lambda x, p: it.cross_entropy(x, p, **kw),
                 lambda x, p: F.cross_entropy(x, p, **kw))
        return
    check_op([input_shape, probs, class_weights()], lambda x, p, w: it.cross_entropy(x, p, weight=w, **kw),
             lambda x, p, w: F.cross_entropy(x, p, weight=w, **kw), rtol=1e-5, atol=2e-6)


def test_cross_entropy_probability_targets_edge_cases():
    # one-hot probabilities give the class-index loss; ignore_index < 0 is accepted (unused); empty mean is nan
    x = it.randn(4, 3)
    t = np.array([2, 0, 1, 1])
    one_hot = np.eye(3, dtype=np.float32)[t]
    np.testing.assert_allclose(it.cross_entropy(x, it.tensor(one_hot), ignore_index=-1, reduction="none").numpy(),
                               it.cross_entropy(x, it.tensor(t), reduction="none").numpy(), rtol=1e-6)
    assert np.isnan(it.cross_entropy(it.zeros(0, 3), it.zeros(0, 3)).item())
    assert it.cross_entropy(it.zeros(0, 3), it.zeros(0, 3), reduction="sum").item() == 0
    f64 = it.cross_entropy(x, it.tensor(one_hot.astype(np.float64)))  # the dtypes promote, as torch
    assert f64.dtype == it.float64


def test_cross_entropy_errors():
    x = it.zeros(4, 3)
    t = it.tensor([0, 1, 2, 1])
    with pytest.raises(ValueError, match=r"cross_entropy: expected a weight of shape \(3,\), one per class, got "
                                         r"weight of shape \(4,\)"):
        it.cross_entropy(x, t, weight=it.ones(4))
    with pytest.raises(ValueError, match=r"nll_loss: expected a floating weight of the input's dtype float32, got "
                                         r"weight of dtype float64"):
        it.nll_loss(x, t, weight=it.ones(3, dtype=it.float64))
    with pytest.raises(ValueError, match=r"cross_entropy: expected a floating weight, got weight of dtype int64"):
        it.cross_entropy(x, it.zeros(4, 3), weight=it.tensor([1, 2, 3]))  # probabilities: any float weight
    with pytest.raises(ValueError, match=r"cross_entropy: expected a weight that does not require grad"):
        it.cross_entropy(x, t, weight=it.ones(3, requires_grad=True))
    with pytest.raises(ValueError, match=r"cross_entropy: expected label_smoothing between 0.0 and 1.0, got "
                                         r"label_smoothing=1.5"):
        it.cross_entropy(x, t, label_smoothing=1.5)
    with pytest.raises(ValueError, match=r"cross_entropy: expected a negative ignore_index \(unused\) with "
                                         r"class-probability targets, got ignore_index=0"):
        it.cross_entropy(x, it.zeros(4, 3), ignore_index=0)
    with pytest.raises(ValueError, match=r"expected integer class-index targets, got targets of dtype float32\n"
                                         r"HINT: .*class probabilities are float targets of the input's shape"):
        it.cross_entropy(x, it.zeros(4, 2))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_nll_loss_weighted(reduction):
    w = class_weights(4)
    check_op([(6, 4), targets(6, classes=4, ignore=1), w],
             lambda x, t, w: it.nll_loss(x, t, weight=w, ignore_index=1, reduction=reduction),
             lambda x, t, w: F.nll_loss(x, t, weight=w, ignore_index=1, reduction=reduction),
             grad_mask=[True, False, False])
    check_op([(2, 4, 3, 2), targets(2, 3, 2, classes=4, ignore=-100), w],
             lambda x, t, w: it.nll_loss(x, t, weight=w, reduction=reduction),
             lambda x, t, w: F.nll_loss(x, t, weight=w, reduction=reduction), grad_mask=[True, False, False])
    check_op([(4,), np.array(3), w], lambda x, t, w: it.nll_loss(x, t, w, reduction=reduction),
             lambda x, t, w: F.nll_loss(x, t, w, reduction=reduction), grad_mask=[True, False, False])


# ---------------------------------------------------------------------------------------------------- mse
MSE_SHAPES = {"same": [(3, 4), (3, 4)], "target_broadcasts": [(3, 4), (4,)], "input_broadcasts": [(1, 4), (3, 1)],
              "scalar": [(), ()]}


@pytest.mark.parametrize("shapes", list(MSE_SHAPES.values()), ids=list(MSE_SHAPES))
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_mse_loss(shapes, reduction):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch (and we) warn when the shapes differ
        check_op(shapes, lambda x, y: it.mse_loss(x, y, reduction=reduction),
                 lambda x, y: F.mse_loss(x, y, reduction=reduction))


def test_mse_loss_dtypes_warning_and_empty():
    with pytest.warns(UserWarning, match="different to the input size"):
        it.mse_loss(it.ones(3, 4), it.ones(4))
    x = it.tensor([1.0, 2.0, 4.0], requires_grad=True)
    loss = it.mse_loss(x, it.tensor([1, 1, 1]))  # integer targets: float32 result, as torch
    assert loss.dtype == it.float32 and loss.item() == pytest.approx(10 / 3)
    loss.backward()
    np.testing.assert_allclose(x.grad.numpy(), [0.0, 2 / 3, 2.0], rtol=1e-6)
    assert it.mse_loss(it.ones(2), it.ones(2, dtype=it.float64)).dtype == it.float64
    assert np.isnan(it.mse_loss(it.zeros(0), it.zeros(0)).item())
    with pytest.raises(ValueError, match=r"mse_loss: expected a floating input or target, got int64 and int64"):
        it.mse_loss(it.tensor([1]), it.tensor([2]))
    with pytest.raises(ValueError, match=r"mse_loss: expected reduction in"):
        it.mse_loss(it.ones(2), it.ones(2), reduction="avg")


# ---------------------------------------------------------------------------------------------------- bce
BCE = it.binary_cross_entropy_with_logits


@pytest.mark.parametrize("weights", ["none", "weight", "pos_weight", "both", "pos_weight_column"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_binary_cross_entropy_with_logits(weights, reduction):
    rng = np.random.default_rng(5)
    target = rng.uniform(0, 1, (4, 3)).astype(np.float32)
    weight = rng.uniform(0.5, 2, (3,)).astype(np.float32) if weights in ("weight", "both") else None
    pos_weight = {"pos_weight": rng.uniform(0.5, 3, (3,)), "both": rng.uniform(0.5, 3, (4, 3)),
                  "pos_weight_column": rng.uniform(0.5, 3, (4, 1))}.get(weights)
    pos_weight = None if pos_weight is None else pos_weight.astype(np.float32)

    def ours(x, t):
        return BCE(x, t, weight=None if weight is None else it.tensor(weight, dtype=x.dtype), reduction=reduction,
                   pos_weight=None if pos_weight is None else it.tensor(pos_weight, dtype=x.dtype))

    def theirs(x, t):
        return F.binary_cross_entropy_with_logits(
            x, t, weight=None if weight is None else torch.tensor(weight), reduction=reduction,
            pos_weight=None if pos_weight is None else torch.tensor(pos_weight))
    check_op([(4, 3), target], ours, theirs)  # gradients for input and target


def test_binary_cross_entropy_with_logits_extreme_logits_and_module_layouts():
    x = np.array([[-200.0, -30.0, 0.0, 30.0, 200.0]], np.float32)
    t = np.array([[0.0, 1.0, 0.5, 0.0, 1.0]], np.float32)
    pw = np.array([2.0], np.float32)
    check_op([x, t], lambda x, t: BCE(x, t, reduction="none", pos_weight=it.tensor(pw, dtype=x.dtype)),
             lambda x, t: F.binary_cross_entropy_with_logits(x, t, reduction="none", pos_weight=torch.tensor(pw)),
             fd=False)
    out = BCE(it.tensor(x), it.tensor(t), reduction="none").numpy()
    assert np.isfinite(out).all() and out[0, 0] == 0 and out[0, 1] == pytest.approx(30, rel=1e-6)
    check_op([(2, 3, 4), soft_targets((2, 3, 4), 1)], lambda x, t: BCE(x, t), F.binary_cross_entropy_with_logits)


def test_binary_cross_entropy_with_logits_errors():
    name = "binary_cross_entropy_with_logits"
    x = it.zeros(4, 3)
    with pytest.raises(ValueError, match=rf"{name}: expected a target of the input's shape \(4, 3\), got target of "
                                         r"shape \(3,\)"):
        BCE(x, it.zeros(3))
    with pytest.raises(ValueError, match=rf"{name}: expected a pos_weight that broadcasts to the input's shape "
                                         r"\(4, 3\), got pos_weight of shape \(2, 4, 3\)"):
        BCE(x, it.zeros(4, 3), pos_weight=it.ones(2, 4, 3))
    with pytest.raises(ValueError, match=rf"{name}: expected a weight that broadcasts"):
        BCE(x, it.zeros(4, 3), weight=it.ones(2))
    with pytest.raises(ValueError, match=rf"{name}: expected floating-point input and target, got float32 and int64"):
        BCE(x, it.zeros(4, 3).long())
    with pytest.raises(ValueError, match=rf"{name}: expected a weight that does not require grad"):
        BCE(x, it.zeros(4, 3), weight=it.ones(3, requires_grad=True))
    assert BCE(x, it.zeros(4, 3, dtype=it.float64)).dtype == it.float64  # promoted as torch
    assert BCE(x, it.zeros(4, 3), pos_weight=it.ones(3, dtype=it.float64)).dtype == it.float32


# ---------------------------------------------------------------------------------------------------- GPU
GPU_CASES = {
    "ce_weight_smoothing": (lambda x, t, p, w: it.cross_entropy(x, t, weight=w, ignore_index=1, label_smoothing=0.2)),
    "ce_probabilities": (lambda x, t, p, w: it.cross_entropy(x, p, weight=w, label_smoothing=0.1, reduction="sum")),
    "nll_weight": (lambda x, t, p, w: it.nll_loss(x, t, weight=w, reduction="none")),
    "mse": (lambda x, t, p, w: it.mse_loss(x, p)),
    "bce": (lambda x, t, p, w: BCE(x, p, weight=w, pos_weight=w * 2)),
}


@pytest.mark.cuda
@pytest.mark.skipif(not it.backend.cuda_available(), reason="needs cupy and an NVIDIA GPU")
@pytest.mark.parametrize("case", list(GPU_CASES), ids=list(GPU_CASES))
def test_losses_on_cuda_match_cpu(case):
    rng = np.random.default_rng(0)
    x, p = rng.standard_normal((6, 5)).astype(np.float32), soft_targets((6, 5), 1)
    t, w = targets(6, ignore=1), class_weights()
    results = []
    for device in ("cpu", "cuda:0"):
        xi, pi = it.tensor(x, device=device, requires_grad=True), it.tensor(p, device=device, requires_grad=True)
        loss = GPU_CASES[case](xi, it.tensor(t, device=device), pi, it.tensor(w, device=device))
        loss.sum().backward()
        results.append([loss.numpy(), xi.grad.numpy(), np.zeros(1) if pi.grad is None else pi.grad.numpy()])
    for cpu, gpu in zip(*results):
        np.testing.assert_allclose(gpu, cpu, rtol=1e-5, atol=1e-6)
