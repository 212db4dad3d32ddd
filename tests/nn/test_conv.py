"""conv2d, max_pool2d, avg_pool2d, batch_norm and flatten (functional and modules) against torch 2.13: forward
values and gradients in float32, float64 gradients against central finite differences, running statistics,
state dicts both ways, low precision, errors."""
import itertools

import numpy as np
import pytest
import torch

import infini_train as it
import infini_train.nn.functional as F
from infini_train import nn
from tests.autograd.test_low_precision import dyadic, from_torch, to_torch
from tests.op_check import check_op

TF = torch.nn.functional


# ---------------------------------------------------------------------------------------------------- conv2d
CONV_CASES = [  # (input shape, weight shape, stride, padding, dilation, groups, bias)
    ((2, 3, 6, 7), (4, 3, 3, 3), 1, 0, 1, 1, True),
    ((2, 3, 6, 7), (4, 3, 3, 2), 2, 1, 1, 1, True),
    ((1, 4, 7, 6), (6, 2, 3, 3), (2, 1), (1, 2), (1, 2), 2, False),
    ((2, 4, 5, 5), (4, 1, 2, 3), 1, (0, 1), 1, 4, True),  # depthwise
    ((1, 2, 8, 8), (3, 2, 3, 3), 3, 2, 2, 1, True),
    ((1, 2, 5, 6), (2, 2, 1, 1), 1, 0, 1, 1, False),  # 1x1
    ((2, 2, 5, 6), (4, 2, 4, 2), 1, "same", (1, 2), 1, True),  # even kernel: the extra pad goes after
    ((2, 2, 5, 6), (4, 2, 3, 3), 1, "valid", 1, 1, True),
]


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("xs,ws,stride,padding,dilation,groups,bias", CONV_CASES, ids=str)
def test_conv2d_matches_torch_and_finite_differences(xs, ws, stride, padding, dilation, groups, bias):
    specs = [xs, ws] + ([(ws[0],)] if bias else [])

    def ours(x, w, b=None):
        return F.conv2d(x, w, b, stride, padding, dilation, groups)

    def theirs(x, w, b=None):
        return TF.conv2d(x, w, b, stride, padding, dilation, groups)

    check_op(specs, ours, theirs, rtol=1e-5, atol=1e-5)


def test_conv2d_gradient_subsets():
    x = np.random.default_rng(5).standard_normal((2, 3, 5, 5)).astype(np.float32)
    for mask in ([True, False, False], [False, True, True], [False, False, True]):
        check_op([x, (4, 3, 3, 3), (4,)], lambda x, w, b: F.conv2d(x, w, b, padding=1),
                 lambda x, w, b: TF.conv2d(x, w, b, padding=1), grad_mask=mask, fd=False, atol=1e-5)


def test_conv2d_cifar_sized_forward_and_backward():
    check_op([(4, 16, 16, 16), (32, 16, 3, 3), (32,)], lambda x, w, b: F.conv2d(x, w, b, padding=1),
             lambda x, w, b: TF.conv2d(x, w, b, padding=1), fd=False, rtol=1e-4, atol=1e-4)


def test_conv2d_bfloat16_and_autocast():
    rng = np.random.default_rng(0)
    x, w, b = (dyadic(rng, s, it.bfloat16) for s in ((2, 3, 5, 5), (4, 3, 3, 3), (4,)))
    ours = F.conv2d(it.tensor(x), it.tensor(w), it.tensor(b), padding=1)
    theirs = TF.conv2d(to_torch(x), to_torch(w), to_torch(b), padding=1)
    assert ours.dtype == it.bfloat16
    # dyadic inputs: the float32 sums are exact, so both round the same value
    np.testing.assert_array_equal(ours.numpy().astype(np.float32), from_torch(theirs).astype(np.float32))
    xf, wf = it.tensor(x.astype(np.float32)), it.tensor(w.astype(np.float32), requires_grad=True)
    with it.autocast("cpu", dtype=it.bfloat16):
        y = F.conv2d(xf, wf, padding=1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ty = TF.conv2d(torch.tensor(x.astype(np.float32)), torch.tensor(w.astype(np.float32)), padding=1)
    assert ty.dtype == torch.bfloat16 and y.dtype == it.bfloat16
    np.testing.assert_array_equal(y.numpy().astype(np.float32), from_torch(ty).astype(np.float32))
    y.float().sum().backward()
    assert wf.grad.dtype == it.float32


def _error(fn):
    with pytest.raises(ValueError) as info:
        fn()
    return str(info.value)


def test_conv2d_errors_name_the_op_and_hint():
    x = it.zeros(1, 3, 5, 5)
    msg = _error(lambda: F.conv2d(x, it.zeros(4, 2, 3, 3)))
    assert "conv2d" in msg and "3 channels" in msg and "HINT" in msg
    msg = _error(lambda: F.conv2d(x, it.zeros(4, 3, 7, 7)))
    assert "conv2d" in msg and "padded input (5 x 5)" in msg and "HINT" in msg
    assert "HINT" in _error(lambda: F.conv2d(it.zeros(1, 4, 5, 5), it.zeros(3, 2, 3, 3), groups=2))
    assert "stride 1" in _error(lambda: F.conv2d(x, it.zeros(4, 3, 3, 3), stride=2, padding="same"))
    assert "4-D input" in _error(lambda: F.conv2d(it.zeros(3, 5, 5), it.zeros(4, 3, 3, 3)))
    assert "HINT" in _error(lambda: nn.Conv2d(4, 6, 3, groups=4))
    with pytest.raises(RuntimeError):  # torch refuses the same inputs
        TF.conv2d(torch.zeros(1, 3, 5, 5), torch.zeros(4, 3, 7, 7))


# ---------------------------------------------------------------------------------------------------- pooling
POOL_CASES = list(itertools.product([2, 3, (3, 2)], [None, 1, (2, 3)], [0, 1], [False, True]))


@pytest.mark.parametrize("dilation", [1, 2])
@pytest.mark.parametrize("kernel,stride,padding,ceil_mode", POOL_CASES, ids=str)
def test_max_pool2d_matches_torch(kernel, stride, padding, ceil_mode, dilation):
    def ours(x):
        return F.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode, return_indices=True)

    def theirs(x):
        return TF.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode, return_indices=True)

    check_op([(2, 3, 7, 8)], ours, theirs, fd=dilation == 1, seed=dilation)


