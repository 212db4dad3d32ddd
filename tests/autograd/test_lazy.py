"""Lazy mode (it.lazy): deferred computation, realisation triggers, unused results, in-place writes and views,
element-wise fusion (bit for bit against eager mode), contexts and threads."""
import threading

import numpy as np
import pytest

import infini_train as it
from infini_train.autograd.ops import elementwise
from infini_train.lazy_mode import fusion
from infini_train.lazy_mode.graph import LazyTensor


def _bits(t):
    a = t.numpy() if isinstance(t, it.Tensor) else t
    return a.dtype, a.shape, np.ascontiguousarray(a).tobytes()


class SpyExp(elementwise.Exp):
    """Exp counting its real computations (dtype inference runs forward before apply has set the device)."""

    calls = 0

    def forward(self, a):
        if self.device is not None:
            SpyExp.calls += 1
        return super().forward(a)


@pytest.fixture
def spy(monkeypatch):
    monkeypatch.setattr(fusion, "ELEMENTWISE", fusion.ELEMENTWISE | {SpyExp})
    SpyExp.calls = 0
    return lambda x: SpyExp().apply(x)


@pytest.fixture
def stats():
    it.lazy.reset_fusion_stats()
    return it.lazy.fusion_stats


def _x(*shape, seed=0, dtype=np.float32):
    return it.tensor(np.random.default_rng(seed).uniform(-2, 2, shape).astype(dtype))


# ------------------------------------------------------------------------------------- deferral and triggers
def test_ops_are_deferred_and_metadata_needs_no_computation(spy):
    x = _x(4, 3)
    with it.lazy():
        y = spy(x) * 2 + 1
        assert isinstance(y, LazyTensor) and SpyExp.calls == 0
        assert y.shape == (4, 3) and y.dtype == it.float32 and y.ndim == 2 and y.numel() == 12
        assert y.requires_grad is False and isinstance(y, LazyTensor) and SpyExp.calls == 0
        assert (y > 0).dtype == it.bool and (x.long() + 2.5).dtype == it.float32
        assert isinstance(y, LazyTensor)


@pytest.mark.parametrize("trigger", ["numpy", "item", "tolist", "repr", "str", "array", "float", "backward"])
def test_each_trigger_realises(trigger, spy):
    x = it.tensor(np.array([0.5], np.float32), requires_grad=True)
    with it.lazy():
        y = spy(x) * 3
        assert SpyExp.calls == 0
        if trigger == "backward":
            y.sum().backward()
            np.testing.assert_allclose(x.grad.numpy(), 3 * np.exp([0.5]), rtol=1e-6)
        else:
            value = {"numpy": lambda: y.numpy(), "item": lambda: y.item(), "tolist": lambda: y.tolist(),
                     "repr": lambda: repr(y), "str": lambda: str(y), "array": lambda: y.array,
                     "float": lambda: float(y)}[trigger]()
            assert value is not None
        assert SpyExp.calls == 1 and type(y) is it.Tensor
        assert y.grad_fn is not None and y.grad_fn.name == "Mul"


def test_leaving_the_block_realises_what_is_referenced(spy):
    x = _x(3, 5)
    with it.lazy():
        kept = spy(x) + 1
        assert isinstance(kept, LazyTensor)
    assert type(kept) is it.Tensor and SpyExp.calls == 1
    np.testing.assert_array_equal(kept.numpy(), np.exp(x.numpy()) + 1)


def test_unused_results_are_never_computed(spy):
    x = _x(6, 2)
    with it.lazy():
        spy(x)  # dropped at once
        a = spy(x)
        del a
        b = spy(x) * 2  # the intermediate is needed by b
        c = spy(x)
        d = c + 1
        del c, d  # a dead chain
    assert SpyExp.calls == 1
    np.testing.assert_array_equal(b.numpy(), np.exp(x.numpy()) * 2)


def test_realising_one_result_computes_only_its_dependencies(spy):
    x = _x(6, 2)
    with it.lazy():
        a = spy(x) + 1
        b = spy(x) * 2
        a.numpy()
        assert SpyExp.calls == 1 and isinstance(b, LazyTensor)
        a2 = a * 5  # built on a realised tensor
    assert SpyExp.calls == 2
    np.testing.assert_array_equal(a2.numpy(), (np.exp(x.numpy()) + 1) * 5)


