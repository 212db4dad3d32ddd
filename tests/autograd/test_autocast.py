"""Autocast against torch.autocast: the dtype every op returns in a region (bfloat16 and float16 on CPU), casts
that are autograd ops (float32 leaves get float32 gradients), the cast cache, nesting, thread-locality (and
DataParallel's replicas), decorators, and the state queries."""
import threading

import numpy as np
import pytest
import torch

import infini_train as it
from infini_train.nn.parallel import DataParallel
from tests.torch_parity import dtype_name

RNG = np.random.default_rng(0)
X = RNG.standard_normal((4, 8)).astype(np.float32)
W = RNG.standard_normal((8, 8)).astype(np.float32)
IDX = np.array([1, 2, 3, 0])

OPS = {
    "matmul": lambda m, F, x, w, b: x @ w,
    "linear": lambda m, F, x, w, b: F.linear(x, w, w[0]),
    "bmm": lambda m, F, x, w, b: m.bmm(x[None], w[None]),
    "mm": lambda m, F, x, w, b: m.mm(x, w),
    "baddbmm": lambda m, F, x, w, b: m.baddbmm(x[None], x[None], w[None]),
    "einsum": lambda m, F, x, w, b: m.einsum("ij,jk->ik", x, w),
    "sdpa": lambda m, F, x, w, b: F.scaled_dot_product_attention(x[None, None], x[None, None], x[None, None]),
    "softmax_low": lambda m, F, x, w, b: b.softmax(-1),
    "softmax_f32": lambda m, F, x, w, b: x.softmax(-1),
    "log_softmax": lambda m, F, x, w, b: b.log_softmax(-1),
    "layer_norm": lambda m, F, x, w, b: F.layer_norm(b, (8,), m.ones(8), m.zeros(8)),
    "cross_entropy": lambda m, F, x, w, b: F.cross_entropy(b, m.tensor(IDX)),
    "nll_loss": lambda m, F, x, w, b: F.nll_loss(b, m.tensor(IDX)),
    "mse_loss": lambda m, F, x, w, b: F.mse_loss(b, b),
    "bce_logits": lambda m, F, x, w, b: F.binary_cross_entropy_with_logits(b, b.sigmoid()),
    "exp": lambda m, F, x, w, b: b.exp(),
    "log": lambda m, F, x, w, b: b.abs().log(),
    "sum": lambda m, F, x, w, b: b.sum(),
    "mean": lambda m, F, x, w, b: b.mean(),
    "pow": lambda m, F, x, w, b: b ** 2,
    "gelu": lambda m, F, x, w, b: F.gelu(b),
    "add_mixed": lambda m, F, x, w, b: b + x,
    "mul_mixed": lambda m, F, x, w, b: b * x,
    "embedding": lambda m, F, x, w, b: F.embedding(m.tensor(IDX), w),
    "tanh": lambda m, F, x, w, b: b.tanh(),
    "cat": lambda m, F, x, w, b: m.cat([b, x]),
    "relu": lambda m, F, x, w, b: b.relu(),
    "var": lambda m, F, x, w, b: b.var(),
    "prod": lambda m, F, x, w, b: (b * 0.1 + 1).prod(1),
    "logsumexp": lambda m, F, x, w, b: b.logsumexp(1),
    "norm": lambda m, F, x, w, b: b.norm(),
    "max": lambda m, F, x, w, b: b.max(),
    "rsqrt": lambda m, F, x, w, b: b.abs().rsqrt(),
    "cumsum": lambda m, F, x, w, b: b.cumsum(0),
    "float64": lambda m, F, x, w, b: x.double() @ w.double(),
    # torch's CPU fp32 list names reflection_pad1d/2d and replication_pad1d/2d/3d; the other pads keep the dtype
    "reflect_pad1d": lambda m, F, x, w, b: F.pad(b[None], (2, 1), mode="reflect"),
    "reflect_pad2d": lambda m, F, x, w, b: F.pad(b[None, None], (1, 2, 2, 1), mode="reflect"),
    "reflect_pad3d": lambda m, F, x, w, b: F.pad(b.reshape(1, 2, 2, 8), (1, 1, 1, 1, 1, 1), mode="reflect"),
    "replicate_pad1d": lambda m, F, x, w, b: F.pad(b[None], (2, 1), mode="replicate"),
    "replicate_pad2d": lambda m, F, x, w, b: F.pad(b[None, None], (1, 2, 2, 1), mode="replicate"),
    "replicate_pad3d": lambda m, F, x, w, b: F.pad(b.reshape(1, 2, 2, 8), (1, 1, 1, 1, 1, 1), mode="replicate"),
    "circular_pad2d": lambda m, F, x, w, b: F.pad(b[None, None], (1, 2, 2, 1), mode="circular"),
    "constant_pad": lambda m, F, x, w, b: F.pad(b, (1, 2)),
    "reflect_pad_f32": lambda m, F, x, w, b: F.pad(x[None], (2, 1), mode="reflect"),
}


