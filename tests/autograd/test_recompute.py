import contextlib
import gc
import types
import weakref

import numpy as np
import pytest
import torch
import torch.utils.checkpoint

import infini_train as it
import infini_train.run_state  # noqa: F401  (the run's checkpoints: not it.utils.checkpoint)
from infini_train import backend
from infini_train.autograd import recompute
from infini_train.models.gpt2 import Block, GPT2Config
from infini_train.nn import functional as F

checkpoint = it.utils.checkpoint.checkpoint
checkpoint_sequential = it.utils.checkpoint.checkpoint_sequential


@pytest.fixture(autouse=True)
def _clean_forks():
    forks = dict(backend._forks)
    yield
    backend._forks.clear()
    backend._forks.update(forks)


def _data(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


class MLP(it.nn.Module):
    def __init__(self, p=0.0):
        super().__init__()
        self.fc1, self.fc2, self.p = it.nn.Linear(6, 16), it.nn.Linear(16, 5), p

    def forward(self, x):
        return self.fc2(F.dropout(F.gelu(self.fc1(x)), self.p, self.training))


def _run(module, x_np, use_checkpoint, seed=7, **kwargs):
    """Forward + backward from a fixed seed; the gradients, the output and the next random draw."""
    module.zero_grad()
    x = it.tensor(x_np, requires_grad=True)
    it.manual_seed(seed)
    y = checkpoint(module, x, **kwargs) if use_checkpoint else module(x)
    (y * it.tensor(_data(*y.shape, seed=9))).sum().backward()
    grads = {"input": x.grad.numpy().copy()}
    grads.update({n: p.grad.numpy().copy() for n, p in module.named_parameters()})
    return grads, y.numpy().copy(), it.rand(4).numpy()


def _assert_grads_equal(ours, theirs, rtol=1e-6, atol=0.0):
    assert ours.keys() == theirs.keys()
    for name in theirs:
        np.testing.assert_allclose(ours[name], theirs[name], rtol=rtol, atol=atol, err_msg=name)


# ----------------------------------------------------------------------------------- gradients and the RNG
@pytest.mark.parametrize("use_reentrant", [None, True, False])
def test_mlp_with_dropout_same_gradients_and_rng_as_without_checkpoint(use_reentrant):
    it.manual_seed(0)
    mlp = MLP(p=0.5)
    x = _data(8, 6)
    plain, y_plain, next_plain = _run(mlp, x, False)
    ckpt, y_ckpt, next_ckpt = _run(mlp, x, True, use_reentrant=use_reentrant)
    np.testing.assert_array_equal(y_ckpt, y_plain)
    _assert_grads_equal(ckpt, plain)
    np.testing.assert_array_equal(next_ckpt, next_plain)  # the stream is where the plain run left it
    assert (y_plain == 0).sum() == 0 and (plain["fc2.weight"] != 0).all()  # sanity: gradients are not trivial


def test_gpt2_block_with_dropout_same_gradients_and_rng():
    it.manual_seed(0)
    block = Block(GPT2Config(block_size=16, vocab_size=32, n_layer=1, n_head=4, n_embd=32, dropout=0.1))
    block.train()
    x = _data(2, 16, 32)
    plain, y_plain, next_plain = _run(block, x, False)
    ckpt, y_ckpt, next_ckpt = _run(block, x, True, use_reentrant=False)
    np.testing.assert_array_equal(y_ckpt, y_plain)
    _assert_grads_equal(ckpt, plain)
    np.testing.assert_array_equal(next_ckpt, next_plain)
    other, _, _ = _run(block, x, False, seed=8)  # another seed draws other masks: dropout is really on
    assert not np.allclose(other["input"], plain["input"])


def test_without_preserve_rng_state_the_masks_are_not_replayed():
    it.manual_seed(0)
    mlp = MLP(p=0.5)
    x = _data(8, 6)
    plain, _, _ = _run(mlp, x, False)
    ckpt, _, _ = _run(mlp, x, True, preserve_rng_state=False)
    assert not np.allclose(ckpt["input"], plain["input"])


def test_mlp_matches_torch_utils_checkpoint():
    it.manual_seed(0)
    mlp = MLP()
    ref = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.GELU(), torch.nn.Linear(16, 5))
    with torch.no_grad():
        for (_, p), q in zip(mlp.named_parameters(), ref.parameters()):
            q.copy_(torch.from_numpy(p.numpy()))
    x_np, g_np = _data(8, 6), _data(8, 5, seed=9)
    ours, _, _ = _run(mlp, x_np, True, use_reentrant=False)
    x = torch.tensor(x_np, requires_grad=True)
    y = torch.utils.checkpoint.checkpoint(ref, x, use_reentrant=False)
    (y * torch.from_numpy(g_np)).sum().backward()
    theirs = {"input": x.grad.numpy(), "fc1.weight": ref[0].weight.grad.numpy(), "fc1.bias": ref[0].bias.grad.numpy(),
              "fc2.weight": ref[2].weight.grad.numpy(), "fc2.bias": ref[2].bias.grad.numpy()}
    _assert_grads_equal(ours, theirs, rtol=1e-5, atol=1e-6)


