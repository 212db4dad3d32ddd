"""rms_norm and nn.RMSNorm against torch 2.13: forward and gradients in float32/float64 (and float64 finite
differences), float16/bfloat16 inputs with float32 or low-precision weights (torch's dtype rules: the output
has the input's dtype), eps=None, double backward, the errors, and the module's parameters, repr and
state_dict."""
import warnings

import numpy as np
import pytest
import torch

import infini_train as it
from infini_train.autograd.ops.rms_norm import RMSNorm as RMSNormOp
from tests.autograd.test_low_precision import (LOW, assert_all_ulps, assert_ulps, cotangent_for, float32_reference,
                                               normal, outputs_and_grads)
from tests.op_check import check_finite_differences, check_op

F = it.nn.functional
TF = torch.nn.functional


def quiet_rms_norm(*args, **kwargs):
    """torch's rms_norm without its (once per process) warning about a weight whose dtype is not the input's."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.nn.functional.rms_norm(*args, **kwargs)


SHAPES = [((4, 8), (8,)), ((2, 3, 6), (6,)), ((2, 3, 4), (3, 4)), ((5,), (5,)), ((2, 2, 3, 2), (2, 3, 2))]


@pytest.mark.parametrize("eps", [None, 1e-5])
@pytest.mark.parametrize("shape,ns", SHAPES, ids=str)
def test_rms_norm_with_weight_float32_vs_torch_and_float64_finite_differences(shape, ns, eps):
    check_op([shape, ns], lambda x, w: F.rms_norm(x, ns, w, eps=eps), lambda x, w: TF.rms_norm(x, ns, w, eps=eps))


@pytest.mark.parametrize("eps", [None, 1e-2])
@pytest.mark.parametrize("shape,ns", SHAPES, ids=str)
def test_rms_norm_without_weight(shape, ns, eps):
    check_op([shape], lambda x: F.rms_norm(x, ns, eps=eps), lambda x: TF.rms_norm(x, ns, eps=eps))


def test_rms_norm_normalized_shape_as_int_list_or_tuple():
    check_op([(3, 7), (7,)], lambda x, w: F.rms_norm(x, 7, w), lambda x, w: TF.rms_norm(x, (7,), w))
    check_op([(3, 7), (7,)], lambda x, w: F.rms_norm(x, [7], w), lambda x, w: TF.rms_norm(x, [7], w))


def test_rms_norm_gradient_subsets_and_non_contiguous_input():
    x = np.random.default_rng(3).standard_normal((4, 6)).astype(np.float32)
    check_op([x, (6,)], lambda x, w: F.rms_norm(x, 6, w), lambda x, w: TF.rms_norm(x, (6,), w),
             grad_mask=[False, True])
    check_op([x, (6,)], lambda x, w: F.rms_norm(x, 6, w), lambda x, w: TF.rms_norm(x, (6,), w),
             grad_mask=[True, False])
    check_op([(6, 5), (6,)], lambda x, w: F.rms_norm(x.transpose(0, 1), 6, w),
             lambda x, w: TF.rms_norm(x.t(), (6,), w))


@pytest.mark.parametrize("with_weight", [True, False])
def test_rms_norm_float64_matches_torch_float64(with_weight):
    rng = np.random.default_rng(4)
    x, w, cot = rng.standard_normal((3, 5, 16)), rng.standard_normal(16), rng.standard_normal((3, 5, 16))
    xi, wi = it.tensor(x, requires_grad=True), it.tensor(w, requires_grad=True)
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    yi = F.rms_norm(xi, 16, wi if with_weight else None)
    yt = TF.rms_norm(xt, (16,), wt if with_weight else None)
    assert yi.dtype == it.float64
    np.testing.assert_allclose(yi.numpy(), yt.detach().numpy(), rtol=1e-14, atol=1e-14)
    yi.backward(it.tensor(cot))
    yt.backward(torch.tensor(cot))
    np.testing.assert_allclose(xi.grad.numpy(), xt.grad.numpy(), rtol=1e-13, atol=1e-14)
    if with_weight:
        np.testing.assert_allclose(wi.grad.numpy(), wt.grad.numpy(), rtol=1e-13, atol=1e-14)


def test_rms_norm_float64_finite_differences_with_small_eps_and_large_rows():
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal((3, 40)) * 1e-2, 1 + 0.1 * rng.standard_normal(40)]
    check_finite_differences(lambda x, w: F.rms_norm(x, 40, w, eps=1e-6), arrays, [True, True], tol=1e-6)


# ----------------------------------------------------------------------------------------------- eps
@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16"])
def test_eps_none_is_the_computation_dtypes_epsilon_as_in_torch(dtype):
    # rows of 1e-4: mean(x^2) = 1e-8 is of the order of float32's epsilon (1.2e-7), so eps decides the result;
    # torch takes float32's epsilon for float16/bfloat16/float32 inputs (not bfloat16's 2^-7), float64's for
    # float64 ones
    x = np.full((2, 4), 1e-4, np.float32)
    ours = F.rms_norm(it.tensor(x).to(dtype), 4).float().numpy()
    theirs = TF.rms_norm(torch.tensor(x).to(getattr(torch, dtype)), (4,)).float().numpy()
    np.testing.assert_array_equal(ours, theirs)
    expected = 1e-4 / np.sqrt(1e-8 + np.finfo(np.float64 if dtype == "float64" else np.float32).eps)
    np.testing.assert_allclose(ours, expected, rtol=1e-2 if dtype in LOW else 1e-6)
    assert (ours < 0.3).all() if dtype != "float64" else (ours > 0.99).all()


def test_an_explicit_eps_is_used_as_given():
    x = np.full((1, 3), 0.5, np.float32)
    np.testing.assert_allclose(F.rms_norm(it.tensor(x), 3, eps=0.75).numpy(), 0.5, rtol=1e-6)
    np.testing.assert_allclose(F.rms_norm(it.tensor(x), 3, eps=0).numpy(), 1.0, rtol=1e-6)


# ------------------------------------------------------------------------------------- low precision
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("params", ["float32", "same", "none"])
def test_rms_norm_low_precision_input_with_float32_low_or_no_weight(params, dtype):
    # torch computes in float32 (x upcast, x-hat times the weight there) and rounds once to the input's dtype;
    # a float32 weight next to a bfloat16 input leaves the output bfloat16
    rng = np.random.default_rng(10)
    param_dtype = np.float32 if params == "float32" else dtype
    arrays = [normal(rng, (64, 96), dtype, 2.0)]
    if params != "none":
        arrays.append(1 + normal(rng, (96,), param_dtype, 0.2))

    def ours(x, w=None):
        return F.rms_norm(x, 96, w)

    def theirs(x, w=None):
        return quiet_rms_norm(x, (96,), w)

    cotangent = cotangent_for(ours, arrays, normal, seed=11)
    got, our_dtype = outputs_and_grads(it, ours, arrays, cotangent)
    assert our_dtype == dtype
    assert [g.dtype for g in got] == [np.dtype(dtype)] * 2 + [np.dtype(param_dtype)] * (params != "none")
    wide = float32_reference(theirs, arrays, cotangent, np.float32)
    for k, (a, b) in enumerate(zip(got, wide)):
        if a.dtype == np.float32:  # a float32 weight gradient: a float32 sum over 64 rows
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(b).max())
        else:
            assert_ulps(a, b.astype(a.dtype), dtype, ulps=1, what=f"result {k}")
    theirs_low, their_dtype = outputs_and_grads(torch, theirs, arrays, cotangent)
    assert their_dtype == dtype
    assert_all_ulps(got[:1], theirs_low[:1], dtype, ulps=1)
    assert_all_ulps(got[1:], theirs_low[1:], dtype, ulps=1, floor_fraction=1.0)


@pytest.mark.parametrize("x_dtype", ["float32", "float64", "bfloat16", "float16"])
@pytest.mark.parametrize("w_dtype", ["float32", "float64", "bfloat16", "float16"])
def test_output_has_the_inputs_dtype_and_each_gradient_its_tensors(x_dtype, w_dtype):
    rng = np.random.default_rng(12)
    x, w = rng.standard_normal((3, 8)), 1 + 0.1 * rng.standard_normal(8)
    xi, wi = it.tensor(x).to(x_dtype).requires_grad_(True), it.tensor(w).to(w_dtype).requires_grad_(True)
    xt = torch.tensor(x).to(getattr(torch, x_dtype)).requires_grad_(True)
    wt = torch.tensor(w).to(getattr(torch, w_dtype)).requires_grad_(True)
    yt = quiet_rms_norm(xt, (8,), wt)
    yi = F.rms_norm(xi, 8, wi)
    assert str(yi.dtype) == x_dtype == str(yt.dtype).replace("torch.", "")
    tol = 1e-2 if "float16" in (x_dtype + w_dtype) else 1e-6
    np.testing.assert_allclose(yi.float().numpy(), yt.detach().float().numpy(), rtol=tol, atol=tol)
    yi.sum().backward()
    yt.sum().backward()
    assert str(xi.grad.dtype) == x_dtype and str(wi.grad.dtype) == w_dtype
    np.testing.assert_allclose(wi.grad.float().numpy(), wt.grad.float().numpy(), rtol=tol, atol=tol)
    np.testing.assert_allclose(xi.grad.float().numpy(), xt.grad.float().numpy(), rtol=tol, atol=tol)


def test_float32_input_with_float64_weight_multiplies_in_float64_like_torch():
    rng = np.random.default_rng(13)
    x, w = rng.standard_normal((5, 32)).astype(np.float32), rng.standard_normal(32)
    ours = F.rms_norm(it.tensor(x), 32, it.tensor(w)).numpy()
    theirs = quiet_rms_norm(torch.tensor(x), (32,), torch.tensor(w)).numpy()
    assert ours.dtype == np.float32
    np.testing.assert_allclose(ours, theirs, rtol=2e-7, atol=0)


# ----------------------------------------------------------------------------------- double backward
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("with_weight", [True, False])
def test_double_backward_matches_torch(dtype, with_weight):
    rng = np.random.default_rng(14)
    x, w = rng.standard_normal((3, 4, 10)), 1 + 0.3 * rng.standard_normal(10)
    cot, v = rng.standard_normal((3, 4, 10)), rng.standard_normal((3, 4, 10))

    def run(m):
        xs = m.tensor(x, dtype=getattr(m, dtype), requires_grad=True)
        ws = m.tensor(w, dtype=getattr(m, dtype), requires_grad=True)
        y = m.nn.functional.rms_norm(xs, (10,), ws if with_weight else None, eps=1e-5)
        inputs = (xs, ws) if with_weight else (xs,)
        first = m.autograd.grad((y * m.tensor(cot, dtype=getattr(m, dtype))).sum(), inputs, create_graph=True)
        probe = (first[0] * m.tensor(v, dtype=getattr(m, dtype))).sum()
        if with_weight:
            probe = probe + (first[1] * first[1]).sum()
        second = m.autograd.grad(probe, inputs)
        return [t.detach().numpy() for t in first + second]

    tol = 1e-12 if dtype == "float64" else 2e-5
    for a, b in zip(run(it), run(torch)):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def test_double_backward_float64_finite_differences_of_the_gradient():
    # d/dx of <grad_x rms_norm(x) . cot, v>, checked by central differences of the first-order gradient
    rng = np.random.default_rng(15)
    x, w, cot, v = (rng.standard_normal((2, 6)), 1 + 0.3 * rng.standard_normal(6), rng.standard_normal((2, 6)),
                    rng.standard_normal((2, 6)))

    def first(x_values):
        xs = it.tensor(x_values, requires_grad=True)
        (g,) = it.autograd.grad((F.rms_norm(xs, 6, it.tensor(w)) * it.tensor(cot)).sum(), xs, create_graph=True)
        return xs, g

    xs, g = first(x)
    (hv,) = it.autograd.grad((g * it.tensor(v)).sum(), xs)
    eps = 1e-6
    numeric = np.zeros_like(x)
    for j in range(x.size):
        d = np.zeros_like(x)
        d.flat[j] = eps
        numeric.flat[j] = (((first(x + d)[1].numpy() - first(x - d)[1].numpy()) * v).sum()) / (2 * eps)
    np.testing.assert_allclose(hv.numpy(), numeric, rtol=1e-6, atol=1e-7)


def test_double_backward_of_a_bfloat16_input_runs_in_float32_and_keeps_dtypes():
    rng = np.random.default_rng(16)
    x = it.tensor(rng.standard_normal((4, 16)).astype(np.float32)).to("bfloat16").requires_grad_(True)
    w = it.tensor(1 + 0.1 * rng.standard_normal(16).astype(np.float32), requires_grad=True)
    (gx,) = it.autograd.grad((F.rms_norm(x, 16, w) ** 2).sum(), x, create_graph=True)
    assert gx.dtype == it.bfloat16 and gx.grad_fn is not None
    gx.float().sum().backward()
    assert x.grad.dtype == it.bfloat16 and w.grad.dtype == it.float32
    xt = torch.tensor(x.float().numpy(), requires_grad=True)
    wt = torch.tensor(w.numpy(), requires_grad=True)
    (gt,) = torch.autograd.grad((TF.rms_norm(xt, (16,), wt) ** 2).sum(), xt, create_graph=True)
    gt.sum().backward()
    for ours, theirs in ((x.grad.float(), xt.grad), (w.grad, wt.grad)):
        scale = theirs.abs().max().item()
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=3e-2, atol=3e-2 * scale)


# ------------------------------------------------------------------------------------------ edge cases
def test_empty_batch_and_statistics_kept():
    check_op([(0, 4), (4,)], lambda x, w: F.rms_norm(x, 4, w), lambda x, w: TF.rms_norm(x, (4,), w))
    x = it.randn(4, 8, requires_grad=True)
    (rstd,) = F.rms_norm(x, 8).grad_fn.stashed
    assert rstd.shape == (4, 1) and rstd.dtype == np.float32
    assert isinstance(F.rms_norm(x, 8).grad_fn, RMSNormOp)


def test_shape_and_dtype_errors():
    with pytest.raises(ValueError, match=r"rms_norm: expected input whose trailing dims are normalized_shape=\(4,\), "
                                         r"got input of shape \(2, 3\)\nHINT: normalized_shape names the last dims"):
        F.rms_norm(it.ones(2, 3), 4)
    with pytest.raises(ValueError, match=r"rms_norm: expected input whose trailing .* got input of shape \(3,\)"):
        F.rms_norm(it.ones(3), (2, 3))
    with pytest.raises(ValueError, match=r"rms_norm: expected weight of shape \(3,\) \(= normalized_shape\), "
                                         r"got weight of shape \(4,\)"):
        F.rms_norm(it.ones(2, 3), 3, it.ones(4))
    with pytest.raises(ValueError, match=r"rms_norm: expected weight of shape \(2, 3\) .* got weight of shape \(3,\)"):
        F.rms_norm(it.ones(2, 3), (2, 3), it.ones(3))
    with pytest.raises(ValueError, match="rms_norm: expected a normalized_shape with at least one dim, got "
                                         r"normalized_shape=\(\)"):
        F.rms_norm(it.ones(2, 3), ())
    with pytest.raises(ValueError, match="(?s)rms_norm: expected a floating-point input, got input of dtype int64"
                                         ".*HINT"):
        F.rms_norm(it.tensor(np.ones((2, 3), np.int64)), 3)
    # torch refuses the same inputs
    with pytest.raises(RuntimeError, match="expected input with shape"):
        TF.rms_norm(torch.ones(2, 3), (4,))
    with pytest.raises(RuntimeError, match="Expected weight to be of same shape as normalized_shape"):
        TF.rms_norm(torch.ones(2, 3), (3,), torch.ones(4))


# ------------------------------------------------------------------------------------------ the module
@pytest.mark.parametrize("kw", [{}, {"eps": 1e-6}, {"elementwise_affine": False}])
@pytest.mark.parametrize("normalized_shape", [8, (2, 8)], ids=str)
def test_rms_norm_module_matches_torch(normalized_shape, kw):
    ours, theirs = it.nn.RMSNorm(normalized_shape, **kw), torch.nn.RMSNorm(normalized_shape, **kw)
    assert repr(ours) == repr(theirs)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert ours.normalized_shape == theirs.normalized_shape and ours.eps == theirs.eps
    if theirs.weight is not None:
        np.testing.assert_array_equal(ours.weight.numpy(), theirs.weight.detach().numpy())  # ones
        assert ours.weight.requires_grad and ours.weight.dtype == it.float32
        w = np.random.default_rng(17).standard_normal(ours.weight.shape).astype(np.float32)
        ours.load_state_dict({"weight": w})
        theirs.load_state_dict({"weight": torch.tensor(w)})
    else:
        assert ours.weight is None
    x = np.random.default_rng(18).standard_normal((3, 2, 8)).astype(np.float32) * 2 + 0.5
    xi, xt = it.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    yi, yt = ours(xi), theirs(xt)
    np.testing.assert_allclose(yi.numpy(), yt.detach().numpy(), rtol=1e-5, atol=1e-6)
    cot = np.random.default_rng(19).standard_normal(x.shape).astype(np.float32)
    yi.backward(it.tensor(cot))
    yt.backward(torch.tensor(cot))
    np.testing.assert_allclose(xi.grad.numpy(), xt.grad.numpy(), rtol=1e-5, atol=1e-6)
    if theirs.weight is not None:
        np.testing.assert_allclose(ours.weight.grad.numpy(), theirs.weight.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_rms_norm_module_dtype_and_reset():
    m = it.nn.RMSNorm(4, dtype="bfloat16")
    assert m.weight.dtype == it.bfloat16 and m.weight.shape == (4,)
    m.weight.array[:] = 3
    m.reset_parameters()
    np.testing.assert_array_equal(m.weight.float().numpy(), np.ones(4, np.float32))
    assert "RMSNorm" in it.nn.__all__ and it.nn.RMSNorm is it.nn.layers.RMSNorm


@pytest.mark.cuda
@pytest.mark.skipif(not it.backend.cuda_available(), reason="needs cupy and an NVIDIA GPU")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_rms_norm_on_cuda_matches_cpu(dtype):
    rng = np.random.default_rng(20)
    x, w, cot = rng.standard_normal((4, 3, 64)), 1 + 0.1 * rng.standard_normal(64), rng.standard_normal((4, 3, 64))
    results = []
    for device in ("cpu", "cuda:0"):
        xs = it.tensor(x.astype(np.float32), device=device).to(dtype).requires_grad_(True)
        ws = it.tensor(w.astype(np.float32), device=device).requires_grad_(True)
        y = F.rms_norm(xs, 64, ws)
        y.backward(it.tensor(cot.astype(np.float32), device=device).to(dtype))
        results.append([t.float().numpy() for t in (y, xs.grad, ws.grad)])
    tol = 1e-5 if dtype == "float32" else 1e-2
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)
