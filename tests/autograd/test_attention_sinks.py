"""Attention sinks and sliding windows in both attention paths (the materialised one, attention.py, and the blocked
memory-efficient one, flash_attention.py, here with small blocks so windows and causal rows cross block edges):
the output and every gradient, the sinks' included, against an eager torch reference built as Hugging Face's
GptOssAttention computes it (the sink's column concatenated to the scores, softmax, the column dropped), over
causal / non-causal attention, sliding windows, grouped-query heads, masks and fully masked rows; float64 finite
differences (with and without dropout); both paths' dropout alike; a double backward through the composite; and
the argument checks."""
import numpy as np
import pytest
import torch

import infini_train as it
from infini_train.autograd.ops import flash_attention
from infini_train.nn.attention import SDPBackend, sdpa_kernel
from tests.op_check import check_finite_differences

PATHS = {"math": SDPBackend.MATH, "blocked": SDPBackend.FLASH_ATTENTION}


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    monkeypatch.setattr(flash_attention.BlockedAttention, "block", 16)


def reference(q, k, v, sinks, causal=False, window=None, mask=None):
    """HF's eager gpt-oss attention (repeat_kv, scores, the sink column, softmax, drop it) on torch tensors."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    T, S = s.shape[-2:]
    lag = torch.arange(T)[:, None] - torch.arange(S)[None]
    keep = torch.ones(T, S, dtype=torch.bool)
    if causal:
        keep &= lag >= 0
    if window is not None:
        keep &= lag < window
    if mask is not None:
        keep = keep & mask
    s = s.masked_fill(~keep, float("-inf"))
    if sinks is None:
        return s.softmax(-1) @ v
    combined = torch.cat([s, sinks.reshape(1, -1, 1, 1).expand(s.shape[0], -1, T, 1)], -1)
    combined = combined - combined.max(-1, keepdim=True).values
    return combined.softmax(-1)[..., :-1] @ v


CASES = {
    "causal": dict(T=37, S=37, causal=True),
    "causal_window": dict(T=45, S=45, causal=True, window=5),
    "causal_window_wide": dict(T=40, S=40, causal=True, window=20),
    "window_only": dict(T=33, S=40, window=7),
    "causal_window_tq<tk": dict(T=21, S=53, causal=True, window=3),
    "plain": dict(T=19, S=29),
}


def _arrays(rng, T, S, dtype=np.float64, heads=4, kv_heads=2):
    return (rng.standard_normal((2, heads, T, 8)).astype(dtype), rng.standard_normal((2, kv_heads, S, 8)).astype(dtype),
            rng.standard_normal((2, kv_heads, S, 6)).astype(dtype), rng.standard_normal(heads).astype(dtype),
            rng.standard_normal((2, heads, T, 6)).astype(dtype))


def _ours(path, arrays, cot, mask=None, **kw):
    tensors = [it.tensor(a, requires_grad=True) for a in arrays]
    with sdpa_kernel(PATHS[path]):
        out = it.nn.functional.scaled_dot_product_attention(
            *tensors[:3], attn_mask=None if mask is None else it.tensor(mask), enable_gqa=True, sinks=tensors[3], **kw)
    out.backward(it.tensor(cot))
    return out.numpy(), [t.grad.numpy() for t in tensors]


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 1e-5)], ids=["float64", "float32"])
def test_sinks_and_windows_equal_hf_eager_reference(path, case, dtype, tol):
    spec = dict(CASES[case])
    causal, window = spec.pop("causal", False), spec.pop("window", None)
    *arrays, cot = _arrays(np.random.default_rng(0), spec["T"], spec["S"], dtype)
    out, grads = _ours(path, arrays, cot, is_causal=causal, sliding_window=window)
    ref_in = [torch.tensor(a, requires_grad=True) for a in arrays]
    expected = reference(*ref_in, causal, window)
    expected.backward(torch.tensor(cot))
    np.testing.assert_allclose(out, expected.detach().numpy(), rtol=tol, atol=tol)
    for name, got, t in zip("q k v sinks".split(), grads, ref_in):
        np.testing.assert_allclose(got, t.grad.numpy(), rtol=tol, atol=tol, err_msg=name)


@pytest.mark.parametrize("path", list(PATHS))
def test_sinks_with_a_mask_and_fully_masked_rows(path):
    """A bool mask with a fully masked query row: the sink takes the whole row (a zero output, no NaN) and the
    gradients still equal the reference's."""
    *arrays, cot = _arrays(np.random.default_rng(1), 20, 20)
    mask = np.tril(np.ones((20, 20), bool))
    mask[3] = False
    out, grads = _ours(path, arrays, cot, mask=mask, sliding_window=6)
    ref_in = [torch.tensor(a, requires_grad=True) for a in arrays]
    expected = reference(*ref_in, window=6, mask=torch.tensor(mask))
    expected.backward(torch.tensor(cot))
    assert np.all(out[:, :, 3] == 0)
    np.testing.assert_allclose(out, expected.detach().numpy(), atol=1e-12)
    for got, t in zip(grads, ref_in):
        np.testing.assert_allclose(got, t.grad.numpy(), atol=1e-12)


