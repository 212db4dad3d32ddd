"""Op observers (autograd/observers.py): every forward and backward and every named range reaches the installed
observers, in order, from the thread that runs it; nothing is called once uninstalled."""
import threading

import pytest

import infini_train as it
from infini_train.autograd import observers


class Log(observers.OpObserver):
    def __init__(self):
        self.events = []

    def forward_begin(self, fn, inputs):
        self.events.append(("forward", fn.name, threading.get_ident()))
        return len(self.events)

    def forward_end(self, token, fn, inputs, outputs):
        assert self.events[token - 1][1] == fn.name and outputs is not None

    def backward_begin(self, fn, grad_outputs):
        self.events.append(("backward", fn.name, len(grad_outputs)))

    def range_begin(self, name, kind):
        self.events.append(("range", name, kind))


def test_forward_backward_and_ranges_reach_the_observer_in_order():
    log = observers.install(Log())
    try:
        x = it.randn(3, requires_grad=True)
        with observers.record("step", "user"):
            (x * 2).exp().sum().backward()
    finally:
        observers.uninstall(log)
    me = threading.get_ident()
    assert log.events == [("range", "step", "user"), ("forward", "Mul", me), ("forward", "Exp", me),
                          ("forward", "Sum", me), ("backward", "Sum", 1), ("backward", "Exp", 1),
                          ("backward", "Mul", 1), ("backward", "AccumulateGrad", 1)]
    it.randn(2).exp()
    assert len(log.events) == 8  # uninstalled: not called


def test_autograd_grad_passes_are_observed_too_and_double_install_is_refused():
    log = observers.install(Log())
    try:
        with pytest.raises(RuntimeError, match="already installed"):
            observers.install(log)
        x = it.randn(3, requires_grad=True)
        it.autograd.grad(x.tanh().sum(), x)
    finally:
        observers.uninstall(log)
    assert [e[:2] for e in log.events if e[0] == "backward"] == [("backward", "Sum"), ("backward", "Tanh")]
    assert observers.record("x") is observers.record("y")  # the shared no-op range when nothing is installed
