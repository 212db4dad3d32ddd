"""float16/bfloat16 kernels against torch: the helpers of low_precision.py, the ops of GPT-2's path on 2-byte
inputs, and the tools the op test files share for such checks (``outputs_and_grads``, ``assert_ulps``, ...).

Tolerances are in ulps of the low-precision dtype: a bfloat16 ulp is 2^-7 of the value's power of two (8
significant bits), a float16 ulp 2^-10 (11 bits). Where both frameworks round the same float32 value the results
are compared exactly (dyadic inputs make float32 sums exact whatever the summation order).
"""
import ml_dtypes
import numpy as np
import pytest
import torch

import infini_train as it
import infini_train.nn.functional as F
from infini_train.autograd.ops import low_precision as lp

TF = torch.nn.functional
LOW = ["bfloat16", "float16"]
_MANTISSA_BITS = {"bfloat16": 7, "float16": 10, "float32": 23}
_MIN_NORMAL = {"bfloat16": 2.0 ** -126, "float16": 2.0 ** -14, "float32": 2.0 ** -126}


# ------------------------------------------------------------------------------------------------ tools
def to_torch(array):
    """A numpy array as a torch tensor with the same bits (torch.from_numpy has no ml_dtypes bfloat16)."""
    if array.dtype == it.bfloat16:
        return torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.array(array))


def from_torch(t):
    t = t.detach()
    return t.view(torch.int16).numpy().view(it.bfloat16) if t.dtype == torch.bfloat16 else t.numpy()


def dyadic(rng, shape, dtype):
    """Multiples of 1/8 in [-2, 2]: exact in both dtypes, their products and float32 sums of up to 2^14 of them
    exact too, so every framework rounds the same float32 value."""
    return (rng.integers(-16, 17, size=shape) / 8).astype(np.float32).astype(dtype)


def normal(rng, shape, dtype, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32).astype(dtype)


def outputs_and_grads(module, fn, arrays, cotangent):
    """Run ``fn`` in ``module`` (infini_train or torch) on ``arrays`` and backward ``cotangent``: returns the
    output and each floating input's gradient as numpy arrays, plus the output dtype's name."""
    make = it.tensor if module is it else to_torch
    inputs = [make(a).requires_grad_(a.dtype.kind in "fV") for a in arrays]  # V: bfloat16
    out = fn(*inputs)
    out.backward(make(cotangent))
    values = [out] + [t.grad for t in inputs if t.requires_grad]
    as_numpy = from_torch if module is torch else (lambda t: t.numpy())
    return [as_numpy(v) for v in values], str(out.dtype).replace("torch.", "")


def ulp(values, dtype):
    """The spacing of ``dtype`` at each |value| (the subnormal spacing below the smallest normal)."""
    magnitude = np.maximum(np.abs(np.asarray(values, np.float64)), _MIN_NORMAL[dtype])
    _, exponent = np.frexp(magnitude)  # magnitude = m 2^exponent, m in [0.5, 1)
    return np.ldexp(1.0, exponent - 1 - _MANTISSA_BITS[dtype])


def assert_ulps(got, want, dtype, ulps=0, floor=0.0, what="result"):
    """|got - want| <= ulps ulps of ``dtype`` at max(|want|, floor), element by element (ulps=0: bit-equal values)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} vs {want.shape}"
    if ulps == 0:
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    allowed = ulps * ulp(np.maximum(np.abs(want), floor), dtype)
    excess = np.abs(got - want) - allowed
    worst = np.unravel_index(np.argmax(excess), excess.shape) if excess.size else ()
    assert not (excess > 0).any(), (f"{what}: {np.count_nonzero(excess > 0)} elements beyond {ulps} ulp; worst at "
                                    f"{worst}: {got[worst]} vs {want[worst]}")


def cotangent_for(it_fn, arrays, values, seed=1):
    """An upstream gradient shaped and typed like ``it_fn``'s output, drawn by ``values`` (dyadic or normal)."""
    with it.no_grad():
        out = it_fn(*[it.tensor(a) for a in arrays])
    return values(np.random.default_rng(seed), out.shape, out.dtype)


def assert_all_ulps(ours, theirs, dtype, ulps=0, floor_fraction=0.0):
    """``assert_ulps`` for an output-and-gradients list, with dtypes equal and the floor taken as
    ``floor_fraction`` times each result's largest magnitude."""
    for k, (a, b) in enumerate(zip(ours, theirs)):
        what = "forward" if k == 0 else f"gradient of input {k - 1}"
        assert a.dtype == b.dtype, f"{what}: dtype {a.dtype} vs {b.dtype}"
        floor = floor_fraction * float(np.abs(b.astype(np.float64)).max(initial=0.0))
        assert_ulps(a, b, dtype, ulps, floor, what)