def test_without_sinks_a_window_equals_the_reference():
    *arrays, cot = _arrays(np.random.default_rng(2), 40, 40)
    for path in PATHS:
        tensors = [it.tensor(a) for a in arrays[:3]]
        with sdpa_kernel(PATHS[path]):
            out = it.nn.functional.scaled_dot_product_attention(*tensors, is_causal=True, enable_gqa=True,
                                                                sliding_window=9)
        expected = reference(*[torch.tensor(a) for a in arrays[:3]], None, True, 9)
        np.testing.assert_allclose(out.numpy(), expected.numpy(), atol=1e-12)


@pytest.mark.parametrize("dropout", [0.0, 0.25])
@pytest.mark.parametrize("path", list(PATHS))
def test_float64_finite_differences(path, dropout):
    """(With dropout the mask is a function of the seed and the positions: the same in every evaluation.)"""
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal((1, 2, 18, 4)), rng.standard_normal((1, 1, 18, 4)),
              rng.standard_normal((1, 1, 18, 3)), rng.standard_normal(2)]

    def fn(q, k, v, sinks):
        it.manual_seed(3)
        with sdpa_kernel(PATHS[path]):
            return it.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True,
                                                                 sinks=sinks, sliding_window=5, dropout_p=dropout)

    check_finite_differences(fn, arrays, [True] * 4, tol=1e-7)


def test_double_backward_through_the_sinks():
    """The first-order gradient of the sinks is differentiable again (the composite): its gradient matches
    torch's."""
    rng = np.random.default_rng(4)
    arrays = [rng.standard_normal((1, 2, 6, 4)), rng.standard_normal((1, 2, 6, 4)), rng.standard_normal((1, 2, 6, 3)),
              rng.standard_normal(2)]
    ours = [it.tensor(a, requires_grad=True) for a in arrays]
    with sdpa_kernel(SDPBackend.MATH):
        out = it.nn.functional.scaled_dot_product_attention(*ours[:3], is_causal=True, sinks=ours[3],
                                                            sliding_window=3)
    (g,) = it.autograd.grad(out.sum(), [ours[3]], create_graph=True)
    (g * g).sum().backward()
    ref = [torch.tensor(a, requires_grad=True) for a in arrays]
    (tg,) = torch.autograd.grad(reference(*ref, True, 3).sum(), [ref[3]], create_graph=True)
    (tg * tg).sum().backward()
    np.testing.assert_allclose(g.numpy(), tg.detach().numpy(), atol=1e-12)
    for a, b in zip(ours, ref):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), atol=1e-10)


def test_argument_errors():
    q = it.tensor(np.zeros((1, 2, 4, 4)))
    with pytest.raises(ValueError, match=r"sinks of shape \(2,\)"):
        it.nn.functional.scaled_dot_product_attention(q, q, q, sinks=it.tensor(np.zeros(3)))
    with pytest.raises(ValueError, match="sliding_window: None or an int >= 1"):
        it.nn.functional.scaled_dot_product_attention(q, q, q, sliding_window=0)


def test_dropout_with_sinks_is_the_same_in_both_paths():
    """Attention dropout draws each weight's keep from its position: both paths drop the same weights, so their
    outputs and gradients (the sinks' included: -P_sink * rowsum(dO * O)) agree."""
    *arrays, cot = _arrays(np.random.default_rng(5), 37, 37)
    results = []
    for path in PATHS:
        it.manual_seed(7)
        results.append(_ours(path, arrays, cot, is_causal=True, sliding_window=9, dropout_p=0.3))
    (out_m, grads_m), (out_b, grads_b) = results
    assert np.any(out_m != _ours("math", arrays, cot, is_causal=True, sliding_window=9)[0])  # dropout did drop
    np.testing.assert_allclose(out_b, out_m, atol=1e-12)
    for a, b in zip(grads_b, grads_m):
        np.testing.assert_allclose(a, b, atol=1e-12)
