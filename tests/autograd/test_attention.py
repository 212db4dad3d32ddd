import numpy as np
import pytest
import torch

import infini_train as it
from infini_train import backend
from infini_train.autograd.ops import attention as attention_module
from tests.autograd.test_low_precision import (LOW, assert_all_ulps, cotangent_for, float32_reference, normal,
                                               outputs_and_grads)
from tests import op_check
from tests.op_check import check_finite_differences, check_op, make_inputs

F = torch.nn.functional
sdpa = it.scaled_dot_product_attention

# atol 1e-5 against torch: the op chains two float32 matmuls around an exp (rounding ~1e-7 relative on values
# up to ~10, and torch scales q and k separately before the product); float64 finite differences stay at 1e-6.
ATOL = 1e-5

SHAPES = {
    "3d": [(2, 5, 4), (2, 5, 4), (2, 5, 3)],
    "4d_tq<tk": [(1, 2, 3, 4), (1, 2, 6, 4), (1, 2, 6, 4)],
    "4d_tq>tk": [(2, 1, 5, 3), (2, 1, 2, 3), (2, 1, 2, 2)],
    "broadcast_kv": [(3, 2, 4, 2), (1, 2, 3, 2), (1, 2, 3, 2)],
}


@pytest.mark.parametrize("shapes", list(SHAPES.values()), ids=list(SHAPES))
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_matches_torch(shapes, causal):
    check_op(shapes, lambda q, k, v: sdpa(q, k, v, is_causal=causal),
             lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal), atol=ATOL)


def test_sdpa_bool_mask_broadcast_and_scale():
    bool_mask = np.array([[True, False, True, True], [True, True, False, True], [False, True, True, True]])
    check_op([(2, 3, 4), (2, 4, 4), (2, 4, 2), bool_mask],
             lambda q, k, v, m: sdpa(q, k, v, attn_mask=m, scale=0.3),
             lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.3), atol=ATOL)
    per_batch = np.random.default_rng(0).random((2, 1, 3, 4)) > 0.3
    per_batch[..., 0] = True
    check_op([(2, 2, 3, 4), (2, 2, 4, 4), (2, 2, 4, 2), per_batch],
             lambda q, k, v, m: sdpa(q, k, v, attn_mask=m),
             lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), atol=ATOL)


def test_sdpa_float_mask_gets_gradient():
    float_mask = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    check_op([(2, 3, 4), (2, 4, 4), (2, 4, 2), float_mask],
             lambda q, k, v, m: sdpa(q, k, v, attn_mask=m),
             lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), atol=ATOL,
             grad_mask=[True, True, True, True])


def test_sdpa_fully_masked_rows_give_zeros_like_torch():
    bool_mask = np.array([[True, True, False], [False, False, False]])
    check_op([(2, 2, 4), (2, 3, 4), (2, 3, 4), bool_mask], lambda q, k, v, m: sdpa(q, k, v, attn_mask=m),
             lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), atol=ATOL)
    float_mask = np.where(bool_mask, 0.0, -np.inf).astype(np.float32)
    out = sdpa(it.ones(2, 4), it.ones(3, 4), it.ones(3, 4), attn_mask=it.tensor(float_mask)).numpy()
    np.testing.assert_array_equal(out, [[1.0] * 4, [0.0] * 4])


def _torch_sdpa_with_keep(keep, p):
    def fn(q, k, v):
        weights = torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1)
        return (weights * torch.tensor(keep) / (1 - p)) @ v
    return fn


def test_sdpa_dropout_uses_the_seeded_generator():
    """The mask is a function of each weight's position and one seed drawn from the seeded generator."""
    from infini_train.autograd.ops.attention_dropout import draw_seed, keep_block

    p, shapes = 0.4, [(2, 3, 4), (2, 5, 4), (2, 5, 3)]
    backend.manual_seed(7)
    keep = keep_block(np, draw_seed(backend.Device.parse(op_check.DEVICE)), (2,), 3, 5, 0, 3, 0, 5, p)
    assert 0 < keep.sum() < keep.size

    def it_fn(q, k, v):
        it.manual_seed(7)  # the same mask on every call, so finite differences see one function
        return sdpa(q, k, v, dropout_p=p)
    check_op(shapes, it_fn, _torch_sdpa_with_keep(keep, p), atol=ATOL)