@pytest.mark.parametrize("count_include_pad,divisor", [(True, None), (False, None), (True, 5)])
@pytest.mark.parametrize("kernel,stride,padding,ceil_mode", POOL_CASES, ids=str)
def test_avg_pool2d_matches_torch(kernel, stride, padding, ceil_mode, count_include_pad, divisor):
    def ours(x):
        return F.avg_pool2d(x, kernel, stride, padding, ceil_mode, count_include_pad, divisor)

    def theirs(x):
        return TF.avg_pool2d(x, kernel, stride, padding, ceil_mode, count_include_pad, divisor)

    check_op([(2, 3, 7, 8)], ours, theirs, fd=divisor is None)


def test_pooling_3d_input_ties_and_nan():
    check_op([(3, 6, 6)], lambda x: F.max_pool2d(x, 2), lambda x: TF.max_pool2d(x, 2))
    check_op([(3, 6, 6)], lambda x: F.avg_pool2d(x, 3, 2, 1), lambda x: TF.avg_pool2d(x, 3, 2, 1))
    ties = np.array([[[[1, 1, 0, 2], [1, 0, 2, 2]]]], np.float32)  # the first maximum gets the gradient
    check_op([ties], lambda x: F.max_pool2d(x, 2, return_indices=True),
             lambda x: TF.max_pool2d(x, 2, return_indices=True), fd=False)
    nan = np.array([[[[1, np.nan], [3, 2]]]], np.float32)
    assert np.isnan(F.max_pool2d(it.tensor(nan), 2).numpy()).all()


def test_pooling_errors():
    x = it.zeros(1, 1, 4, 4)
    msg = _error(lambda: F.max_pool2d(x, 2, padding=2))
    assert "max_pool2d" in msg and "half the kernel" in msg and "HINT" in msg
    msg = _error(lambda: F.avg_pool2d(x, 5))
    assert "avg_pool2d" in msg and "HINT" in msg
    with pytest.raises(RuntimeError):
        TF.max_pool2d(torch.zeros(1, 1, 4, 4), 2, padding=2)


# ----------------------------------------------------------------------------------------------- batch_norm
@pytest.mark.parametrize("shape", [(4, 3, 5, 5), (6, 2), (3, 4, 7)], ids=str)
def test_batch_norm_training_matches_torch_and_finite_differences(shape):
    c = shape[1]
    check_op([shape, (c,), (c,)], lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
             lambda x, w, b: TF.batch_norm(x, None, None, w, b, training=True), atol=1e-5)
    check_op([shape], lambda x: F.batch_norm(x, None, None, training=True, eps=1e-3),
             lambda x: TF.batch_norm(x, None, None, training=True, eps=1e-3), atol=1e-5)


def test_batch_norm_eval_uses_running_stats():
    rng = np.random.default_rng(1)
    mean, var = rng.standard_normal(3).astype(np.float32), rng.uniform(0.5, 2, 3).astype(np.float32)
    check_op([(4, 3, 2, 2), (3,), (3,)],
             lambda x, w, b: F.batch_norm(x, it.tensor(mean), it.tensor(var), w, b, training=False),
             lambda x, w, b: TF.batch_norm(x, torch.tensor(mean), torch.tensor(var), w, b, training=False), atol=1e-5)


