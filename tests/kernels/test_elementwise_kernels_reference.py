"""The layer norm forward (with and without a residual add) and GELU forward kernels' NumPy references on the CPU,
against the array path (layer norm: within one rounding of the dtype; GELU's tanh form: bit for bit, the same float32
operations in the same order) and torch; and the Ops' route to the kernels with the references standing in for them
(as if on a GPU): taken only when the candidate switch names them, the references' results bit for bit, and the
backward as before."""
import numpy as np
import pytest
import torch

import infini_train as it
import infini_train.nn.functional as F
from infini_train.kernels import gelu_forward, norm_forward, registry
from infini_train.kernels.reference import gelu_forward as gelu_ref
from infini_train.kernels.reference import norm_forward as norm_ref

DTYPES = ["float32", "bfloat16", "float16"]
ROUNDING = {"float32": 2e-6, "bfloat16": 2 ** -8, "float16": 2 ** -11}


def _x(dtype, shape=(6, 70, 768), offset=0.5, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) * 2 + offset).astype(getattr(it, dtype))


@pytest.mark.parametrize("affine", ["weight-bias", "weight", "none"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_reference_against_the_array_path_and_torch(dtype, affine):
    x = _x(dtype)
    rng = np.random.default_rng(1)
    params = [rng.standard_normal(768).astype(np.float32) for _ in range({"weight-bias": 2, "weight": 1,
                                                                          "none": 0}[affine])]
    weight, bias = (params + [None, None])[:2]
    out, mean, rstd = norm_ref.layer_norm(x, weight, bias, 768, 1e-5)
    want = F.layer_norm(it.tensor(x), (768,), *[it.tensor(p) for p in params]).numpy().astype(np.float64)
    scale = np.abs(want).max()
    assert np.abs(out.astype(np.float64) - want).max() <= 2 * ROUNDING[dtype] * scale
    assert mean.shape == rstd.shape == (420, 1) and mean.dtype == rstd.dtype == np.float32
    wide = torch.tensor(x.astype(np.float32))
    np.testing.assert_allclose(mean[:, 0], wide.mean(-1).reshape(-1).numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rstd[:, 0], torch.rsqrt(wide.var(-1, unbiased=False) + 1e-5).reshape(-1).numpy(),
                               rtol=1e-5)


def test_residual_add_then_layer_norm_is_the_rounded_sum_normalised():
    x, r = _x("bfloat16"), _x("bfloat16", seed=2)
    w, b = np.ones(768, it.bfloat16), np.zeros(768, it.bfloat16)
    total, out, mean, rstd = norm_ref.layer_norm(x, w, b, 768, 1e-5, residual=r)
    np.testing.assert_array_equal(total, (it.tensor(x) + it.tensor(r)).numpy())  # the array path's x + r
    for a, e in zip((out, mean, rstd), norm_ref.layer_norm(total, w, b, 768, 1e-5)):
        np.testing.assert_array_equal(a, e)


def test_layer_norm_sums_are_the_lanes_in_the_kernels_order():
    # one row of 4 float32 vectors of 4: lane l adds vector l's values in order; only lanes 0-3 hold any
    x = np.arange(1, 17, dtype=np.float32).reshape(1, 16) * np.float32(0.1)
    lanes = np.zeros(32, np.float32)
    for lane in range(4):
        for e in range(4):
            lanes[lane] += x[0, lane * 4 + e]
    _, mean, _ = norm_ref.layer_norm(x, None, None, 16, 1e-5)
    # the butterfly pairs lanes 16, 8, 4 apart first (adding zeros), then 2 apart, then 1
    want = np.float32(((lanes[0] + lanes[2]) + (lanes[1] + lanes[3]))) / np.float32(16)
    np.testing.assert_array_equal(mean[0, 0], want)


@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_reference_against_the_array_path_and_torch(dtype, approximate):
    x = _x(dtype, (64, 257), offset=0.0) * 3
    got = gelu_ref.forward(x, approximate)
    want = F.gelu(it.tensor(x), approximate=approximate).numpy()
    if approximate == "tanh":  # the same float32 operations in the same order as the array code
        np.testing.assert_array_equal(got, want)
    else:  # erfc against the array code's rational approximation: one rounding of the dtype
        assert np.abs(got.astype(np.float64) - want.astype(np.float64)).max() <= 2 * ROUNDING[dtype] * 9
    oracle = torch.nn.functional.gelu(torch.tensor(x.astype(np.float32)), approximate=approximate).numpy()
    assert np.abs(got.astype(np.float64) - oracle).max() <= 2 * ROUNDING[dtype] * 9


@pytest.fixture
def reference_kernels(monkeypatch):
    monkeypatch.setattr(norm_forward, "why_not",
                        lambda *a, **kw: None if registry.use(norm_forward.NAME) else "off")
    monkeypatch.setattr(norm_forward, "layer_norm", lambda cp, *a, **kw: norm_ref.layer_norm(*a, **kw))
    monkeypatch.setattr(gelu_forward, "why_not", lambda x: None if registry.use(gelu_forward.NAME) else "off")
    monkeypatch.setattr(gelu_forward, "forward", lambda cp, *a: gelu_ref.forward(*a))


def _run(fn, arrays, g):
    tensors = [it.tensor(a, requires_grad=True) for a in arrays]
    out = fn(*tensors)
    out.backward(it.tensor(g))
    return [out.numpy()] + [t.grad.numpy() for t in tensors]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_ops_take_the_kernels_only_with_the_switch(reference_kernels, dtype):
    x = _x(dtype, (4, 33, 256))
    w, b = (np.random.default_rng(3).standard_normal(256).astype(np.float32) for _ in range(2))
    g = _x(dtype, (4, 33, 256), seed=4)
    cases = [("layer_norm_forward", lambda t, wt, bt: F.layer_norm(t, (256,), wt, bt), [x, w, b],
              lambda: norm_ref.layer_norm(x, w, b, 256, 1e-5)[0]),
             ("gelu_forward", lambda t: F.gelu(t, approximate="tanh"), [x], lambda: gelu_ref.forward(x, "tanh")),
             ("gelu_forward", lambda t: F.gelu(t), [x], lambda: gelu_ref.forward(x, "none"))]
    for name, fn, arrays, reference in cases:
        with registry.selected("none"):
            want = _run(fn, arrays, g)
        with registry.selected(name):
            got = _run(fn, arrays, g)
        np.testing.assert_array_equal(got[0], reference())  # the kernel's output
        for a, e in zip(got[1:], want[1:]):  # the backward from the kernel's statistics / from x alone
            scale = np.abs(e.astype(np.float64)).max()
            assert np.abs(a.astype(np.float64) - e.astype(np.float64)).max() <= 4 * ROUNDING[dtype] * scale, name


def test_on_the_host_the_switch_changes_nothing():
    x = _x("bfloat16", (4, 33, 256))
    g = _x("bfloat16", (4, 33, 256), seed=4)
    results = []
    for spec in ("none", "candidate"):
        with registry.selected(spec):
            results.append(_run(lambda t: F.gelu(F.layer_norm(t, (256,)), approximate="tanh"), [x], g))
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)
