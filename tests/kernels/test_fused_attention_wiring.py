"""scaled_dot_product_attention's route to the tensor-core kernels (autograd/ops/fused_attention.py), on the CPU: with
the candidate switch off, or on with host arrays, nothing changes (the same Op, bit for bit); with the kernel's NumPy
reference standing in for the kernel launches (as if on a GPU), the Op takes the fused route when the switch names
it, gives the reference's results bit for bit (forward, the three gradients, dropout's seed) and a double backward
still runs."""
import numpy as np
import pytest

import infini_train as it
import infini_train.nn.functional as F
from infini_train.autograd.ops import fused_attention
from infini_train.autograd.ops.attention import ScaledDotProductAttention
from infini_train.autograd.ops.attention_dropout import draw_seed
from infini_train.kernels import flash_attention as flash
from infini_train.kernels import registry
from infini_train.kernels.reference import flash_attention as ref


def _inputs(dtype=it.bfloat16, heads=4, kv_heads=2, tq=80, tk=80, dim=64):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, heads, tq, dim)).astype(dtype)
    k, v = (rng.standard_normal((2, kv_heads, tk, dim)).astype(dtype) for _ in range(2))
    return q, k, v, rng.standard_normal(q.shape).astype(dtype)


def _run(q, k, v, g, causal=True, dropout_p=0.0, create_graph=False):
    tensors = [it.tensor(a, requires_grad=True) for a in (q, k, v)]
    it.manual_seed(11)
    out = F.scaled_dot_product_attention(*tensors, is_causal=causal, dropout_p=dropout_p,
                                         enable_gqa=q.shape[1] != k.shape[1])
    out.backward(it.tensor(g), create_graph=create_graph)
    return out, tensors


@pytest.fixture
def reference_kernel(monkeypatch):
    """The kernel launches replaced by the reference, and the device checks by 'yes' (the CPU as a GPU)."""
    monkeypatch.setattr(fused_attention, "applies", lambda q, k, v: True)
    monkeypatch.setattr(flash, "why_not", lambda *a, **kw: None if registry.use(flash.NAME) else "off")
    monkeypatch.setattr(flash, "ready", lambda dtype, dim: True)
    monkeypatch.setattr(flash, "forward", lambda cp, *a: ref.forward(*a))
    monkeypatch.setattr(flash, "backward", lambda cp, *a: ref.backward(*a))


def test_off_by_default_and_on_the_host_nothing_changes():
    q, k, v, g = _inputs()
    results = []
    for spec in ("none", "candidate"):
        with registry.selected(spec):
            out, tensors = _run(q, k, v, g)
            assert type(out.grad_fn) is ScaledDotProductAttention  # the host never takes the kernels
            results.append([out.numpy()] + [t.grad.numpy() for t in tensors])
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dropout_p", [0.0, 0.25])
def test_the_candidate_switch_routes_to_the_kernel_with_its_results(reference_kernel, dropout_p):
    q, k, v, g = _inputs()
    with registry.selected("flash_attention"):
        out, tensors = _run(q, k, v, g, dropout_p=dropout_p)
    assert type(out.grad_fn) is fused_attention.FusedAttention and out.grad_fn.fused
    it.manual_seed(11)
    seed = draw_seed(it.device("cpu")) if dropout_p else None
    want_out, lse = ref.forward(q, k, v, 0.125, True, 0, seed, dropout_p)
    want = [want_out, *ref.backward(q, k, v, want_out, lse, g, 0.125, True, 0, seed, dropout_p)]
    for a, b in zip([out.numpy()] + [t.grad.numpy() for t in tensors], want):
        np.testing.assert_array_equal(a, b)
    with registry.selected("none"):  # and close to the array path, which the switch leaves alone
        array_out, array_tensors = _run(q, k, v, g, dropout_p=dropout_p)
    assert type(array_out.grad_fn) is ScaledDotProductAttention
    for a, b in zip([out] + [t.grad for t in tensors], [array_out] + [t.grad for t in array_tensors]):
        b = b.numpy().astype(np.float64)
        assert np.abs(a.numpy().astype(np.float64) - b).max() <= 1.2e-2 * np.abs(b).max()


def test_arrays_the_kernel_does_not_take_run_the_array_path(reference_kernel, monkeypatch):
    monkeypatch.setattr(flash, "why_not", lambda *a, **kw: "head dim 32")
    q, k, v, g = _inputs(dim=32)
    with registry.selected():
        out, tensors = _run(q, k, v, g)
    assert type(out.grad_fn) is fused_attention.FusedAttention and not out.grad_fn.fused
    with registry.selected("none"):
        want_out, want_tensors = _run(q, k, v, g)
    for a, b in zip([out] + [t.grad for t in tensors], [want_out] + [t.grad for t in want_tensors]):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_a_mask_or_a_forced_backend_keeps_the_array_path(reference_kernel):
    q, k, v, _ = _inputs()
    tensors = [it.tensor(a) for a in (q, k, v)]
    with registry.selected():
        masked = F.scaled_dot_product_attention(*tensors, attn_mask=it.tensor(np.ones((80, 80), bool)),
                                                enable_gqa=True)
        assert type(masked.grad_fn) is not fused_attention.FusedAttention
        from infini_train.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.MATH):
            forced = F.scaled_dot_product_attention(*[t.requires_grad_() for t in tensors], enable_gqa=True)
        assert type(forced.grad_fn) is ScaledDotProductAttention


def test_double_backward_through_the_fused_op(reference_kernel):
    q, k, v, g = _inputs(kv_heads=4, tq=40, tk=40)
    grads = []
    for spec in ("flash_attention", "none"):
        with registry.selected(spec):
            tensors = [it.tensor(a.astype(np.float32), requires_grad=True) for a in (q, k, v)]
            out = F.scaled_dot_product_attention(*[t.to(it.bfloat16) for t in tensors], is_causal=True)
            (grad_q,) = it.autograd.grad(out, tensors[0], it.tensor(g), create_graph=True)
            (grad_q.float() ** 2).sum().backward()
            grads.append([t.grad.numpy() for t in tensors])
    for a, b in zip(*grads):
        assert np.abs(a - b).max() <= 5e-2 * np.abs(b).max()
