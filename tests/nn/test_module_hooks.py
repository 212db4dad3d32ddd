"""Module backward hooks (register_full_backward_hook / _pre_hook, the global ones) against torch 2.13 on the same
programs: what the hooks receive, in which order they run, what a returned value does, handles, prepend."""
import warnings

import numpy as np
import pytest
import torch

import infini_train as it
from infini_train.nn import module as it_module
from tests.torch_parity import assert_same, same

RNG = np.random.default_rng(11)
W1 = RNG.standard_normal((4, 3)).astype(np.float32)
W2 = RNG.standard_normal((2, 4)).astype(np.float32)
X = RNG.standard_normal((5, 3)).astype(np.float32)


def net(m):
    """Sequential(Linear(3, 4), Tanh, Linear(4, 2)) with fixed weights."""
    a, b = m.nn.Linear(3, 4, bias=False), m.nn.Linear(4, 2, bias=False)
    with m.no_grad():
        a.weight.copy_(m.tensor(W1))
        b.weight.copy_(m.tensor(W2))
    return m.nn.Sequential(a, m.nn.Tanh(), b)


def shapes(grads):
    return tuple(None if g is None else tuple(g.shape) for g in grads)


def global_module(m):
    return it_module if m is it else torch.nn.modules.module


def test_full_backward_hooks_see_the_gradients_of_inputs_and_outputs():
    def run(m):
        model = net(m)
        seen = []
        for name, mod in (("outer", model), ("first", model[0]), ("last", model[2])):
            mod.register_full_backward_hook(lambda mod, gi, go, name=name: seen.append((name, "full", gi, go)))
            mod.register_full_backward_pre_hook(lambda mod, go, name=name: seen.append((name, "pre", go)))
        x = m.tensor(X, requires_grad=True)
        (model(x) ** 2).sum().backward()
        return seen, x.grad, model[0].weight.grad

    seen, _, _ = same(run, rtol=1e-5, atol=1e-6)
    assert [(name, kind) for name, kind, *_ in seen] == [
        ("outer", "pre"), ("last", "pre"), ("last", "full"), ("first", "pre"), ("first", "full"), ("outer", "full")]


def test_call_order_global_module_prepend_and_forward_hooks():
    def run(m):
        log = []
        layer = m.nn.Linear(3, 2)
        layer.register_forward_pre_hook(lambda mod, args: log.append("fwd-pre"))
        layer.register_forward_hook(lambda mod, args, out: log.append("fwd"))
        layer.register_full_backward_pre_hook(lambda mod, go: log.append("pre-1"))
        layer.register_full_backward_pre_hook(lambda mod, go: log.append("pre-0"), prepend=True)
        layer.register_full_backward_hook(lambda mod, gi, go: log.append("full-1"))
        layer.register_full_backward_hook(lambda mod, gi, go: log.append("full-0"), prepend=True)
        g = global_module(m)
        handles = [g.register_module_full_backward_hook(lambda mod, gi, go: log.append("global-full")),
                   g.register_module_full_backward_pre_hook(lambda mod, go: log.append("global-pre"))]
        try:
            layer(m.ones(1, 3, requires_grad=True)).sum().backward()
        finally:
            for h in handles:
                h.remove()
        layer(m.ones(1, 3, requires_grad=True)).sum().backward()  # the global ones are gone
        return log

    log = same(run)
    assert log[:7] == ["fwd-pre", "fwd", "global-pre", "pre-0", "pre-1", "global-full", "full-0"]


def test_returned_grad_output_and_grad_input_replace_the_gradients():
    def run(m):
        model = net(m)
        model[2].register_full_backward_pre_hook(lambda mod, go: (go[0] * 3,))
        model[0].register_full_backward_hook(lambda mod, gi, go: (gi[0] * -2,))
        x = m.tensor(X, requires_grad=True)
        model(x).sum().backward()
        # the pre-hook scales every gradient below it; the full hook only what flows on to x
        return x.grad, model[0].weight.grad, model[2].weight.grad

    same(run, rtol=1e-5, atol=1e-6)


def test_removed_hooks_no_longer_run():
    def run(m):
        layer, log = m.nn.Linear(3, 2), []
        h1 = layer.register_full_backward_hook(lambda mod, gi, go: log.append("full"))
        h2 = layer.register_full_backward_pre_hook(lambda mod, go: log.append("pre"))
        layer(m.ones(2, 3, requires_grad=True)).sum().backward()
        h1.remove()
        h2.remove()
        h2.remove()  # twice is harmless
        layer(m.ones(2, 3, requires_grad=True)).sum().backward()
        return log

    assert same(run) == ["pre", "full"]