def test_forked_stream_is_replayed_and_left_where_the_plain_run_left_it():
    def f(x):
        with backend.fork_rng("x"):
            x = F.dropout(x, 0.5)
        return F.dropout(x * x, 0.3)  # and one draw from the default stream

    def run(use_checkpoint):
        backend.seed_fork("x", 1)
        it.manual_seed(3)
        x = it.tensor(_data(50), requires_grad=True)
        y = checkpoint(f, x) if use_checkpoint else f(x)
        y.sum().backward()
        with backend.fork_rng("x"):
            fork_next = it.rand(3).numpy()
        return x.grad.numpy(), y.numpy(), fork_next, it.rand(3).numpy()

    for ours, theirs in zip(run(True), run(False)):
        np.testing.assert_array_equal(ours, theirs)


def test_checkpoint_inside_a_fork_replays_the_fork():
    backend.seed_fork("x", 5)
    it.manual_seed(0)
    x = it.tensor(_data(40), requires_grad=True)
    with backend.fork_rng("x"):
        y = checkpoint(lambda a: F.dropout(a, 0.5), x)
        y.sum().backward()
        after = it.rand(2).numpy()
    keep = y.numpy() != 0
    np.testing.assert_allclose(x.grad.numpy(), np.where(keep, 2.0, 0.0))
    backend.seed_fork("x", 5)
    with backend.fork_rng("x"):
        F.dropout(it.ones(40), 0.5)
        np.testing.assert_array_equal(it.rand(2).numpy(), after)


def test_backward_inside_a_fork_replays_the_default_stream():
    backend.seed_fork("x", 5)
    it.manual_seed(0)
    x = it.tensor(_data(40), requires_grad=True)
    y = checkpoint(lambda a: F.dropout(a, 0.5), x)  # draws from the default stream
    with backend.fork_rng("x"):  # the current stream is the fork while backward runs
        y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.where(y.numpy() != 0, 2.0, 0.0))


def test_nested_checkpoint_inside_a_fork():
    def f(a, nested):
        with backend.fork_rng("x"):
            h = checkpoint(lambda t: F.dropout(t, 0.5), a) if nested else F.dropout(a, 0.5)
        return F.dropout(h * a, 0.2)

    def run(use_checkpoint):
        backend.seed_fork("x", 5)
        it.manual_seed(0)
        x = it.tensor(_data(40), requires_grad=True)
        y = checkpoint(f, x, True) if use_checkpoint else f(x, False)
        y.sum().backward()
        with backend.fork_rng("x"):
            fork_next = it.rand(2).numpy()
        return x.grad.numpy(), y.numpy(), fork_next, it.rand(2).numpy()

    for ours, theirs in zip(run(True), run(False)):
        np.testing.assert_array_equal(ours, theirs)


def test_autocast_state_is_replayed():
    it.manual_seed(0)
    mlp = MLP()
    x_np = _data(8, 6)
    seen = []

    def f(x):
        seen.append((it.is_autocast_enabled("cpu"), it.get_autocast_dtype("cpu")))
        return mlp(x)

    def run(use_checkpoint):
        mlp.zero_grad()
        x = it.tensor(x_np, requires_grad=True)
        with it.autocast("cpu", it.bfloat16):
            y = checkpoint(f, x) if use_checkpoint else f(x)
        assert y.dtype == it.bfloat16
        y.float().sum().backward()  # outside the region, as usual
        return [x.grad.numpy()] + [p.grad.numpy() for p in mlp.parameters()]

    plain = run(False)
    seen.clear()
    ckpt = run(True)
    assert seen == [(True, it.bfloat16)] * 2  # the forward and the recomputation
    assert not it.is_autocast_enabled("cpu")
    for a, b in zip(ckpt, plain):
        np.testing.assert_allclose(a, b, rtol=1e-6)