def check_against_torch(it_fn, torch_fn, arrays, dtype, ulps=0, floor_fraction=0.0, values=dyadic):
    """Forward and gradients of infini_train and torch on the same arrays agree to ``ulps`` (at a floor of
    ``floor_fraction`` times each result's largest magnitude) and have torch's dtypes. Returns ours."""
    cotangent = cotangent_for(it_fn, arrays, values)
    ours, our_dtype = outputs_and_grads(it, it_fn, arrays, cotangent)
    theirs, their_dtype = outputs_and_grads(torch, torch_fn, arrays, cotangent)
    assert our_dtype == their_dtype
    assert_all_ulps(ours, theirs, dtype, ulps, floor_fraction)
    return ours


def float32_reference(torch_fn, arrays, cotangent, dtype):
    """torch's float32 op on the widened arrays, each result rounded once to ``dtype``: what a kernel that
    computes in float32 and rounds at the end gives."""
    wide = [a.astype(np.float32) if a.dtype.kind in "fV" else a for a in arrays]
    results, _ = outputs_and_grads(torch, torch_fn, wide, cotangent.astype(np.float32))
    return [r.astype(dtype) for r in results]


# ------------------------------------------------------------------------------------------------ helpers
def test_widen_only_touches_low_precision_host_arrays():
    bf, f16, f32 = (np.ones(3, d) for d in (it.bfloat16, it.float16, it.float32))
    wide_bf, wide_f16, same_f32, none = lp.widen(np, bf, f16, f32, None)
    assert wide_bf.dtype == wide_f16.dtype == np.float32 and same_f32 is f32 and none is None
    assert lp.is_low_precision(it.bfloat16) and lp.is_low_precision(it.float16)
    assert not lp.is_low_precision(np.dtype(np.int16)) and not lp.is_low_precision(it.float32)
    assert not lp.has_low_precision_gemm(np)


def _float16_edge_cases():
    tiny = np.float32(2.0 ** -14)
    specials = [0.0, -0.0, tiny, -tiny, np.nextafter(tiny, 0), -np.nextafter(tiny, 0), 2.0 ** -24, 2.0 ** -25,
                3 * 2.0 ** -26, 2.0 ** -25 * 1.0000001, -(2.0 ** -25), 1e-45, np.nan, -np.nan, np.inf, -np.inf,
                65504.0, 65519.0, 65520.0, 1.0, -3.5]
    rng = np.random.default_rng(0)
    mixed = np.concatenate([rng.standard_normal(500) * 1e-6, rng.standard_normal(500) * 1e-4,
                            rng.standard_normal(500), np.zeros(50)])
    return np.concatenate([np.array(specials), rng.permutation(mixed)]).astype(np.float32)


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_narrow_to_float16_equals_numpys_cast_bit_for_bit(layout):
    x = _float16_edge_cases()[:1521].reshape(39, 39)  # 1521 = 39^2
    x = x if layout == "contiguous" else x.T
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
        got = lp.narrow(np, x, it.float16)
    assert lp._mostly_subnormal(x)  # the hand-written rounding ran
    assert got.dtype == np.float16 and got.shape == x.shape
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    theirs = from_torch(torch.from_numpy(np.ascontiguousarray(x)).to(torch.float16))
    numbers = ~np.isnan(x)  # torch may canonicalise NaN payloads
    np.testing.assert_array_equal(got[numbers].view(np.uint16), theirs[numbers].view(np.uint16))


def test_narrow_keeps_arrays_already_in_the_dtype_and_rounds_bfloat16_like_ml_dtypes():
    x = np.linspace(-3, 3, 101, dtype=np.float32)
    assert lp.narrow(np, x, it.float32) is x
    np.testing.assert_array_equal(lp.narrow(np, x, it.bfloat16).view(np.uint16),
                                  x.astype(ml_dtypes.bfloat16).view(np.uint16))


@pytest.mark.parametrize("dtype", LOW)
def test_matmul_helper_rounds_a_float32_product_once(dtype):
    rng = np.random.default_rng(0)
    a, b = normal(rng, (5, 40), dtype), normal(rng, (40, 3), dtype)
    got = lp.matmul(np, a, b)
    assert got.dtype == a.dtype
    want = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32).astype(dtype)
    assert_ulps(got, want, dtype, ulps=1)  # float32 vs float64 sums may straddle a rounding boundary
    assert lp.matmul(np, a.astype(np.float32), b.astype(np.float32)).dtype == np.float32