class Mixed:
    """forward(x, scale, y): x needs grad, scale is a float, y is a tensor without grad; two outputs."""

    @staticmethod
    def make(m):
        class Net(m.nn.Module):
            def forward(self, x, scale, y):
                return x * scale + y, x.sum() * 0 + y.sum()
        return Net()


def test_non_tensor_and_no_grad_inputs_and_unused_outputs_give_none():
    def run(m):
        mod, seen = Mixed.make(m), []
        mod.register_full_backward_pre_hook(lambda mod, go: seen.append(("pre", shapes(go))))
        mod.register_full_backward_hook(lambda mod, gi, go: seen.append(("full", shapes(gi), shapes(go))))
        x = m.tensor(X, requires_grad=True)
        a, b = mod(x, 2.0, m.ones(5, 3))
        a.sum().backward()  # b gets no gradient
        return seen, x.grad

    seen, _ = same(run)
    # y needs no gradient but is a tensor beside one that does: torch gives it zeros
    assert seen[1] == ("full", ((5, 3), None, (5, 3)), ((5, 3), None))


def test_no_input_requiring_grad_calls_the_full_hook_with_grad_input_none():
    def run(m):
        layer, seen = m.nn.Linear(3, 2), []
        layer.register_full_backward_hook(lambda mod, gi, go: seen.append((gi, shapes(go))))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            layer(m.ones(1, 3)).sum().backward()
        return seen, any("no inputs require gradients" in str(w.message) for w in caught)

    assert same(run) == ([((None,), ((1, 2),))], True)


def test_create_graph_keeps_hooked_gradients_differentiable():
    def run(m):
        layer, log = net(m)[0], []
        layer.register_full_backward_hook(lambda mod, gi, go: log.append("full") or (gi[0] * 2,))
        x = m.tensor(X, requires_grad=True)
        (g,) = m.autograd.grad((layer(x) ** 3).sum(), x, create_graph=True)
        g.sum().backward()  # passes the hooked nodes again
        return g, x.grad, layer.weight.grad, log

    same(run, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["full", "pre"])
def test_a_hook_returning_the_wrong_number_of_gradients_is_an_error(kind):
    layer = it.nn.Linear(3, 2)
    if kind == "full":
        layer.register_full_backward_hook(lambda mod, gi, go: (gi[0], gi[0]))
        wanted = "Backward hook returned an invalid number of grad_input, got 2, but expected 1"
    else:
        layer.register_full_backward_pre_hook(lambda mod, go: (go[0], go[0]))
        wanted = "Backward pre hook returned an invalid number of grad_output, got 2, but expected 1"
    with pytest.raises(RuntimeError, match=wanted):
        layer(it.ones(1, 3, requires_grad=True)).sum().backward()


def test_registering_a_non_callable_is_a_clear_error():
    with pytest.raises(TypeError, match="register_full_backward_hook: expected a callable hook, got int"):
        it.nn.Linear(2, 2).register_full_backward_hook(3)


def test_hooks_registered_after_forward_do_not_apply_to_that_graph():
    def run(m):
        layer, log = m.nn.Linear(3, 2), []
        y = layer(m.ones(1, 3, requires_grad=True))
        layer.register_full_backward_hook(lambda mod, gi, go: log.append("full"))
        y.sum().backward()
        return log

    assert same(run) == []


def test_unhooked_modules_cost_one_check():
    layer = it.nn.Linear(2, 2)
    assert layer._hooked is False and "_backward_hooks" not in layer.__dict__
    layer.register_full_backward_pre_hook(lambda mod, go: None)
    assert layer._hooked is True and it.nn.Linear(2, 2)._hooked is False
    assert_same(layer(it.ones(1, 2)), torch.nn.functional.linear(torch.ones(1, 2), torch.tensor(
        layer.weight.numpy()), torch.tensor(layer.bias.numpy())))


def test_an_in_place_change_to_a_hooked_input_is_caught():
    for m in (it, torch):
        class Double(m.nn.Module):
            def forward(self, x):
                return x.mul_(2)

        layer = Double()
        layer.register_full_backward_hook(lambda mod, gi, go: None)
        x = m.ones(3, requires_grad=True)
        with pytest.raises(RuntimeError):  # torch at once; here when tanh's backward finds its output changed
            layer(x.tanh()).sum().backward()