def _run(m, name, low):
    F = m.nn.functional
    x, w = m.tensor(X), m.tensor(W)
    b = x.to(low)
    with m.autocast("cpu", dtype=low):
        return OPS[name](m, F, x, w, b)


@pytest.mark.parametrize("low", ["bfloat16", "float16"])
@pytest.mark.parametrize("name", list(OPS))
def test_each_op_returns_torchs_autocast_dtype(name, low):
    if name == "cat" and low == "float16":
        pytest.skip("torch's CPU autocast refuses cat of float16 with float32 ('Unexpected floating ScalarType')")
    ours, theirs = _run(it, name, getattr(it, low)), _run(torch, name, getattr(torch, low))
    assert dtype_name(ours) == dtype_name(theirs), f"{name}: {ours.dtype} vs torch's {theirs.dtype}"


def test_casts_are_autograd_ops_and_float32_leaves_get_float32_gradients():
    x = it.tensor(X, requires_grad=True)
    w = it.tensor(W, requires_grad=True)
    with it.autocast("cpu"):
        y = x @ w
        loss = it.nn.functional.cross_entropy(y, it.tensor(IDX))
    assert y.dtype == it.bfloat16 and loss.dtype == it.float32
    loss.backward()
    assert x.grad.dtype == it.float32 and w.grad.dtype == it.float32
    xt, wt = torch.tensor(X, requires_grad=True), torch.tensor(W, requires_grad=True)
    with torch.autocast("cpu", torch.bfloat16):
        torch.nn.functional.cross_entropy(xt @ wt, torch.tensor(IDX)).backward()
    # both round the product to bfloat16 (8 bits of mantissa); gradients then agree to a few bf16 ulps
    np.testing.assert_allclose(w.grad.numpy(), wt.grad.numpy(), rtol=3e-2, atol=3e-3)


def test_a_weight_used_twice_in_a_region_is_cast_once_and_the_cache_clears_on_exit():
    w = it.tensor(W, requires_grad=True)
    x = it.tensor(X)
    with it.autocast("cpu"):
        a, b = x @ w, x @ w
        with it.autocast("cpu"):  # nested regions share the cache
            c = x @ w
    cast_nodes = {id(out.grad_fn.next_functions[1][0]) for out in (a, b, c)}
    assert len(cast_nodes) == 1
    with it.autocast("cpu"):
        d = x @ w
    assert id(d.grad_fn.next_functions[1][0]) not in cast_nodes
    with it.autocast("cpu", cache_enabled=False):
        e, f = x @ w, x @ w
    assert e.grad_fn.next_functions[1][0] is not f.grad_fn.next_functions[1][0]
    h = it.tensor(X, requires_grad=True) * 1  # not a leaf: never cached
    with it.autocast("cpu"):
        g1, g2 = h @ w, h @ w
    assert g1.grad_fn.next_functions[0][0] is not g2.grad_fn.next_functions[0][0]


def test_nesting_disabling_and_device_types_like_torch():
    for m in (it, torch):
        x, w = m.tensor(X), m.tensor(W)
        with m.autocast("cpu", dtype=m.bfloat16):
            assert m.is_autocast_enabled("cpu") and m.get_autocast_dtype("cpu") == m.bfloat16
            with m.autocast("cpu", enabled=False):
                assert (x @ w).dtype == m.float32 and not m.is_autocast_enabled("cpu")
            with m.autocast("cpu", dtype=m.float16):
                assert (x @ w).dtype == m.float16
            assert (x @ w).dtype == m.bfloat16
        with m.autocast("cuda", enabled=False):
            pass
        assert not m.is_autocast_enabled("cpu") and (x @ w).dtype == m.float32
    with it.autocast("cuda"):  # a CUDA region leaves CPU ops alone
        assert (it.tensor(X) @ it.tensor(W)).dtype == it.float32


def test_autocast_is_thread_local_and_dataparallel_replicas_reapply_it():
    seen = []
    with it.autocast("cpu"):
        t = threading.Thread(target=lambda: seen.append((it.is_autocast_enabled("cpu"),
                                                         (it.tensor(X) @ it.tensor(W)).dtype)))
        t.start()
        t.join()
    assert seen == [(False, it.float32)]
    it.manual_seed(0)
    model = DataParallel(it.nn.Linear(8, 8).to("cpu:0"), device_ids=["cpu:0", "cpu:1"])
    with it.autocast("cpu"):
        out = model(it.tensor(np.concatenate([X, X]), device="cpu:0"))
    assert out.dtype == it.bfloat16
    with it.no_grad():
        single = it.nn.functional.linear(it.tensor(X).to(it.bfloat16), model.module.weight.to(it.bfloat16),
                                         model.module.bias.to(it.bfloat16))
    np.testing.assert_array_equal(out.float().numpy()[:4], single.float().numpy())


