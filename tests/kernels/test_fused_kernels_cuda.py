"""The fused CUDA kernels against the array code they replace, on the GPU: the backward of GELU and of layer norm,
attention's row softmax (forward and backward) and the Adam/AdamW update. Marked cuda: skipped without cupy and a
GPU."""
import contextlib

import numpy as np
import pytest

import infini_train as it
import infini_train.nn.functional as F
from infini_train import kernels
from infini_train.kernels import cuda_source
from tests.autograd.test_low_precision import assert_ulps

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not it.backend.cuda_available(), reason="needs cupy and an NVIDIA GPU")]
DTYPES = ["float32", "bfloat16", "float16"]


@contextlib.contextmanager
def fused(on):
    previous = kernels.set_enabled(on)
    try:
        yield
    finally:
        kernels.set_enabled(previous)


def run_both(fn, arrays, grad_dtypes=None):
    """fn's outputs and the inputs' gradients (as float64 numpy), with the kernels and with the array code."""
    results = []
    for on in (True, False):
        with fused(on):
            inputs = [it.tensor(a, device="cuda:0", requires_grad=a.dtype.kind in "fV") for a in arrays]
            out = fn(*inputs)
            rng = np.random.default_rng(5)
            out.backward(it.tensor(rng.standard_normal(out.shape).astype(out.dtype), device="cuda:0"))
            results.append([out.numpy().astype(np.float64)] + [t.grad.numpy().astype(np.float64)
                                                               for t in inputs if t.requires_grad])
    return results


def assert_close(got, want, dtype, what):
    for k, (a, b) in enumerate(zip(got, want)):
        if dtype == "float32":
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6, err_msg=f"{what}[{k}]")
        else:
            assert_ulps(a, b, dtype, ulps=1, floor=1e-2, what=f"{what}[{k}]")


@pytest.mark.parametrize("family,roles", [("gelu", dict(X="bfloat16", G="bfloat16")), ("adam", {}),
                                          ("layer_norm", dict(X="float32", W="float32", G="float32")),
                                          ("softmax", dict(S="float16"))])
def test_the_kernels_compile_on_this_gpu(family, roles):
    assert cuda_source.function(family, {"gelu": "gelu_backward", "adam": "adam_step",
                                         "layer_norm": "layer_norm_backward_input", "softmax": "softmax_rows"}[family],
                                **roles) is not None


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu(dtype, approximate):
    x = (np.random.default_rng(0).standard_normal((64, 257)) * 3).astype(getattr(it, dtype))
    got, want = run_both(lambda t: F.gelu(t, approximate=approximate), [x])
    assert_close(got, want, dtype, f"gelu {approximate}")


@pytest.mark.parametrize("affine", ["weight-bias", "weight", "none"])
@pytest.mark.parametrize("x_dtype,w_dtype", [("float32", "float32"), ("bfloat16", "float32"),
                                             ("float16", "float16"), ("bfloat16", "bfloat16")])
def test_layer_norm(x_dtype, w_dtype, affine):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((6, 70, 768)) * 2 + 0.5).astype(getattr(it, x_dtype))
    params = [rng.standard_normal(768).astype(getattr(it, w_dtype)) for _ in range({"weight-bias": 2, "weight": 1,
                                                                                   "none": 0}[affine])]
    got, want = run_both(lambda t, *p: F.layer_norm(t, (768,), *p), [x, *params])
    # the weight's and bias's gradients sum 420 rows in another order: float32 rounding, then one rounding
    assert_close(got[:2], want[:2], x_dtype, "layer_norm output and input gradient")
    for a, b in zip(got[2:], want[2:]):
        np.testing.assert_allclose(a, b, rtol=1e-4 if w_dtype == "float32" else 1e-2, atol=1e-4)


@pytest.mark.parametrize("causal,tokens", [(True, 300), (True, 64), (False, 96)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_attention_softmax(dtype, causal, tokens):
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((2, 3, tokens, 32)).astype(getattr(it, dtype)) for _ in range(3))
    got, want = run_both(lambda *t: F.scaled_dot_product_attention(*t, is_causal=causal), [q, k, v])
    if dtype == "float32":
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    else:  # bfloat16 q @ k^T rounds alike; the probabilities differ in float32 rounding before v's product
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("optimizer,kwargs", [("AdamW", dict(weight_decay=0.1)), ("Adam", dict(weight_decay=0.05)),
                                              ("AdamW", dict(betas=(0.3, 0.999), weight_decay=0.0))])
def test_adam_update_is_the_array_codes_bit_for_bit(optimizer, kwargs):
    rng = np.random.default_rng(3)
    start = [rng.standard_normal(s).astype(np.float32) for s in ((300, 70), (70,), (5, 5, 5))]
    grads = [[rng.standard_normal(a.shape).astype(np.float32) for a in start] for _ in range(3)]
    finals = []
    for on in (True, False):
        with fused(on):
            params = [it.tensor(a, device="cuda:0", requires_grad=True) for a in start]
            opt = getattr(it.optim, optimizer)(params, lr=1e-2, **kwargs)
            for step in grads:
                for p, g in zip(params, step):
                    p.grad = it.tensor(g, device="cuda:0")
                opt.step()
            states = [opt.state[p][key] for p in params for key in ("exp_avg", "exp_avg_sq")]
            finals.append([p.numpy() for p in params] + [it.backend.to_device_array(a, it.backend.CPU) for a in states])
    for a, b in zip(*finals):
        np.testing.assert_array_equal(a, b)
