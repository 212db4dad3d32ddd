"""The NumPy reference of the tensor-core attention kernels (kernels/reference/flash_attention.py) on the CPU: its
tiled online-softmax arithmetic (P and dS rounded to the inputs' dtype, as the kernels do) against the array path
(infini_train's scaled_dot_product_attention) and torch's scaled_dot_product_attention on the same bfloat16 /
float16 inputs, with causal masks, grouped-query heads, sliding windows, dropout (the array path's mask) and lengths
that are not multiples of the tiles; and the blocks it visits (the kernels' formulas) against the masks."""
import numpy as np
import pytest
import torch

import infini_train as it
import infini_train.nn.functional as F
from infini_train.autograd.ops.attention_dropout import draw_seed
from infini_train.kernels.reference import flash_attention as ref
from tests.kernels.attention_inputs import attention_inputs

# |reference - other| <= TOL * max|other|: P and dS are rounded to the inputs' dtype before their products
TOL = {"bfloat16": 1.2e-2, "float16": 2e-3}
CASES = {  # name -> (B, H, Hkv, Tq, Tk, D, causal, window, dropout_p)
    "causal": (2, 4, 4, 100, 100, 64, True, 0, 0.0),
    "gqa-not-causal-tq-tk": (2, 4, 2, 150, 130, 64, False, 0, 0.0),
    "one-kv-head-d128": (1, 4, 1, 200, 200, 128, True, 0, 0.0),
    "window": (1, 2, 2, 200, 200, 64, True, 50, 0.0),
    "dropout": (2, 2, 2, 130, 130, 64, True, 0, 0.3),
    "dropout-gqa-tq-lt-tk": (2, 4, 2, 70, 90, 64, False, 0, 0.2),
}


def _band(tq, tk, window):
    i, j = np.arange(tq)[:, None], np.arange(tk)[None, :]
    return (j <= i) & (j > i - window)


def _reference(q, k, v, g, causal, window, seed, p):
    scale = 1.0 / np.sqrt(q.shape[-1])
    out, lse = ref.forward(q, k, v, scale, causal, window, seed, p)
    return [out, *ref.backward(q, k, v, out, lse, g, scale, causal, window, seed, p)], lse


def _array_path(q, k, v, g, causal, window, p, seed_state=3):
    tensors = [it.tensor(a, requires_grad=True) for a in (q, k, v)]
    mask = it.tensor(_band(q.shape[2], k.shape[2], window)) if window else None
    it.manual_seed(seed_state)
    out = F.scaled_dot_product_attention(*tensors, attn_mask=mask, is_causal=causal and not window, dropout_p=p,
                                         enable_gqa=q.shape[1] != k.shape[1])
    out.backward(it.tensor(g))
    return [out.numpy()] + [t.grad.numpy() for t in tensors]


def _assert_close(got, want, dtype, what):
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        assert a.shape == b.shape, f"{what} {name}: {a.shape} vs {b.shape}"
        err = np.abs(a - b).max()
        assert err <= TOL[dtype] * np.abs(b).max(), f"{what} {name}: max error {err} of max {np.abs(b).max()}"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_reference_matches_the_array_path(case, dtype):
    b, h, hkv, tq, tk, d, causal, window, p = CASES[case]
    q, k, v, g = attention_inputs(getattr(it, dtype), b, h, hkv, tq, tk, d)
    it.manual_seed(3)
    seed = draw_seed(it.device("cpu")) if p else None  # the array path's first draw after manual_seed(3)
    got, _ = _reference(q, k, v, g, causal, window, seed, p)
    _assert_close(got, _array_path(q, k, v, g, causal, window, p), dtype, case)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", [c for c in sorted(CASES) if CASES[c][-1] == 0.0])