def test_sdpa_retain_graph_second_backward_is_identical():
    # backward reuses its stashed probabilities in place only when the graph is not retained
    rng = np.random.default_rng(0)
    q, k, v = (it.tensor(rng.standard_normal((2, 4, 3)).astype(np.float32), requires_grad=True) for _ in range(3))
    y = sdpa(q, k, v, is_causal=True)
    g = it.tensor(rng.standard_normal((2, 4, 3)).astype(np.float32))
    y.backward(g, retain_graph=True)
    first = [t.grad.numpy().copy() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    y.backward(g)
    for t, expect in zip((q, k, v), first):
        np.testing.assert_array_equal(t.grad.numpy(), expect)


def test_sdpa_only_some_inputs_need_grad_and_float16():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 4, 3)).astype(np.float32) for _ in range(3))
    tq = torch.tensor(q, requires_grad=True)
    F.scaled_dot_product_attention(tq, torch.tensor(k), torch.tensor(v)).sum().backward()
    iq = it.tensor(q, requires_grad=True)
    sdpa(iq, it.tensor(k), it.tensor(v)).sum().backward()
    np.testing.assert_allclose(iq.grad.numpy(), tq.grad.numpy(), atol=ATOL)
    half = sdpa(*(it.tensor(a.astype(np.float16)) for a in (q, k, v)))
    assert half.dtype == np.float16
    np.testing.assert_allclose(half.numpy(), sdpa(it.tensor(q), it.tensor(k), it.tensor(v)).numpy(), atol=1e-2)


def test_sdpa_errors():
    name = "scaled_dot_product_attention"
    with pytest.raises(ValueError, match=rf"{name}: expected q \(\.\.\., Tq, E\), k \(\.\.\., Tk, E\), v .*got q "
                                         r"\(2, 3, 4\), k \(2, 3, 5\)"):
        sdpa(it.ones(2, 3, 4), it.ones(2, 3, 5), it.ones(2, 3, 4))
    with pytest.raises(ValueError, match=rf"{name}: expected batch dims of q, k, v that broadcast"):
        sdpa(it.ones(2, 3, 4), it.ones(3, 3, 4), it.ones(3, 3, 4))
    with pytest.raises(ValueError, match=rf"{name}: expected q, k, v of one floating dtype"):
        sdpa(it.ones(3, 4), it.ones(3, 4, dtype=it.float64), it.ones(3, 4))
    with pytest.raises(ValueError, match=rf"{name}: expected a bool or floating attn_mask, got attn_mask of dtype"):
        sdpa(it.ones(3, 4), it.ones(3, 4), it.ones(3, 4), attn_mask=it.tensor([[1, 0, 1]] * 3))
    with pytest.raises(ValueError, match=rf"{name}: expected an attn_mask broadcastable to the scores' shape "
                                         r"\(2, 3, 5\), got attn_mask of shape \(4, 3, 5\)"):
        sdpa(it.ones(2, 3, 4), it.ones(2, 5, 4), it.ones(2, 5, 4), attn_mask=it.ones(4, 3, 5))
    with pytest.raises(ValueError, match=rf"{name}: expected either attn_mask or is_causal=True, got both"):
        sdpa(it.ones(3, 4), it.ones(3, 4), it.ones(3, 4), attn_mask=it.ones(3, 3), is_causal=True)
    with pytest.raises(ValueError, match=rf"{name}: expected dropout_p in \[0, 1\), got 1.0"):
        sdpa(it.ones(3, 4), it.ones(3, 4), it.ones(3, 4), dropout_p=1.0)


@pytest.mark.parametrize("shapes", [[(1, 2, 7, 3), (1, 2, 7, 3), (1, 2, 7, 2)],  # rows [0,2) [2,4) [4,6) [6,7)
                                    [(2, 9, 2), (2, 5, 2), (2, 5, 3)],  # Tq > Tk: late blocks see every key
                                    [(5, 2), (8, 2), (8, 2)]], ids=str)  # Tq < Tk: keys 5..7 get no gradient
def test_sdpa_causal_query_blocks(shapes, monkeypatch):
    # causal attention is computed in blocks of query rows over growing key prefixes from 256 rows on;
    # shrink the block so small shapes (cheap finite differences) go through the blocked path
    monkeypatch.setattr(attention_module, "_CAUSAL_BLOCK_ROWS", 2)
    check_op(shapes, lambda q, k, v: sdpa(q, k, v, is_causal=True),
             lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=ATOL)

    def with_dropout(q, k, v):
        it.manual_seed(5)
        return sdpa(q, k, v, is_causal=True, dropout_p=0.5)
    arrays = make_inputs(shapes)
    check_finite_differences(with_dropout, arrays, [True, True, True])
    dropped = with_dropout(*(it.tensor(a) for a in arrays)).numpy()
    full = sdpa(*(it.tensor(a) for a in arrays), is_causal=True).numpy()
    assert not np.allclose(dropped, full)


