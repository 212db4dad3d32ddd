"""Lazy mode vs eager mode on the op test suite's cases (tests/autograd/lazy_cases.py): outputs and
gradients bit for bit, with grad recording and under no_grad; once as configured, and once with fusion forced
onto the suite's small tensors in tiny blocks (every element-wise chain without grad is then fused, and
blocks cut through rows)."""
import pytest

from infini_train.lazy_mode import fusion, graph
from tests.autograd.lazy_cases import collect, run_case

CASES = collect()


def test_the_suite_was_found():
    modules = {mod for _, mod, _, _ in CASES}
    assert len(CASES) > 200 and len(modules) >= 10, (len(CASES), modules)


@pytest.fixture
def recorded(monkeypatch):
    counts = {"recorded": 0}
    original = graph.record

    def counting(fn, inputs):
        counts["recorded"] += 1
        return original(fn, inputs)

    monkeypatch.setattr(graph, "record", counting)
    return counts


@pytest.mark.parametrize("tiny_blocks", [False, True], ids=["default", "tiny_blocks"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_lazy_equals_eager_on_op_case(case, tiny_blocks, monkeypatch, recorded):
    if tiny_blocks:
        monkeypatch.setattr(fusion, "MIN_ELEMENTS", 2)
        monkeypatch.setattr(fusion, "BLOCK", 3)
    _, mod_name, func_name, kwargs = case
    compared = run_case(mod_name, func_name, kwargs, monkeypatch)
    assert compared > 0, "the case compared no op"
    assert recorded["recorded"] > 0, "nothing went through lazy recording"