def test_the_reference_matches_torch_sdpa(case, dtype):
    b, h, hkv, tq, tk, d, causal, window, _ = CASES[case]
    q, k, v, g = attention_inputs(getattr(it, dtype), b, h, hkv, tq, tk, d, seed=1)
    got, _ = _reference(q, k, v, g, causal, window, None, 0.0)
    tensors = [torch.tensor(a.astype(np.float32), requires_grad=True) for a in (q, k, v)]
    mask = torch.tensor(_band(tq, tk, window)) if window else None
    out = torch.nn.functional.scaled_dot_product_attention(*tensors, attn_mask=mask, is_causal=causal and not window,
                                                           enable_gqa=h != hkv)
    out.backward(torch.tensor(g.astype(np.float32)))
    _assert_close(got, [out.detach().numpy()] + [t.grad.numpy() for t in tensors], dtype, case)


def test_lse_is_the_rows_log_sum_exp_and_rows_without_keys_give_zeros():
    # causal with a window: queries past Tk + window - 1 see no key at all
    q, k, v, g = attention_inputs(it.bfloat16, 1, 2, 2, 100, 20, 64, seed=2)
    (out, dq, dk, dv), lse = _reference(q, k, v, g, True, 10, None, 0.0)
    scores = q.astype(np.float64) @ k.astype(np.float64).swapaxes(-1, -2) / 8.0
    seen = _band(100, 20, 10)
    with np.errstate(divide="ignore"):
        want = np.log(np.where(seen, np.exp(scores), 0.0).sum(-1))
    empty = ~seen.any(-1)
    assert empty[29:].all() and not empty[:29].any()
    np.testing.assert_allclose(lse[..., ~empty], want[..., ~empty], rtol=1e-5, atol=1e-5)
    assert np.isposinf(lse[..., empty]).all()
    assert not out[..., empty, :].astype(np.float32).any() and not dq[..., empty, :].astype(np.float32).any()
    assert np.isfinite(dk.astype(np.float32)).all() and np.isfinite(dv.astype(np.float32)).all()


@pytest.mark.parametrize("causal,window", [(False, 0), (True, 0), (True, 1), (True, 37), (True, 64), (True, 200)])
def test_the_visited_blocks_hold_every_visible_pair(causal, window):
    from infini_train.kernels.flash_attention_source import BWD_STEP, FWD_KEYS, ROWS

    for tq, tk in ((300, 300), (100, 230), (257, 65)):
        seen = ref.visible(np.arange(tq)[:, None], np.arange(tk)[None, :], tk, causal, window)
        for step in (FWD_KEYS, BWD_STEP):
            for q0 in range(0, tq, ROWS):
                begin, end = ref.key_range(q0, tk, causal, window, step)
                assert begin % step == 0
                cols = np.flatnonzero(seen[q0:q0 + ROWS].any(axis=0))
                assert cols.size == 0 or (cols.min() >= begin and cols.max() < end), (tq, tk, q0, step)
        for k0 in range(0, tk, ROWS):
            begin, end = ref.query_range(k0, tq, causal, window, BWD_STEP)
            rows = np.flatnonzero(seen[:, k0:k0 + ROWS].any(axis=1))
            assert begin % BWD_STEP == 0
            assert rows.size == 0 or (rows.min() >= begin and rows.max() < end), (tq, tk, k0)


def test_row_dot_is_the_warps_butterfly_of_lane_sums():
    rng = np.random.default_rng(4)
    dout, out = (rng.standard_normal((2, 3, 5, 128)).astype(it.bfloat16) for _ in range(2))
    terms = dout.astype(np.float32) * out.astype(np.float32)
    lanes = ((terms[..., 0:32] + terms[..., 32:64]) + terms[..., 64:96]) + terms[..., 96:128]  # lane c's order
    tree = lanes
    for width in (16, 8, 4, 2, 1):
        tree = tree[..., :width] + tree[..., width:2 * width]  # lane 0 of each butterfly level
    np.testing.assert_array_equal(ref.row_dot(dout, out), tree[..., 0])
