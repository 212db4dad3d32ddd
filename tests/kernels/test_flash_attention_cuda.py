"""The tensor-core attention kernels on a GPU (kernels/registry.py): against their NumPy reference
(kernels/reference/flash_attention.py, the same tiles and order), and through the Op against the array path. Marked
cuda: skipped without cupy and a GPU.

The reference cannot pin down the additions inside a tensor-core instruction or expf / logf, and a float32 sum that
differs in its last bit can round the probabilities (or dS) to the neighbouring bf16 / fp16 value before the next
product: a few elements of a sum that cancels then differ by a tenth of an ulp of the tensor's largest values (seen
on an H200: 1 to 20 elements of a million). Hence 4 ulps at a tenth of the largest magnitude, element by element;
the log-sum-exp, where a wrong mask or index would show, is held to float32 rounding."""
import numpy as np
import pytest

import infini_train as it
import infini_train.nn.functional as F
from infini_train.kernels import flash_attention as flash
from infini_train.kernels import registry
from infini_train.kernels.reference import flash_attention as ref
from tests.autograd.test_low_precision import assert_ulps
from tests.kernels.attention_inputs import attention_inputs

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not it.backend.cuda_available(), reason="needs cupy and an NVIDIA GPU")]
CASES = {  # name -> (B, H, Hkv, Tq, Tk, D, causal, window, dropout_p)
    "gpt2-causal": (1, 12, 12, 1024, 1024, 64, True, 0, 0.0),
    "not-causal-ragged": (2, 4, 4, 150, 130, 64, False, 0, 0.0),
    "gqa-d128": (2, 8, 2, 200, 200, 128, True, 0, 0.0),
    "window": (1, 4, 4, 300, 300, 64, True, 70, 0.0),
    "dropout-gqa": (2, 4, 2, 130, 130, 64, True, 0, 0.2),
    "tq-lt-tk": (1, 2, 1, 70, 190, 128, False, 0, 0.0),
}


def run_kernel(q, k, v, g, causal, window, seed, dropout_p):
    """(out, dq, dk, dv, lse) from the kernels, as host arrays."""
    import cupy as cp

    qc, kc, vc, gc = (cp.asarray(a) for a in (q, k, v, g))
    scale = 1.0 / np.sqrt(q.shape[-1])
    with registry.selected("flash_attention"):
        assert flash.why_not(qc, kc, vc, dropout_p, window, causal) is None
        out, lse = flash.forward(cp, qc, kc, vc, scale, causal, window, seed, dropout_p)
        grads = flash.backward(cp, qc, kc, vc, out, lse, gc, scale, causal, window, seed, dropout_p)
    return [a.get() for a in (out, *grads, lse)]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_kernels_give_their_reference(case, dtype):
    b, h, hkv, tq, tk, d, causal, window, p = CASES[case]
    q, k, v, g = attention_inputs(getattr(it, dtype), b, h, hkv, tq, tk, d)
    seed = 12345 if p else None
    *got, got_lse = run_kernel(q, k, v, g, causal, window, seed, p)
    scale = 1.0 / np.sqrt(d)
    out, lse = ref.forward(q, k, v, scale, causal, window, seed, p)
    want = [out, *ref.backward(q, k, v, out, lse, g, scale, causal, window, seed, p)]
    for name, a, w in zip(("out", "dq", "dk", "dv"), got, want):
        w64 = w.astype(np.float64)
        assert_ulps(a, w64, dtype, ulps=4, floor=0.1 * np.abs(w64).max(), what=f"{case} {name}")
    assert (np.isposinf(got_lse) == np.isposinf(lse)).all()
    finite = np.isfinite(lse)
    np.testing.assert_allclose(got_lse[finite], lse[finite], rtol=1e-5, atol=1e-5)


def test_strided_rows_give_the_contiguous_results():
    import cupy as cp

    q, k, v, g = attention_inputs(it.bfloat16, 2, 4, 4, 96, 96, 64)
    scale = 0.125
    with registry.selected("flash_attention"):
        flat = flash.forward(cp, *(cp.asarray(a) for a in (q, k, v)), scale, True)
        # (B, T, H, D) memory seen as (B, H, T, D), as the models' q.view(B, T, H, D).transpose(1, 2)
        strided = [cp.ascontiguousarray(cp.asarray(a).transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3) for a in (q, k, v)]
        assert flash.why_not(*strided) is None and not strided[0].flags.c_contiguous
        again = flash.forward(cp, *strided, scale, True)
    for a, b in zip(flat, again):
        np.testing.assert_array_equal(a.get(), b.get())


@pytest.mark.parametrize("dropout_p", [0.0, 0.1])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_op_with_the_kernels_against_the_array_path(dtype, dropout_p):
    from infini_train.autograd.ops.fused_attention import FusedAttention

    q, k, v, g = attention_inputs(getattr(it, dtype), 2, 6, 2, 257, 257, 64)
    results = []
    for spec in ("flash_attention", "none"):
        with registry.selected(spec):
            tensors = [it.tensor(a, device="cuda:0", requires_grad=True) for a in (q, k, v)]
            it.manual_seed(7)
            out = F.scaled_dot_product_attention(*tensors, is_causal=True, dropout_p=dropout_p, enable_gqa=True)
            assert (type(out.grad_fn) is FusedAttention and out.grad_fn.fused) == (spec != "none")
            out.backward(it.tensor(g, device="cuda:0"))
            results.append([out.numpy()] + [t.grad.numpy() for t in tensors])
    tol = 1.2e-2 if dtype == "bfloat16" else 2e-3
    for a, b in zip(*results):
        b = b.astype(np.float64)
        assert np.abs(a.astype(np.float64) - b).max() <= tol * np.abs(b).max()