# ------------------------------------------------------------------------------------- inputs and outputs
def test_tuple_outputs_non_tensor_arguments_and_inputs_without_grad():
    w = it.tensor(_data(4, 3), requires_grad=True)

    def f(x, mask, scale, *, bias, note="n"):
        h = (x @ w) * scale + bias["b"]
        return h, note, (h * mask).sum(), it.argmax(h, dim=1), [x.sum() * 2.0]

    def run(use_checkpoint):
        w.grad = None
        x = it.tensor(_data(5, 4), requires_grad=True)
        b = it.tensor(_data(3, seed=2), requires_grad=True)
        mask = it.tensor((_data(5, 3, seed=3) > 0).astype(np.float32))
        args = (f, x, mask, 0.5)
        out = checkpoint(*args, bias={"b": b}, note="ok") if use_checkpoint else f(*args[1:], bias={"b": b}, note="ok")
        h, note, s, idx, (t,) = out
        assert note == "ok" and not idx.requires_grad and not mask.requires_grad
        (h.sum() + 3.0 * s + t).backward()
        return x.grad.numpy(), b.grad.numpy(), w.grad.numpy(), idx.numpy()

    for ours, theirs in zip(run(True), run(False)):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6)


def test_only_some_outputs_used_and_unused_input():
    x = it.tensor(_data(3, 4), requires_grad=True)
    unused = it.tensor(_data(2), requires_grad=True)
    a, b = checkpoint(lambda x, u: (x.exp(), x * 3.0), x, unused)
    b.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.full((3, 4), 3.0))
    assert unused.grad is None


def test_autograd_grad_through_checkpoint_leaves_dot_grad_alone():
    it.manual_seed(0)
    mlp = MLP()
    x = it.tensor(_data(8, 6), requires_grad=True)
    (gx,) = it.autograd.grad(mlp(x).pow(2).sum(), x)
    (gx_ckpt,) = it.autograd.grad(checkpoint(mlp, x).pow(2).sum(), x)
    np.testing.assert_allclose(gx_ckpt.numpy(), gx.numpy(), rtol=1e-6)
    assert x.grad is None and all(p.grad is None for p in mlp.parameters())
    gw = it.autograd.grad(mlp(x).sum(), mlp.fc1.weight)[0]  # a parameter used only inside the function
    gw_ckpt = it.autograd.grad(checkpoint(mlp, x).sum(), mlp.fc1.weight)[0]
    np.testing.assert_allclose(gw_ckpt.numpy(), gw.numpy(), rtol=1e-6)


def test_no_input_requires_grad_parameters_still_get_gradients():
    it.manual_seed(0)
    mlp = MLP()
    x = it.tensor(_data(8, 6))
    checkpoint(mlp, x).sum().backward()
    expected = [p.grad.numpy().copy() for p in mlp.parameters()]
    mlp.zero_grad()
    mlp(x).sum().backward()
    for a, p in zip(expected, mlp.parameters()):
        np.testing.assert_allclose(a, p.grad.numpy(), rtol=1e-6)
    out = checkpoint(lambda a: a * 2.0, x)  # nothing requires grad at all: plain result
    assert not out.requires_grad and out.grad_fn is None


def test_captured_non_leaf_tensor_gets_its_gradient():
    x = it.tensor(_data(4), requires_grad=True)
    y = it.tensor(_data(4, seed=1), requires_grad=True)
    h = x * 2.0  # built before the call and captured by it
    out = checkpoint(lambda a: (a * h).sin(), y)
    (out.sum() + h.sum()).backward()
    xv, yv = _data(4), _data(4, seed=1)
    c = np.cos(yv * 2 * xv)
    np.testing.assert_allclose(y.grad.numpy(), c * 2 * xv, rtol=1e-5)
    np.testing.assert_allclose(x.grad.numpy(), c * 2 * yv + 2.0, rtol=1e-5)