def test_backward_and_graph_match_eager():
    def model(w, b, x):
        h = (x @ w + b).tanh()
        return ((h * h).sum(dim=1) + h.mean()).sigmoid().sum()

    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in [(5, 4), (4,), (3, 5)]]
    results = []
    for lazy in (False, True):
        w, b = (it.tensor(a, requires_grad=True) for a in arrays[:2])
        x = it.tensor(arrays[2])
        with it.lazy(lazy):
            loss = model(w, b, x)
            loss.backward()
        results.append([_bits(loss), _bits(w.grad), _bits(b.grad), loss.grad_fn.name])
    assert results[0] == results[1]


# ----------------------------------------------------------------------------------------- contexts, threads
def test_nested_contexts_and_lazy_false():
    x = _x(3)
    assert not it.is_lazy_enabled()
    with it.lazy():
        with it.lazy():
            a = x + 1
        assert it.is_lazy_enabled() and isinstance(a, LazyTensor)  # an inner exit keeps the outer block lazy
        with it.lazy(False):
            assert not it.is_lazy_enabled()
            b = x + 2
            assert type(b) is it.Tensor
            c = a * 2  # eager use of a lazy tensor realises it
            assert type(a) is it.Tensor and type(c) is it.Tensor
        assert it.is_lazy_enabled()
        d = x * 3
    assert not it.is_lazy_enabled() and type(d) is it.Tensor
    np.testing.assert_array_equal(c.numpy(), (x.numpy() + 1) * 2)


def test_decorator_and_exception_exit():
    @it.lazy()
    def f(x):
        assert it.is_lazy_enabled()
        return x * 2

    x = _x(3)
    np.testing.assert_array_equal(f(x).numpy(), x.numpy() * 2)
    with pytest.raises(KeyError):
        with it.lazy():
            y = x + 1
            raise KeyError("boom")
    assert not it.is_lazy_enabled()
    np.testing.assert_array_equal(y.numpy(), x.numpy() + 1)  # still realisable afterwards


def test_lazy_mode_is_per_thread():
    x = _x(4)
    seen = {}
    inside = threading.Event()
    done = threading.Event()

    def other():
        inside.wait()
        seen["enabled"] = it.is_lazy_enabled()
        seen["type"] = type(x + 1)
        done.set()

    t = threading.Thread(target=other)
    t.start()
    with it.lazy():
        y = x + 1
        inside.set()
        done.wait(10)
        assert isinstance(y, LazyTensor)
    t.join()
    assert seen == {"enabled": False, "type": it.Tensor}


def test_a_lazy_tensor_realised_from_another_thread():
    x = _x(4)
    with it.lazy():
        y = (x + 1) * 2
        out = {}
        t = threading.Thread(target=lambda: out.setdefault("v", y.numpy()))
        t.start()
        t.join()
    np.testing.assert_array_equal(out["v"], (x.numpy() + 1) * 2)


# ------------------------------------------------------------------------------------------ in-place and views
def _script(lazy):
    """In-place writes on tensors that pending lazy results read (directly and through views)."""
    x = _x(4, 3)
    base = _x(3, 4, seed=1)
    with it.lazy(lazy):
        y = x * 2  # reads x before each write below
        x.add_(1)
        z = x.exp()
        x[0] = 7.0
        v = base.transpose(0, 1)  # a lazy view
        w = v * 2  # reads base through the view
        base.mul_(3)  # v sees the write (a view), w does not
        t = x + 1
        t.mul_(2)  # in place on a lazy result
        u = x.clone()
        u.copy_(y)
        s = y.sigmoid()
        y.data = _x(4, 3, seed=2)  # replaces y's array: s was computed from the old one
        outs = [y, z, v, w, t, u, s, x, base]
    return [_bits(o) for o in outs]


def test_inplace_writes_and_views_behave_as_in_eager():
    assert _script(True) == _script(False)


def test_inplace_with_grad_on_lazy_results():
    def run(lazy):
        w = it.tensor(np.arange(1, 7, dtype=np.float32).reshape(2, 3), requires_grad=True)
        with it.lazy(lazy):
            h = w * 2
            h.add_(1)
            h[0, 1] = 0.5
            loss = (h * w).sum()
            loss.backward()
        return _bits(loss), _bits(w.grad)

    assert run(True) == run(False)


# ------------------------------------------------------------------------------------------------- fusion
def _chain(x, b, c, m):
    y = (x * 1.5 + b).exp()  # a broadcast operand
    y = y.tanh() * x - c  # a column broadcast
    y = it.nn.functional.gelu(y, approximate="tanh").sigmoid()
    y = it.where(m, y, -y)  # a bool condition
    return (y.relu() + 0.25).sqrt()


def _fusion_inputs(n=300, k=700):
    rng = np.random.default_rng(3)
    x = it.tensor(rng.standard_normal((n, k)).astype(np.float32))
    b = it.tensor(rng.standard_normal(k).astype(np.float32))
    c = it.tensor(rng.standard_normal((n, 1)).astype(np.float32))
    m = it.tensor(rng.standard_normal((n, k)) > 0)
    return x, b, c, m