def test_batch_norm_updates_running_stats_like_torch():
    rng = np.random.default_rng(2)
    x = (3 * rng.standard_normal((5, 3, 4, 4)) + 2).astype(np.float32)
    ours = [it.zeros(3), it.ones(3)]
    theirs = [torch.zeros(3), torch.ones(3)]
    for momentum in (0.1, 0.5):
        F.batch_norm(it.tensor(x), *ours, training=True, momentum=momentum)
        TF.batch_norm(torch.tensor(x), *theirs, training=True, momentum=momentum)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-6)
    unbiased = x.transpose(1, 0, 2, 3).reshape(3, -1).var(axis=1, ddof=1)
    assert not np.allclose(ours[1].numpy(), 1.0) and np.all(ours[1].numpy() > 0.5 * unbiased)


def test_batch_norm2d_module_training_eval_and_state_dict():
    rng = np.random.default_rng(3)
    for kwargs in ({}, {"momentum": None}, {"affine": False}, {"track_running_stats": False}):
        ours, theirs = nn.BatchNorm2d(3, **kwargs), torch.nn.BatchNorm2d(3, **kwargs)
        assert list(ours.state_dict()) == list(theirs.state_dict()), kwargs
        for step in range(3):
            x = (2 * rng.standard_normal((4, 3, 5, 5)) + step).astype(np.float32)
            xi, xt = it.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
            yi, yt = ours(xi), theirs(xt)
            (yi * yi).sum().backward()
            (yt * yt).sum().backward()
            np.testing.assert_allclose(yi.numpy(), yt.detach().numpy(), rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(xi.grad.numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-5)
        for key, value in theirs.state_dict().items():
            np.testing.assert_allclose(ours.state_dict()[key].numpy(), value.numpy(), rtol=1e-5, atol=1e-6,
                                       err_msg=key)
        ours.eval(), theirs.eval()
        np.testing.assert_allclose(ours(it.tensor(x)).numpy(), theirs(torch.tensor(x)).detach().numpy(),
                                   rtol=1e-5, atol=1e-5)


def test_batch_norm2d_loads_torch_state_and_refuses_bad_input():
    theirs = torch.nn.BatchNorm2d(4)
    with torch.no_grad():
        for t in (theirs.weight, theirs.bias, theirs.running_mean):
            t.uniform_(-1, 1)
        theirs.running_var.uniform_(0.5, 2)
        theirs.num_batches_tracked.fill_(7)
    ours = nn.BatchNorm2d(4)
    ours.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})
    assert int(ours.num_batches_tracked.numpy()) == 7
    x = np.random.default_rng(4).standard_normal((2, 4, 3, 3)).astype(np.float32)
    np.testing.assert_allclose(ours.eval()(it.tensor(x)).numpy(), theirs.eval()(torch.tensor(x)).detach().numpy(),
                               rtol=1e-5, atol=1e-6)
    msg = _error(lambda: nn.BatchNorm2d(3)(it.zeros(2, 4, 3, 3)))
    assert "batch_norm" in msg and "HINT" in msg
    msg = _error(lambda: nn.BatchNorm2d(3)(it.zeros(1, 3, 1, 1)))
    assert "more than 1 value per channel" in msg


def test_batch_norm_bfloat16_input_with_float32_params():
    rng = np.random.default_rng(5)
    x = dyadic(rng, (4, 3, 2, 2), it.bfloat16)
    w, b = rng.standard_normal(3).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    ours = F.batch_norm(it.tensor(x), None, None, it.tensor(w), it.tensor(b), training=True)
    theirs = TF.batch_norm(to_torch(x), None, None, torch.tensor(w), torch.tensor(b), training=True)
    assert ours.dtype == it.bfloat16
    np.testing.assert_allclose(ours.numpy().astype(np.float32), from_torch(theirs).astype(np.float32),
                               rtol=2 ** -7, atol=2 ** -7)