def test_function_returning_its_input_and_a_parameter():
    w = it.tensor(_data(3), requires_grad=True)
    x = it.tensor(_data(3, seed=1), requires_grad=True)
    a, b = checkpoint(lambda t: (t, w), x)
    (2.0 * a.sum() + 3.0 * b.sum()).backward()
    np.testing.assert_allclose(x.grad.numpy(), np.full(3, 2.0))
    np.testing.assert_allclose(w.grad.numpy(), np.full(3, 3.0))


def test_nested_checkpoints():
    it.manual_seed(0)
    inner, outer = MLP(p=0.3), it.nn.Linear(5, 6)

    def f(x, nested):
        h = checkpoint(inner, x) if nested else inner(x)
        return checkpoint(inner, outer(h).tanh()) if nested else inner(outer(h).tanh())

    def run(use_checkpoint):
        inner.zero_grad()
        outer.zero_grad()
        x = it.tensor(_data(4, 6), requires_grad=True)
        it.manual_seed(11)
        y = checkpoint(f, x, True) if use_checkpoint else f(x, False)
        y.pow(2).sum().backward()
        return [x.grad.numpy(), y.numpy()] + [p.grad.numpy() for p in (*inner.parameters(), *outer.parameters())] \
            + [it.rand(3).numpy()]

    for ours, theirs in zip(run(True), run(False)):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6)


def test_under_no_grad_the_function_just_runs():
    calls = []

    def f(x):
        calls.append(it.is_grad_enabled())
        return x * 2.0

    x = it.tensor(_data(3), requires_grad=True)
    with it.no_grad():
        y = checkpoint(f, x)
    assert calls == [False] and not y.requires_grad and y.grad_fn is None


def test_checkpoint_sequential_matches_plain_and_torch():
    it.manual_seed(0)
    layers = [it.nn.Linear(6, 8), it.nn.Tanh(), it.nn.Linear(8, 8), it.nn.ReLU(), it.nn.Linear(8, 4)]
    model = it.nn.Sequential(*layers)
    ref = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8), torch.nn.ReLU(),
                              torch.nn.Linear(8, 4))
    with torch.no_grad():
        for p, q in zip(model.parameters(), ref.parameters()):
            q.copy_(torch.from_numpy(p.numpy()))
    x_np = _data(3, 6)
    x = it.tensor(x_np, requires_grad=True)
    checkpoint_sequential(model, 2, x, use_reentrant=False).sum().backward()
    ours = [x.grad.numpy()] + [p.grad.numpy() for p in model.parameters()]
    model.zero_grad()
    x2 = it.tensor(x_np, requires_grad=True)
    model(x2).sum().backward()
    for a, b in zip(ours, [x2.grad.numpy()] + [p.grad.numpy() for p in model.parameters()]):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    xt = torch.tensor(x_np, requires_grad=True)
    torch.utils.checkpoint.checkpoint_sequential(ref, 2, xt, use_reentrant=False).sum().backward()
    for a, b in zip(ours, [xt.grad.numpy()] + [q.grad.numpy() for q in ref.parameters()]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    y = checkpoint_sequential(layers, 5, it.tensor(x_np), preserve_rng_state=False)  # a list, one per segment
    np.testing.assert_allclose(y.numpy(), model(it.tensor(x_np)).numpy(), rtol=1e-6)


def test_create_graph_through_checkpoint():
    def f(x):
        return (x * x * x).sin()

    x = it.tensor(_data(5), requires_grad=True)
    (g,) = it.autograd.grad(checkpoint(f, x).sum(), x, create_graph=True)
    (gg,) = it.autograd.grad(g.sum(), x)
    (g_ref,) = it.autograd.grad(f(x).sum(), x, create_graph=True)
    (gg_ref,) = it.autograd.grad(g_ref.sum(), x)
    np.testing.assert_allclose(g.numpy(), g_ref.numpy(), rtol=1e-6)
    np.testing.assert_allclose(gg.numpy(), gg_ref.numpy(), rtol=1e-6)


def test_retain_graph_recomputes_each_backward():
    it.manual_seed(0)
    x = it.tensor(_data(30), requires_grad=True)
    y = checkpoint(lambda a: F.dropout(a, 0.5) * a, x)
    y.sum().backward(retain_graph=True)
    first = x.grad.numpy().copy()
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * first)
    with pytest.raises(RuntimeError, match="second time"):
        y.sum().backward()


