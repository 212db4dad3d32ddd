"""The memory-efficient attention path (flash_attention.py) against the materialised path and torch's SDPA: values
and every gradient over causal / non-causal attention, bool / float / broadcast masks, fully masked rows, GQA, odd
lengths and lengths that are not a multiple of the block; float64 finite differences; the same dropout mask as the
materialised path; float32 accumulation under autocast; O(T) memory at T = 4096; the path choice."""
import tracemalloc

import numpy as np
import pytest
import torch

import infini_train as it
from infini_train.autograd.ops import attention as attention_module
from infini_train.autograd.ops import flash_attention
from infini_train.nn.attention import SDPBackend, sdpa_kernel
from tests.op_check import check_finite_differences

F = torch.nn.functional


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(flash_attention.BlockedAttention, "block", 16)


def _inputs(rng, dtype, T, S, heads=4, kv_heads=4, E=8, Ev=6, batch=2):
    return (rng.standard_normal((batch, heads, T, E)).astype(dtype),
            rng.standard_normal((batch, kv_heads, S, E)).astype(dtype),
            rng.standard_normal((batch, kv_heads, S, Ev)).astype(dtype),
            rng.standard_normal((batch, heads, T, Ev)).astype(dtype))


def _ours(backend, arrays, cot, mask=None, mask_grad=False, **kw):
    tensors = [it.tensor(a, requires_grad=True) for a in arrays]
    m = None if mask is None else it.tensor(mask, requires_grad=mask_grad)
    it.manual_seed(11)
    with sdpa_kernel(backend):
        out = it.nn.functional.scaled_dot_product_attention(*tensors, attn_mask=m, **kw)
    out.backward(it.tensor(cot))
    grads = [t.grad.numpy() for t in tensors] + ([m.grad.numpy()] if mask_grad else [])
    return out.numpy(), grads


CASES = {
    "plain": dict(T=37, S=45),
    "causal": dict(T=45, S=45, is_causal=True),
    "causal_tq<tk": dict(T=21, S=53, is_causal=True),
    "causal_tq>tk": dict(T=53, S=21, is_causal=True),
    "gqa_causal": dict(T=40, S=40, kv_heads=2, is_causal=True, enable_gqa=True),
    "one_block": dict(T=5, S=7),
    "scale": dict(T=33, S=17, scale=0.3),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_blocked_equals_materialised_and_torch(case, small_blocks):
    spec = dict(CASES[case])
    shape = {k: spec.pop(k) for k in ("T", "S", "kv_heads") if k in spec}
    q, k, v, cot = _inputs(np.random.default_rng(0), np.float32, shape["T"], shape["S"],
                           kv_heads=shape.get("kv_heads", 4))
    out_b, grads_b = _ours(SDPBackend.FLASH_ATTENTION, (q, k, v), cot, **spec)
    out_m, grads_m = _ours(SDPBackend.MATH, (q, k, v), cot, **spec)
    tq = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    ref = F.scaled_dot_product_attention(*tq, **spec)
    ref.backward(torch.tensor(cot))
    np.testing.assert_allclose(out_b, out_m, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out_b, ref.detach().numpy(), rtol=1e-5, atol=1e-5)
    for got, mat, t in zip(grads_b, grads_m, tq):
        np.testing.assert_allclose(got, mat, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mask_kind", ["float", "float_broadcast_rows", "bool_with_empty_row"])
def test_masks_and_their_gradient(mask_kind, small_blocks):
    rng = np.random.default_rng(1)
    q, k, v, cot = _inputs(rng, np.float64, 35, 41)
    if mask_kind == "float":
        mask, grad = rng.standard_normal((1, 4, 35, 41)), True
    elif mask_kind == "float_broadcast_rows":
        mask, grad = rng.standard_normal((35, 1)), True
    else:
        mask, grad = rng.random((35, 41)) > 0.4, False
        mask[7] = False  # a query that sees no key: zeros, as torch's safe softmax
    out_b, grads_b = _ours(SDPBackend.FLASH_ATTENTION, (q, k, v), cot, mask=mask, mask_grad=grad)
    out_m, grads_m = _ours(SDPBackend.MATH, (q, k, v), cot, mask=mask, mask_grad=grad)
    np.testing.assert_allclose(out_b, out_m, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads_b, grads_m):
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-12)
    ref = F.scaled_dot_product_attention(*(torch.tensor(a) for a in (q, k, v)), attn_mask=torch.tensor(mask))
    np.testing.assert_allclose(out_b, ref.numpy(), rtol=1e-12, atol=1e-12)
    if mask_kind == "bool_with_empty_row":
        assert not out_b[:, :, 7].any()


def test_float64_finite_differences(small_blocks):
    rng = np.random.default_rng(2)
    arrays = [rng.standard_normal(s) for s in [(1, 2, 19, 3), (1, 2, 23, 3), (1, 2, 23, 2), (19, 23)]]

    def fn(q, k, v, mask):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return it.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    check_finite_differences(fn, arrays, [True, True, True, True], tol=1e-6)

    def causal(q, k, v):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return it.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    check_finite_differences(causal, arrays[:3], [True, True, True], tol=1e-6)


def test_dropout_drops_the_materialised_paths_positions_whatever_the_block(monkeypatch):
    rng = np.random.default_rng(3)
    q, k, v, cot = _inputs(rng, np.float64, 50, 50, kv_heads=2)
    results = []
    for backend, block in ((SDPBackend.MATH, None), (SDPBackend.FLASH_ATTENTION, 16), (SDPBackend.FLASH_ATTENTION, 7)):
        if block:
            monkeypatch.setattr(flash_attention.BlockedAttention, "block", block)
        results.append(_ours(backend, (q, k, v), cot, dropout_p=0.3, is_causal=True, enable_gqa=True))
    for out, grads in results[1:]:
        np.testing.assert_allclose(out, results[0][0], rtol=1e-12, atol=1e-12)
        for got, want in zip(grads, results[0][1]):
            np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-12)
    undropped = _ours(SDPBackend.MATH, (q, k, v), cot, is_causal=True, enable_gqa=True)[0]
    assert np.abs(results[0][0] - undropped).max() > 0.1  # the mask did drop weights