def test_sdpa_large_causal_matches_torch():
    # T=300: the real blocked path (query rows [0, 128), [128, 256), [256, 300)), forward and gradients
    check_op([(1, 2, 300, 8), (1, 2, 300, 8), (1, 2, 300, 8)], lambda q, k, v: sdpa(q, k, v, is_causal=True),
             lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=ATOL, fd=False)


# ---------------------------------------------------------------------------------- grouped-query attention
GQA_SHAPES = {
    "groups_of_2": [(2, 4, 5, 8), (2, 2, 6, 8), (2, 2, 6, 3)],
    "one_kv_head": [(1, 3, 4, 4), (1, 1, 4, 4), (1, 1, 4, 2)],
    "k_and_v_heads_differ": [(1, 6, 3, 4), (1, 2, 5, 4), (1, 3, 5, 2)],
    "kv_batch_broadcasts": [(2, 4, 3, 4), (1, 2, 3, 4), (1, 2, 3, 2)],
    "3d_heads_first": [(4, 3, 2), (2, 5, 2), (2, 5, 3)],
    "equal_heads": [(2, 2, 3, 4), (2, 2, 3, 4), (2, 2, 3, 2)],
}


@pytest.mark.parametrize("shapes", list(GQA_SHAPES.values()), ids=list(GQA_SHAPES))
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_gqa_matches_torch(shapes, causal):
    # k/v gradients are the sums over each group of q heads sharing the k/v head
    check_op(shapes, lambda q, k, v: sdpa(q, k, v, is_causal=causal, enable_gqa=True),
             lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True), atol=ATOL)


def test_sdpa_gqa_with_masks():
    per_head = np.random.default_rng(1).standard_normal((4, 3, 5)).astype(np.float32)  # a float mask per q head
    check_op([(2, 4, 3, 4), (2, 2, 5, 4), (2, 2, 5, 3), per_head],
             lambda q, k, v, m: sdpa(q, k, v, attn_mask=m, enable_gqa=True),
             lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True), atol=ATOL,
             grad_mask=[True, True, True, True])
    bool_mask = np.random.default_rng(2).random((2, 1, 3, 5)) > 0.4
    bool_mask[..., 0] = True
    check_op([(2, 4, 3, 4), (2, 2, 5, 4), (2, 2, 5, 3), bool_mask],
             lambda q, k, v, m: sdpa(q, k, v, attn_mask=m, scale=0.7, enable_gqa=True),
             lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.7, enable_gqa=True),
             atol=ATOL)


def test_sdpa_gqa_blocked_causal_and_dropout(monkeypatch):
    monkeypatch.setattr(attention_module, "_CAUSAL_BLOCK_ROWS", 2)
    shapes = [(1, 4, 7, 3), (1, 2, 7, 3), (1, 2, 7, 2)]
    check_op(shapes, lambda q, k, v: sdpa(q, k, v, is_causal=True, enable_gqa=True),
             lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), atol=ATOL)

    def with_dropout(q, k, v):
        it.manual_seed(3)
        return sdpa(q, k, v, is_causal=True, dropout_p=0.3, enable_gqa=True)
    check_finite_differences(with_dropout, make_inputs(shapes), [True, True, True])


def test_sdpa_gqa_equals_repeated_heads():
    # the grouped result is attention over k and v repeated head by head (torch's repeat_interleave)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in [(2, 6, 4, 3), (2, 3, 5, 3), (2, 3, 5, 3)])
    grouped = sdpa(it.tensor(q), it.tensor(k), it.tensor(v), enable_gqa=True).numpy()
    repeated = sdpa(it.tensor(q), it.tensor(np.repeat(k, 2, axis=1)), it.tensor(np.repeat(v, 2, axis=1))).numpy()
    np.testing.assert_array_equal(grouped, repeated)
    with pytest.raises(AssertionError):  # tiled (head h -> h % 3) is a different pairing
        np.testing.assert_allclose(grouped, sdpa(it.tensor(q), it.tensor(np.tile(k, (1, 2, 1, 1))),
                                                 it.tensor(np.tile(v, (1, 2, 1, 1)))).numpy(), atol=1e-5)