# --------------------------------------------------------------------------------------------------- modules
def test_conv2d_module_init_names_repr_and_torch_state():
    it.manual_seed(0)
    for args, kwargs in (((3, 8, 3), {"padding": 1}), ((4, 6, (3, 2)), {"stride": 2, "groups": 2, "bias": False}),
                         ((2, 4, 3), {"padding": "same", "dilation": 2})):
        ours, theirs = nn.Conv2d(*args, **kwargs), torch.nn.Conv2d(*args, **kwargs)
        assert repr(ours) == repr(theirs)
        assert [(k, tuple(v.shape)) for k, v in ours.state_dict().items()] == \
               [(k, tuple(v.shape)) for k, v in theirs.state_dict().items()]
        fan_in = args[0] // kwargs.get("groups", 1) * theirs.kernel_size[0] * theirs.kernel_size[1]
        bound = 1 / np.sqrt(fan_in)
        assert np.abs(ours.weight.numpy()).max() <= bound and np.abs(ours.weight.numpy()).max() > 0.6 * bound
        ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
        x = np.random.default_rng(6).standard_normal((2, args[0], 7, 6)).astype(np.float32)
        np.testing.assert_allclose(ours(it.tensor(x)).numpy(), theirs(torch.tensor(x)).detach().numpy(),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_conv2d_padding_modes_match_torch(mode):
    theirs = torch.nn.Conv2d(2, 3, 3, padding=(1, 2), padding_mode=mode)
    ours = nn.Conv2d(2, 3, 3, padding=(1, 2), padding_mode=mode)
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    assert repr(ours) == repr(theirs)
    x = np.random.default_rng(7).standard_normal((2, 2, 5, 6)).astype(np.float32)
    xi, xt = it.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    ours(xi).sum().backward()
    theirs(xt).sum().backward()
    np.testing.assert_allclose(xi.grad.numpy(), xt.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ours.weight.grad.numpy(), theirs.weight.grad.numpy(), rtol=1e-5, atol=1e-4)


def test_pool_and_flatten_modules_match_torch():
    x = np.random.default_rng(8).standard_normal((2, 3, 6, 7)).astype(np.float32)
    pairs = [(nn.MaxPool2d(2), torch.nn.MaxPool2d(2)), (nn.MaxPool2d(3, 2, 1, ceil_mode=True),
             torch.nn.MaxPool2d(3, 2, 1, ceil_mode=True)), (nn.AvgPool2d(2, 1), torch.nn.AvgPool2d(2, 1)),
             (nn.AvgPool2d(3, 2, 1, count_include_pad=False), torch.nn.AvgPool2d(3, 2, 1, count_include_pad=False)),
             (nn.Flatten(), torch.nn.Flatten()), (nn.Flatten(0, 2), torch.nn.Flatten(0, 2))]
    for ours, theirs in pairs:
        assert repr(ours) == repr(theirs)
        np.testing.assert_allclose(ours(it.tensor(x)).numpy(), theirs(torch.tensor(x)).numpy(), rtol=1e-6)
    out, idx = nn.MaxPool2d(2, return_indices=True)(it.tensor(x))
    np.testing.assert_array_equal(idx.numpy(), torch.nn.MaxPool2d(2, return_indices=True)(torch.tensor(x))[1].numpy())
    assert F.flatten(it.tensor(x), 1).shape == (2, 126)


def test_small_cnn_matches_torch_end_to_end():
    def build(lib):
        return lib.nn.Sequential(lib.nn.Conv2d(1, 4, 3, padding=1), lib.nn.BatchNorm2d(4), lib.nn.ReLU(),
                                 lib.nn.MaxPool2d(2), lib.nn.Conv2d(4, 6, 3), lib.nn.AvgPool2d(2, ceil_mode=True),
                                 lib.nn.Flatten(), lib.nn.Linear(6, 3))

    theirs, ours = build(torch), build(it)
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    rng = np.random.default_rng(9)
    x, y = rng.standard_normal((5, 1, 8, 8)).astype(np.float32), rng.integers(0, 3, 5)
    loss_i = F.cross_entropy(ours(it.tensor(x)), it.tensor(y))
    loss_t = TF.cross_entropy(theirs(torch.tensor(x)), torch.tensor(y))
    loss_i.backward()
    loss_t.backward()
    np.testing.assert_allclose(loss_i.item(), loss_t.item(), rtol=1e-6)
    grads = dict(ours.named_parameters())
    for name, p in theirs.named_parameters():
        np.testing.assert_allclose(grads[name].grad.numpy(), p.grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=name)
    for name, b in theirs.named_buffers():
        np.testing.assert_allclose(ours.state_dict()[name].numpy(), b.numpy(), rtol=1e-6, atol=1e-7, err_msg=name)


@pytest.mark.cuda
@pytest.mark.skipif(not it.backend.cuda_available(), reason="needs cupy and an NVIDIA GPU")
def test_conv_and_pooling_on_cuda_match_cpu():
    rng = np.random.default_rng(10)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((2, 4, 9, 9), (6, 2, 3, 3), (6,)))

    def run(device):
        xt, wt, bt = (it.tensor(a, device=device, requires_grad=True) for a in (x, w, b))
        y = F.conv2d(xt, wt, bt, stride=2, padding=1, groups=2)
        y = F.max_pool2d(y, 2, ceil_mode=True) + F.avg_pool2d(y, 2, ceil_mode=True, count_include_pad=False)
        y = F.batch_norm(y, None, None, training=True)
        (y * y).sum().backward()
        return [y.numpy()] + [t.grad.numpy() for t in (xt, wt, bt)]

    for a, c in zip(run("cuda:0"), run("cpu")):
        np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-4)