@pytest.mark.parametrize("dtype", [it.bfloat16, it.float16])
def test_low_precision_under_autocast_accumulates_in_float32(dtype, small_blocks):
    rng = np.random.default_rng(4)
    q, k, v, cot = _inputs(rng, np.float32, 40, 40)
    outs = {}
    for backend in (SDPBackend.MATH, SDPBackend.FLASH_ATTENTION):
        tensors = [it.tensor(a).to(dtype).requires_grad_() for a in (q, k, v)]
        with sdpa_kernel(backend):
            out = it.nn.functional.scaled_dot_product_attention(*tensors, is_causal=True)
        out.backward(it.tensor(cot).to(dtype))
        assert out.dtype == dtype and all(t.grad.dtype == dtype for t in tensors)
        outs[backend] = [out.float().numpy()] + [t.grad.float().numpy() for t in tensors]
    for got, want in zip(outs[SDPBackend.FLASH_ATTENTION], outs[SDPBackend.MATH]):
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)  # both round once from float32


def test_forward_and_backward_at_4096_hold_less_than_one_heads_scores():
    """B1, 4 heads, D 64, T 4096, causal: one head's float32 T x T scores would be 64 MB."""
    rng = np.random.default_rng(5)
    q, k, v = (it.tensor(rng.standard_normal((1, 4, 4096, 64)).astype(np.float32), requires_grad=True)
               for _ in range(3))
    cot = it.tensor(rng.standard_normal((1, 4, 4096, 64)).astype(np.float32))
    tracemalloc.start()
    try:
        out = it.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # chosen by length
        out.backward(cot)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert q.grad is not None and np.isfinite(q.grad.numpy()).all()
    assert peak < 4096 * 4096 * 4, f"{peak / 2 ** 20:.1f} MB"


def test_the_path_is_chosen_by_key_length_unless_forced(monkeypatch):
    chosen = []
    for cls in (attention_module.ScaledDotProductAttention, flash_attention.BlockedAttention):
        original = cls.forward
        monkeypatch.setattr(cls, "forward", lambda self, *a, _o=original: chosen.append(type(self).__name__)
                            or _o(self, *a))
    q = it.tensor(np.zeros((1, 1, 4, 8), np.float32))
    long = it.tensor(np.zeros((1, 1, attention_module.AUTO_BLOCKED_KEYS + 1, 8), np.float32))
    it.nn.functional.scaled_dot_product_attention(q, q, q)
    it.nn.functional.scaled_dot_product_attention(q, long, long)
    with sdpa_kernel(SDPBackend.MATH):
        it.nn.functional.scaled_dot_product_attention(q, long, long)
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        it.nn.functional.scaled_dot_product_attention(q, q, q)
    assert chosen == ["ScaledDotProductAttention", "BlockedAttention", "ScaledDotProductAttention",
                      "BlockedAttention"]
    with pytest.raises(ValueError, match="SDPBackend members"):
        with sdpa_kernel("math"):
            pass


def test_double_backward_through_the_blocked_path(small_blocks):
    rng = np.random.default_rng(6)
    q, k, v, _ = _inputs(rng, np.float64, 20, 20, batch=1, heads=2, kv_heads=2)
    results = []
    for backend in (SDPBackend.MATH, SDPBackend.FLASH_ATTENTION):
        tensors = [it.tensor(a, requires_grad=True) for a in (q, k, v)]
        with sdpa_kernel(backend):
            out = it.nn.functional.scaled_dot_product_attention(*tensors, is_causal=True)
        (gq,) = it.autograd.grad(out.sum(), [tensors[0]], create_graph=True)
        (gqk,) = it.autograd.grad((gq * gq).sum(), [tensors[1]])
        results.append(gqk.numpy())
    np.testing.assert_allclose(results[1], results[0], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backends", [SDPBackend.MATH, SDPBackend.EFFICIENT_ATTENTION])
def test_dropout_of_a_head_subset_draws_those_heads_masks(backends):
    """dropout_heads=(offset, total): an attention over heads offset.. of total (a Ulysses rank's share) drops the
    weights one attention over every head drops for them, on both paths, forward and backward."""
    rng = np.random.default_rng(1)
    q, k, v, g = (rng.standard_normal((2, 4, 12, 8)) for _ in range(4))
    with sdpa_kernel(backends):
        whole = [it.tensor(a, requires_grad=True) for a in (q, k, v)]
        it.manual_seed(5)
        out = attention_module.scaled_dot_product_attention(*whole, dropout_p=0.3, is_causal=True)
        out.backward(it.tensor(g))
        part = [it.tensor(a[:, 2:], requires_grad=True) for a in (q, k, v)]
        it.manual_seed(5)
        mine = attention_module.scaled_dot_product_attention(*part, dropout_p=0.3, is_causal=True,
                                                             dropout_heads=(2, 4))
        mine.backward(it.tensor(g[:, 2:]))
    np.testing.assert_allclose(mine.numpy(), out.numpy()[:, 2:], rtol=1e-12, atol=1e-12)
    for a, b in zip(part, whole):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy()[:, 2:], rtol=1e-12, atol=1e-12)
