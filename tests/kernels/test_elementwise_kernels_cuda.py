"""The layer norm forward (and residual add + layer norm) and GELU forward kernels on a GPU (kernels/registry.py):
against their NumPy references (layer norm bit for bit; GELU within a few float32 ulps of 0.5 |x|, for tanhf and
erfcf) and through the Ops against the array path. Marked cuda: skipped without cupy and a GPU."""
import numpy as np
import pytest

import infini_train as it
import infini_train.nn.functional as F
from infini_train.kernels import gelu_forward, norm_forward, registry
from infini_train.kernels.reference import gelu_forward as gelu_ref
from infini_train.kernels.reference import norm_forward as norm_ref
from tests.autograd.test_low_precision import ulp

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not it.backend.cuda_available(), reason="needs cupy and an NVIDIA GPU")]
DTYPES = ["float32", "bfloat16", "float16"]


def _x(dtype, shape, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) * 2 + 0.5).astype(getattr(it, dtype))


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("x_dtype,w_dtype", [("float32", "float32"), ("bfloat16", "float32"),
                                             ("bfloat16", "bfloat16"), ("float16", "float16")])
def test_layer_norm_kernel_is_its_reference_bit_for_bit(x_dtype, w_dtype, residual):
    import cupy as cp

    x = _x(x_dtype, (8, 1024, 768))
    r = _x(x_dtype, x.shape, seed=1) if residual else None
    w, b = (_x(w_dtype, (768,), seed=s) for s in (2, 3))
    with registry.selected("layer_norm_forward"):
        args = [cp.asarray(a) for a in (x, w, b)]
        assert norm_forward.why_not(*args, 768, None if r is None else cp.asarray(r)) is None
        got = norm_forward.layer_norm(cp, *args, 768, 1e-5, None if r is None else cp.asarray(r))
    for a, e in zip(got, norm_ref.layer_norm(x, w, b, 768, 1e-5, r)):
        np.testing.assert_array_equal(a.get(), e)


@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_kernel_against_its_reference(dtype, approximate):
    import cupy as cp

    x = _x(dtype, (8 * 1024 * 3072 + 5,)) * 2  # a tail past the last whole vector
    with registry.selected("gelu_forward"):
        got = gelu_forward.forward(cp, cp.asarray(x), approximate).get()
    # the device's tanhf / erfcf and NumPy's differ in the last float32 bit; 0.5 x (1 + tanh(u)) cancels for
    # negative x, so that bit is an ulp of 0.5 |x|, not of the result; the result's dtype rounds once more
    want = gelu_ref.forward(x, approximate).astype(np.float64)
    allowed = 4 * ulp(0.5 * np.abs(x.astype(np.float64)), "float32") + (ulp(want, dtype) if dtype != "float32" else 0)
    excess = np.abs(got.astype(np.float64) - want) - allowed
    assert not (excess > 0).any(), (f"gelu {approximate}: {np.count_nonzero(excess > 0)} elements beyond the bound; "
                                    f"worst at x = {x[np.argmax(excess)]}: {got[np.argmax(excess)]} vs "
                                    f"{want[np.argmax(excess)]}")


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_ops_with_the_kernels_against_the_array_path(dtype):
    x = _x(dtype, (4, 257, 768))
    w, b = (_x("float32", (768,), seed=s) for s in (2, 3))
    g = _x(dtype, x.shape, seed=4)
    results = []
    for spec in ("layer_norm_forward,gelu_forward", "none"):
        with registry.selected(spec):
            tensors = [it.tensor(a, device="cuda:0", requires_grad=True) for a in (x, w, b)]
            out = F.gelu(F.layer_norm(tensors[0], (768,), tensors[1], tensors[2]), approximate="tanh")
            out.backward(it.tensor(g, device="cuda:0"))
            results.append([out.numpy()] + [t.grad.numpy() for t in tensors])
    rounding = 2e-6 if dtype == "float32" else 2 ** -8
    for k, (a, e) in enumerate(zip(*results)):
        e = e.astype(np.float64)
        assert np.abs(a.astype(np.float64) - e).max() <= 4 * rounding * np.abs(e).max(), k