def test_sdpa_gqa_errors():
    name = "scaled_dot_product_attention"
    q, k, v = it.ones(2, 4, 3, 8), it.ones(2, 2, 3, 8), it.ones(2, 2, 3, 8)
    with pytest.raises(ValueError, match=rf"{name}: expected batch dims of q, k, v that broadcast.*\nHINT: .*"
                                         r"pass enable_gqa=True"):
        sdpa(q, k, v)
    with pytest.raises(ValueError, match=rf"{name}: expected k heads that divide q's 4 heads \(enable_gqa=True\), got "
                                         r"k of shape \(2, 3, 3, 8\)"):
        sdpa(q, it.ones(2, 3, 3, 8), it.ones(2, 3, 3, 8), enable_gqa=True)
    with pytest.raises(ValueError, match=rf"{name}: expected v heads that divide q's 4 heads"):
        sdpa(q, k, it.ones(2, 8, 3, 8), enable_gqa=True)
    with pytest.raises(ValueError, match=rf"{name}: expected q, k, v of shape \(\.\.\., heads, T, E\) with "
                                         r"enable_gqa=True"):
        sdpa(it.ones(3, 8), it.ones(3, 8), it.ones(3, 8), enable_gqa=True)
    with pytest.raises(ValueError, match=rf"{name}: expected an attn_mask broadcastable to the scores' shape "
                                         r"\(2, 4, 3, 3\), got attn_mask of shape \(2, 3, 3\)"):
        sdpa(q, k, v, attn_mask=it.ones(2, 3, 3), enable_gqa=True)  # (2, 3, 3) reads as 2 heads, not 4


@pytest.mark.cuda
@pytest.mark.skipif(not it.backend.cuda_available(), reason="needs cupy and an NVIDIA GPU")
def test_sdpa_gqa_on_cuda_matches_cpu():
    arrays = make_inputs([(2, 4, 5, 8), (2, 2, 5, 8), (2, 2, 5, 3)])
    results = []
    for device in ("cpu", "cuda:0"):
        q, k, v = (it.tensor(a, device=device, requires_grad=True) for a in arrays)
        sdpa(q, k, v, is_causal=True, enable_gqa=True).sum().backward()
        results.append([t.grad.numpy() for t in (q, k, v)])
    for cpu, gpu in zip(*results):
        np.testing.assert_allclose(gpu, cpu, rtol=1e-5, atol=ATOL)


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("case", ["causal T=64", "causal T=300 (blocks)", "float mask", "bool mask"])
def test_sdpa_low_precision_computes_in_float32_and_rounds_once(case, dtype):
    rng = np.random.default_rng(0)
    T = 300 if "300" in case else 64 if "64" in case else 20
    arrays = [normal(rng, (2, 3, T, 16), dtype) for _ in range(3)]
    kwargs = {"is_causal": True} if "causal" in case else {}
    if case == "float mask":
        arrays.append(normal(rng, (T, T), dtype))
    if case == "bool mask":
        kwargs["attn_mask"] = np.tril(np.ones((T, T), bool))

    def ours(*ts):
        return sdpa(*ts, **{k: it.tensor(v) if k == "attn_mask" else v for k, v in kwargs.items()})

    def theirs(*ts):
        return F.scaled_dot_product_attention(*ts, **{k: torch.tensor(v) if k == "attn_mask" else v
                                                      for k, v in kwargs.items()})

    cotangent = cotangent_for(ours, arrays, normal)
    got, our_dtype = outputs_and_grads(it, ours, arrays, cotangent)
    assert our_dtype == dtype and all(g.dtype == got[0].dtype for g in got)
    # against torch's float32 attention on the same inputs, rounded once: the same value but for float32
    # summation order, so <= 1 ulp; elements under 2^-8 of the largest get the ulp at that floor (there the float32
    # rounding of sums of T terms of the largest size, ~T 2^-24 relative to it, exceeds the element's own ulp)
    assert_all_ulps(got, float32_reference(theirs, arrays, cotangent, dtype), dtype, ulps=1, floor_fraction=2 ** -8)
    # torch's own float16/bfloat16 CPU kernel rounds its (T, T) intermediates to the input dtype: its results are
    # within 2 ulp of the largest magnitude of ours (measured <= 1.96 over seeds), not of each element
    theirs_low, their_dtype = outputs_and_grads(torch, theirs, arrays, cotangent)
    assert their_dtype == dtype
    assert_all_ulps(got, theirs_low, dtype, ulps=2, floor_fraction=1.0)