def test_decorator_and_generator_forms():
    @it.autocast("cpu")
    def product():
        return it.tensor(X) @ it.tensor(W)

    @it.amp.autocast("cpu", dtype=it.float16)
    def products():
        yield it.tensor(X) @ it.tensor(W)
        yield it.tensor(X) @ it.tensor(W)

    assert product().dtype == it.bfloat16 and not it.is_autocast_enabled("cpu")
    gen = products()
    assert next(gen).dtype == it.float16 and not it.is_autocast_enabled("cpu")
    assert next(gen).dtype == it.float16


def test_bad_arguments_are_clear():
    with pytest.raises(ValueError, match="autocast: expected device_type 'cpu' or 'cuda', got 'gpu'"):
        it.autocast("gpu")
    with pytest.raises(TypeError):  # torch: get_autocast_dtype() missing 1 required positional argument
        torch.get_autocast_dtype()
    with pytest.raises(TypeError, match="device_type"):
        it.get_autocast_dtype()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_an_unsupported_dtype_warns_and_runs_without_autocast_like_torch(dtype):
    def region(m):
        with pytest.warns(UserWarning, match="In CPU autocast, but the target dtype .*is not supported. Disabling "
                                             "autocast"):
            guard = m.autocast("cpu", dtype=getattr(m, dtype))
        with guard:
            x = m.tensor(X)
            return str((x @ x.T).dtype), m.is_autocast_enabled("cpu"), str(m.get_autocast_dtype("cpu"))

    ours, theirs = region(it), region(torch)
    assert ours == tuple(v.replace("torch.", "") if isinstance(v, str) else v for v in theirs)
    assert ours[:2] == ("float32", False)
    with it.autocast("cpu", dtype=it.bfloat16):  # inside an enabled region it turns autocast off, as torch
        with pytest.warns(UserWarning):
            inner = it.autocast("cpu", dtype=getattr(it, dtype))
        with inner:
            assert not it.is_autocast_enabled("cpu")
        assert it.is_autocast_enabled("cpu") and it.get_autocast_dtype("cpu") == it.bfloat16
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with it.autocast("cpu", dtype=getattr(it, dtype), enabled=False):  # disabled: nothing to warn about
            assert not it.is_autocast_enabled("cpu")


@pytest.mark.parametrize("low", ["bfloat16", "float16"])
@pytest.mark.parametrize("inputs", ["float32", "low", "low_with_float32_weight"])
def test_rms_norm_is_left_alone_by_cpu_autocast_like_torch(inputs, low):
    # torch's CPU autocast lists no rms_norm: a float32 input stays float32, a low one stays low
    import warnings

    def run(m):
        x = m.tensor(X) if inputs == "float32" else m.tensor(X).to(getattr(m, low))
        w = m.ones(8) if inputs != "low" else m.ones(8).to(getattr(m, low))
        with m.autocast("cpu", dtype=getattr(m, low)):
            return m.nn.functional.rms_norm(x, (8,), w), m.nn.RMSNorm(8)(x)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: "Mismatch dtype between input and weight"
        theirs = run(torch)
    for a, b in zip(run(it), theirs):
        assert dtype_name(a) == dtype_name(b)
        np.testing.assert_allclose(a.float().numpy(), b.detach().float().numpy(), rtol=1e-2, atol=1e-2)


def test_rms_norm_runs_in_float32_under_cuda_autocast():
    # torch's CUDA autocast puts rms_norm on its fp32 list (AT_FORALL_FP32 in ATen/autocast_mode.h); the CPU
    # table has no entry for it
    from types import SimpleNamespace

    from infini_train.autograd import autocast as ac
    from infini_train.autograd.ops.rms_norm import RMSNorm

    assert ac.policy("cuda")[RMSNorm] == ac.FP32 and RMSNorm not in ac.policy("cpu")
    x, w = it.tensor(X).to(it.float16), it.ones(8).to(it.float16)
    with it.autocast("cuda"):
        cast = ac.cast_inputs(RMSNorm((8,)), (x, w), SimpleNamespace(type="cuda"))
    assert [t.dtype for t in cast] == [it.float32, it.float32]
    np.testing.assert_array_equal(cast[0].numpy(), x.float().numpy())
