import threading

import pytest
import torch

import infini_train as it


def test_no_grad_records_nothing():
    x = it.tensor([1.0, 2.0], requires_grad=True)
    with it.no_grad():
        y = (x * 2).exp()
        assert not it.is_grad_enabled()
    assert it.is_grad_enabled()
    assert y.grad_fn is None and not y.requires_grad


def test_no_grad_as_decorator_and_exception_restores_state():
    @it.no_grad()
    def infer(t):
        assert not it.is_grad_enabled()
        return t * 2

    x = it.tensor([1.0], requires_grad=True)
    assert infer(x).grad_fn is None
    assert it.is_grad_enabled()
    with pytest.raises(ValueError):
        with it.no_grad():
            raise ValueError("boom")
    assert it.is_grad_enabled()

    @it.no_grad()
    def fails():
        raise KeyError("x")

    with pytest.raises(KeyError):
        fails()
    assert it.is_grad_enabled()


def test_enable_grad_inside_no_grad():
    x = it.tensor([1.0], requires_grad=True)
    with it.no_grad():
        with it.enable_grad():
            y = x * 2
        z = x * 2
    assert y.grad_fn is not None and z.grad_fn is None


def test_set_grad_enabled_function_context_and_decorator():
    it.set_grad_enabled(False)
    try:
        assert not it.is_grad_enabled()
    finally:
        it.set_grad_enabled(True)
    with it.set_grad_enabled(False):
        assert not it.is_grad_enabled()
    assert it.is_grad_enabled()

    @it.set_grad_enabled(False)
    def f():
        return it.is_grad_enabled()

    assert it.is_grad_enabled()  # decorating does not change the mode
    assert f() is False
    assert it.is_grad_enabled()


def test_grad_mode_is_thread_local():
    inside_no_grad = threading.Event()
    checked = threading.Event()
    seen = {}

    def disabled_thread():
        with it.no_grad():
            inside_no_grad.set()
            checked.wait(5)
            seen["worker"] = it.is_grad_enabled()

    def fresh_thread():
        seen["fresh"] = it.is_grad_enabled()
        x = it.tensor([1.0], requires_grad=True)
        seen["records"] = (x * 2).grad_fn is not None

    t1 = threading.Thread(target=disabled_thread)
    t1.start()
    inside_no_grad.wait(5)
    seen["main"] = it.is_grad_enabled()
    t2 = threading.Thread(target=fresh_thread)
    t2.start()
    t2.join()
    checked.set()
    t1.join()
    assert seen == {"worker": False, "main": True, "fresh": True, "records": True}


def test_new_thread_starts_enabled_even_if_parent_disabled():
    result = {}
    with it.no_grad():
        t = threading.Thread(target=lambda: result.setdefault("mode", it.is_grad_enabled()))
        t.start()
        t.join()
    assert result["mode"] is True


# ------------------------------------------------------------------------- decorators: bare and on generators
@pytest.mark.parametrize("guard", ["no_grad", "enable_grad", "inference_mode"])
def test_bare_decorator_works_like_torch(guard):
    for m in (it, torch):
        decorated = getattr(m, guard)(m.is_grad_enabled)
        with m.set_grad_enabled(guard == "no_grad"):
            assert decorated() is (guard == "enable_grad")
            assert m.is_grad_enabled() is (guard == "no_grad")


@pytest.mark.parametrize("guard", ["no_grad", "enable_grad", "inference_mode"])
@pytest.mark.parametrize("bare", [True, False])
def test_decorated_generator_holds_the_mode_inside_only(guard, bare):
    def observe(m):
        decorator = getattr(m, guard) if bare else getattr(m, guard)()

        @decorator
        def gen(n):
            received = []
            for i in range(n):
                got = yield (i, m.is_grad_enabled())
                received.append(got)
            return received

        seen = []
        with m.set_grad_enabled(guard == "no_grad"):
            g = gen(3)
            seen.append(next(g))
            seen.append(m.is_grad_enabled())  # the caller's mode between yields
            seen.append(g.send("a"))
            seen.append(g.send("b"))
            try:
                g.send("c")
            except StopIteration as stop:
                seen.append(stop.value)
        return seen

    assert observe(it) == observe(torch)
    assert observe(it)[0][1] is (guard == "enable_grad")


def test_generator_exceptions_and_close_pass_through_under_the_guard():
    modes = []

    @it.no_grad
    def gen():
        try:
            yield 1
        except ValueError:
            modes.append(it.is_grad_enabled())
            yield 2
        finally:
            modes.append(("closed", it.is_grad_enabled()))

    g = gen()
    assert next(g) == 1
    assert g.throw(ValueError("boom")) == 2
    g.close()
    assert modes == [False, ("closed", False)] and it.is_grad_enabled()


def test_set_grad_enabled_decorator_on_a_generator():
    @it.set_grad_enabled(False)
    def gen():
        yield it.is_grad_enabled()

    assert it.is_grad_enabled() and list(gen()) == [False] and it.is_grad_enabled()


def test_inference_mode_records_nothing_and_can_be_turned_off():
    x = it.ones(3, requires_grad=True)
    with it.inference_mode():
        assert it.is_inference_mode_enabled() and not it.is_grad_enabled()
        y = x * 2
        with it.inference_mode(False):
            assert it.is_grad_enabled() is False  # inference_mode(False) leaves the mode as it is
    assert y.grad_fn is None and not y.requires_grad
    assert not it.is_inference_mode_enabled() and it.is_grad_enabled()
    assert it.autograd.inference_mode is it.inference_mode


def test_no_grad_rejects_a_non_callable_argument():
    with pytest.raises(TypeError, match="no_grad\\(\\) takes no arguments"):
        it.no_grad(3)