# ------------------------------------------------------------------------------------- GPT-2's path
@pytest.mark.parametrize("dtype", LOW)
def test_qkv_views_split_transpose_reshape_are_exact(dtype):
    rng = np.random.default_rng(1)
    B, T, C, H = 2, 5, 12, 3
    x = normal(rng, (B, T, 3 * C), dtype)

    def heads(m, qkv):  # GPT-2's attention prologue, stacked so that one backward covers q, k and v
        q, k, v = qkv.split(C, dim=2)
        return m.stack([t.reshape(B, T, H, C // H).transpose(1, 2) for t in (q, k, v)])

    check_against_torch(lambda t: heads(it, t), lambda t: heads(torch, t), [x], dtype, values=normal)


@pytest.mark.parametrize("dtype", LOW)
def test_residual_add_of_low_and_float32_promotes_and_rounds_the_gradient_once(dtype):
    rng = np.random.default_rng(2)
    low, high, cot = normal(rng, (4, 8), dtype), normal(rng, (4, 8), np.float32), normal(rng, (4, 8), np.float32)
    ours, our_dtype = outputs_and_grads(it, lambda a, b: a + b, [low, high], cot)
    theirs, their_dtype = outputs_and_grads(torch, lambda a, b: a + b, [low, high], cot)
    assert our_dtype == their_dtype == "float32"
    assert ours[1].dtype == low.dtype and ours[2].dtype == np.float32
    for a, b in zip(ours, theirs):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", LOW)
def test_gpt2_mlp_and_loss_chain_matches_torch(dtype):
    """ln -> cast -> linear -> gelu -> linear -> float32 residual -> lm_head -> float32 cross_entropy, with
    float32 parameters cast to ``dtype`` as autocast will. Each op rounds as torch's does, so the loss agrees to
    1/100 ulp and the float32 parameter gradients to 1/4 ulp of the largest one (measured: <= 0.12 ulp, from
    rare 1-ulp rounding differences); the same chain in float32 is 0.3-3 ulp away, so precision is really low."""
    rng = np.random.default_rng(3)
    C, V, N = 16, 40, 12
    arrays = {"x": normal(rng, (N, C), np.float32), "ln_w": 1 + normal(rng, (C,), np.float32, 0.1),
              "ln_b": normal(rng, (C,), np.float32, 0.1), "fc_w": normal(rng, (4 * C, C), np.float32, 0.2),
              "fc_b": normal(rng, (4 * C,), np.float32, 0.1), "proj_w": normal(rng, (C, 4 * C), np.float32, 0.1),
              "proj_b": normal(rng, (C,), np.float32, 0.1), "wte": normal(rng, (V, C), np.float32, 0.3)}
    targets = rng.integers(0, V, N)

    def run(m, fn):
        p = {k: (it.tensor(a) if m is it else torch.tensor(a)).requires_grad_(True) for k, a in arrays.items()}
        low = getattr(m, dtype)
        h = fn.layer_norm(p["x"], (C,), p["ln_w"], p["ln_b"]).to(low)
        h = fn.linear(h, p["fc_w"].to(low), p["fc_b"].to(low))
        h = fn.gelu(h, approximate="tanh")
        h = fn.linear(h, p["proj_w"].to(low), p["proj_b"].to(low))
        x = p["x"] + h  # float32 residual stream
        logits = fn.linear(fn.layer_norm(x, (C,)).to(low), p["wte"].to(low))
        assert str(logits.dtype).endswith(dtype)
        loss = fn.cross_entropy(logits.float(), (it.tensor(targets) if m is it else torch.tensor(targets)))
        loss.backward()
        return float(loss.item()), {k: t.grad.numpy() for k, t in p.items()}

    loss, grads = run(it, F)
    loss_t, grads_t = run(torch, TF)
    one_ulp = 2.0 ** -_MANTISSA_BITS[dtype]
    np.testing.assert_allclose(loss, loss_t, rtol=one_ulp / 100)
    for k in grads:
        np.testing.assert_allclose(grads[k], grads_t[k], rtol=0, atol=one_ulp / 4 * np.abs(grads_t[k]).max(), err_msg=k)


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("op", ["matmul", "linear", "einsum", "bmm"])
def test_mixed_low_and_float32_operands_still_raise(op, dtype):
    low, high = it.ones(2, 3, 3, dtype=dtype), it.ones(2, 3, 3)
    calls = {"matmul": lambda: it.matmul(low, high), "linear": lambda: it.linear(low[0], high[0]),
             "einsum": lambda: it.einsum("bij,bjk->bik", low, high), "bmm": lambda: it.bmm(low, high)}
    with pytest.raises(ValueError, match="dtype"):
        calls[op]()