def test_context_fn_contexts_are_entered():
    log = []

    @contextlib.contextmanager
    def ctx(name):
        log.append(name)
        yield

    x = it.tensor(_data(3), requires_grad=True)
    checkpoint(lambda a: a.exp(), x, context_fn=lambda: (ctx("forward"), ctx("recompute"))).sum().backward()
    assert log == ["forward", "recompute"]


# ----------------------------------------------------------------------------------------------- memory
def test_intermediates_are_not_kept_between_forward_and_backward():
    it.manual_seed(0)
    mlp = MLP(p=0.2)
    refs = []

    def f(x):
        h = mlp.fc1(x)
        a = F.gelu(h)
        refs.extend(weakref.ref(t) for t in (h, a))
        refs.extend(weakref.ref(t.array) for t in (h, a))
        return mlp.fc2(a)

    gc.disable()  # what dies must die by reference counting, not in a collection that happens to run
    try:
        x = it.tensor(_data(8, 6), requires_grad=True)
        y = f(x)  # the control: a plain forward keeps them for backward
        assert any(r() is not None for r in refs)
        del y
        refs.clear()
        y = checkpoint(f, x)
        assert len(refs) == 4 and all(r() is None for r in refs)
        assert len(y.grad_fn._saved) == 1  # the input, nothing else
        refs.clear()
        y.sum().backward()  # the recomputation's own intermediates die with its pass
        assert len(refs) == 4 and all(r() is None for r in refs)
    finally:
        gc.enable()


def test_kept_intermediate_still_gives_correct_gradients():
    kept = []

    def f(x):
        h = x.exp()
        kept.append(h)  # the function keeps part of its graph alive
        return h * x

    x = it.tensor(_data(4), requires_grad=True)
    checkpoint(f, x).sum().backward()
    xv = _data(4)
    np.testing.assert_allclose(x.grad.numpy(), np.exp(xv) * (xv + 1), rtol=1e-6)


# ----------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("kwargs, match", [
    (dict(debug=True), "debug=True is not supported"),
    (dict(determinism_check="strict"), "determinism_check 'default' or 'none'"),
    (dict(use_reentrant="yes"), "use_reentrant True, False or None"),
    (dict(early_stop=None), "early_stop True or False"),
])
def test_unsupported_options_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        checkpoint(lambda a: a, it.ones(2), **kwargs)


def test_bad_function_and_context_fn_raise():
    with pytest.raises(TypeError, match="expected a callable function"):
        checkpoint(3, it.ones(2))
    with pytest.raises(TypeError, match="two context managers"):
        checkpoint(lambda a: a, it.ones(2), context_fn=lambda: contextlib.nullcontext())


def test_checkpoint_sequential_bad_arguments_raise():
    layers = [it.nn.Tanh(), it.nn.Tanh()]
    with pytest.raises(ValueError, match=r"segments an int in \[1, 2\]"):
        checkpoint_sequential(layers, 3, it.ones(2))
    with pytest.raises(ValueError, match="unexpected keyword arguments"):
        checkpoint_sequential(layers, 1, it.ones(2), determinism_check="none")


def test_recomputation_that_builds_another_graph_raises():
    calls = []

    def f(x):
        calls.append(1)
        return x.exp() if len(calls) == 1 else x.exp().sin()

    y = checkpoint(f, it.tensor(_data(3), requires_grad=True))
    with pytest.raises(RuntimeError, match="recomputation built 2 graph nodes, the forward built 1"):
        y.sum().backward()
    calls.clear()
    x = it.tensor(_data(3), requires_grad=True)
    checkpoint(f, x, determinism_check="none").sum().backward()  # the check is skipped: the new graph is used
    np.testing.assert_allclose(x.grad.numpy(), np.cos(np.exp(_data(3))) * np.exp(_data(3)), rtol=1e-6)


