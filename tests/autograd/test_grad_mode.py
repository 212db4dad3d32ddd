import threading

import pytest

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