def test_a_chain_fuses_into_one_group_bit_for_bit(stats):
    inputs = _fusion_inputs()
    eager = _chain(*inputs)
    with it.lazy():
        lazy = _chain(*inputs)
    assert stats()["groups"] == 1 and stats()["fused_nodes"] == 13 and stats()["blocks"] > 1
    assert _bits(lazy) == _bits(eager)


@pytest.mark.parametrize("block", [1, 7, 700, 4096, 1 << 20])
def test_block_size_does_not_change_a_bit(block, monkeypatch, stats):
    monkeypatch.setattr(fusion, "BLOCK", block)
    inputs = _fusion_inputs(40, 3000)
    eager = _chain(*inputs)
    with it.lazy():
        lazy = _chain(*inputs)
    assert stats()["groups"] == 1
    assert _bits(lazy) == _bits(eager)


@pytest.mark.parametrize("case", ["float16", "int_and_float_scalar", "float64_0d", "bfloat16", "comparisons",
                                  "integer_math", "float64"])
def test_mixed_dtypes_fuse_bit_for_bit(case, stats):
    rng = np.random.default_rng(4)
    a = rng.standard_normal((256, 512)).astype(np.float32)

    def chain():
        x = it.tensor(a)
        if case == "float16":
            return ((x.half() * 0.5).exp() - 1).float() * 0.5
        if case == "bfloat16":
            return (x.to(it.bfloat16).sigmoid() + 1).tanh().float()
        if case == "int_and_float_scalar":
            i = it.tensor((a * 10).astype(np.int32))
            return ((i + 2.5) * i).abs().sqrt()
        if case == "float64_0d":
            s = it.tensor(np.float64(1.25))
            return ((x * s + s).exp() * x).double() / 3
        if case == "comparisons":
            return (((x > 0) & (x.abs() < 1)) | x.isnan()).logical_not()
        if case == "integer_math":
            i = it.tensor((a * 100).astype(np.int64))
            return ((i // 3) % 7 - i.clamp(-5, 5)) * 2
        return (x.double().sin() * 2).cos()

    eager = chain()
    with it.lazy():
        lazy = chain()
    assert stats()["groups"] == 1
    assert _bits(lazy) == _bits(eager)


def test_no_fusion_when_grad_is_recorded_but_same_values_and_grads(stats):
    def run(lazy):
        x = it.tensor(np.linspace(-2, 2, 300 * 400, dtype=np.float32).reshape(300, 400), requires_grad=True)
        with it.lazy(lazy):
            y = ((x * 2).exp().tanh() + x).sigmoid()
            y.sum().backward()
        return _bits(y), _bits(x.grad)

    assert run(True) == run(False)
    assert stats()["groups"] == 0


def test_a_referenced_intermediate_ends_a_group(stats):
    x, *_ = _fusion_inputs()
    with it.lazy():
        mid = (x * 2).exp()  # kept: materialised, the root of its own group
        out = (mid + 1).tanh()
    assert stats()["groups"] == 2
    assert _bits(mid) == _bits((x * 2).exp()) and _bits(out) == _bits(((x * 2).exp() + 1).tanh())


def test_non_contiguous_input_runs_node_by_node(stats):
    x, *_ = _fusion_inputs()
    xt = it.tensor(np.asfortranarray(x.numpy()))
    with it.lazy():
        y = (xt * 2).exp() + 1
    assert stats()["groups"] == 0
    assert _bits(y) == _bits((xt * 2).exp() + 1)
    assert y.numpy().flags.f_contiguous == ((xt * 2).exp() + 1).numpy().flags.f_contiguous


def test_errors_surface_at_the_op_as_in_eager():
    with it.lazy():
        with pytest.raises(ValueError, match=r"(?s)Add: .*\(2, 3\).*\(4,\)"):
            it.ones(2, 3) + it.ones(4)
        with pytest.raises(ValueError, match="Where: expected a bool condition"):
            it.where(it.ones(3), it.ones(3), 0.0)


@pytest.mark.cuda
def test_fusion_on_gpu_matches_eager(stats):
    pytest.importorskip("cupy")
    if it.device_count("cuda") < 1:
        pytest.skip("no GPU")
    x, b, c, m = (t.to("cuda:0") for t in _fusion_inputs(512, 4096))
    eager = _chain(x, b, c, m)
    with it.lazy():
        lazy = _chain(x, b, c, m)
    assert stats()["groups"] == 1
    assert _bits(lazy) == _bits(eager)