def test_recomputation_with_other_outputs_raises():
    calls = []

    def f(x):
        calls.append(1)
        return (x * 2.0, x * 3.0) if len(calls) == 1 else (x * 2.0,)

    a, b = checkpoint(f, it.tensor(_data(3), requires_grad=True))
    with pytest.raises(RuntimeError, match="recomputed function returned"):
        (a + b).sum().backward()


def test_recomputation_reaching_a_new_leaf_raises():
    def f(x):
        return x * it.tensor(_data(3), requires_grad=True)  # a fresh leaf each call

    y = checkpoint(f, it.tensor(_data(3), requires_grad=True))
    with pytest.raises(RuntimeError, match="leaf tensors the forward did not use"):
        y.sum().backward()


def test_input_changed_in_place_after_the_forward_raises():
    x = it.tensor(_data(3), requires_grad=True)
    h = x * 1.0
    y = checkpoint(lambda a: a.exp(), h)
    with it.no_grad():
        h.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


# ----------------------------------------------------------------------------------------- RNG snapshots
def test_rng_state_all_round_trip_covers_default_stream_and_forks():
    it.manual_seed(4)
    backend.seed_fork("a", 1)
    state = backend.get_rng_state_all()
    first = it.rand(3).numpy()
    with backend.fork_rng("a"):
        fork_first = it.rand(3).numpy()
    backend.seed_fork("b", 2)  # created after the snapshot: dropped by set_rng_state_all
    backend.set_rng_state_all(state)
    np.testing.assert_array_equal(it.rand(3).numpy(), first)
    with backend.fork_rng("a"):
        np.testing.assert_array_equal(it.rand(3).numpy(), fork_first)
    assert "b" not in backend._forks
    del backend._forks["a"]  # dropped since: re-created
    backend.set_rng_state_all(state)
    with backend.fork_rng("a"):
        np.testing.assert_array_equal(it.rand(3).numpy(), fork_first)


class _FakeBits:
    def __init__(self, seed):
        self._state = np.random.default_rng(seed).integers(0, 100, 16).astype(np.int8)


def _fake_cupy(log):
    @contextlib.contextmanager
    def device(index):
        log.append(index)
        yield

    random = types.SimpleNamespace(XORWOW=_FakeBits, Generator=lambda bits: types.SimpleNamespace(bit_generator=bits))
    return types.SimpleNamespace(cuda=types.SimpleNamespace(Device=device), random=random)


def test_rng_state_all_copies_gpu_generator_states(monkeypatch):
    """cupy's Generator(XORWOW) keeps its curand states in ``bit_generator._state``: a stand-in with that layout."""
    log = []
    monkeypatch.setattr(backend, "_cupy", _fake_cupy(log))
    it.manual_seed(0)
    backend._cuda_generators[1] = types.SimpleNamespace(bit_generator=_FakeBits(1))
    backend.seed_fork("a", 1)
    backend._forks["a"][1][0] = types.SimpleNamespace(bit_generator=_FakeBits(2))
    state = backend.get_rng_state_all()
    saved = backend._cuda_generators[1].bit_generator._state.copy()
    backend._cuda_generators[1].bit_generator._state += 1  # draws advance the device states in place
    backend._forks["a"][1][0].bit_generator._state[:] = 0
    backend.set_rng_state_all(state)
    np.testing.assert_array_equal(backend._cuda_generators[1].bit_generator._state, saved)
    np.testing.assert_array_equal(backend._forks["a"][1][0].bit_generator._state, _FakeBits(2)._state)
    backend._cuda_generators.clear()  # e.g. manual_seed since: the generator is re-created with the saved state
    backend.set_rng_state_all(state)
    np.testing.assert_array_equal(backend._cuda_generators[1].bit_generator._state, saved)
    assert set(log) == {0, 1}  # every copy ran with its GPU current
    backend._cuda_generators.clear()


def test_gpu_generator_without_state_api_raises(monkeypatch):
    monkeypatch.setattr(backend, "_cupy", _fake_cupy([]))
    backend._cuda_generators[0] = object()
    try:
        with pytest.raises(RuntimeError, match="no state that can be copied"):
            backend.get_rng_state_all()
    finally:
        backend._cuda_generators.clear()


def test_exports():
    assert it.autograd.checkpoint is recompute.checkpoint is checkpoint
    assert it.autograd.checkpoint_sequential is checkpoint_sequential
