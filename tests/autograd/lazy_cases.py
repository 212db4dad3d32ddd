"""The op test suite's cases, replayed to compare lazy mode with eager mode bit for bit.

Every ``test_*`` function of the op test modules that calls ``check_op`` is expanded over its
``pytest.mark.parametrize`` marks; ``run_case`` runs it with the module's ``check_op`` replaced by
``compare_lazy``, which runs the op eagerly and under ``it.lazy()`` (with grad, then under no_grad, where
element-wise chains fuse) and asserts identical outputs and input gradients (same dtype, shape and bytes).
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
import itertools

import numpy as np

import infini_train as it
from tests.op_check import _as_tuple, _is_float, make_inputs

OP_MODULES = [
    "tests.autograd.test_elementwise", "tests.autograd.test_activations", "tests.autograd.test_reduction",
    "tests.autograd.test_transform", "tests.autograd.test_matmul", "tests.autograd.test_linear",
    "tests.autograd.test_softmax", "tests.autograd.test_joins", "tests.autograd.test_indexing",
    "tests.autograd.test_loss",
    "tests.autograd.test_normalization", "tests.autograd.test_scan", "tests.autograd.test_sorting",
    "tests.autograd.test_outer", "tests.autograd.test_padding", "tests.autograd.test_einsum",
    "tests.autograd.test_rms_norm", "tests.autograd.test_rotary", "tests.autograd.test_embedding",
    "tests.test_tensor_methods",
    "tests.autograd.test_reorder", "tests.autograd.test_statistics", "tests.autograd.test_repeat_interleave",
]


def _expand(func):
    """Keyword dicts for every combination of the function's parametrize marks (None: needs fixtures)."""
    marks = [m for m in getattr(func, "pytestmark", []) if m.name == "parametrize"]
    axes = []
    named = set()
    for m in marks:
        names = m.args[0]
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        named.update(names)
        values = []
        for v in m.args[1]:
            if hasattr(v, "values") and hasattr(v, "marks"):  # pytest.param(...)
                if v.marks:
                    continue
                v = v.values
            values.append(dict(zip(names, v if len(names) > 1 else (v,))))
        axes.append(values)
    if set(inspect.signature(func).parameters) - named:
        return None
    return [dict(kw for part in combo for kw in part.items()) for combo in itertools.product(*axes)]


def collect():
    """[(case id, module name, function name, kwargs)] for every op test calling check_op."""
    cases = []
    for mod_name in OP_MODULES:
        try:
            mod = importlib.import_module(mod_name)
        except ImportError:
            continue
        if not hasattr(mod, "check_op"):
            continue
        for name, func in vars(mod).items():
            if not (name.startswith("test") and inspect.isfunction(func)) or "check_op" not in inspect.getsource(func):
                continue
            combos = _expand(func)
            for i, kwargs in enumerate(combos or ()):
                cases.append((f"{mod_name.rsplit('.', 1)[-1]}::{name}[{i}]", mod_name, name, kwargs))
    return cases


def _same(a, b, what):
    assert a.dtype == b.dtype, f"{what}: dtype {a.dtype} (lazy) vs {b.dtype} (eager)"
    assert a.shape == b.shape, f"{what}: shape {a.shape} (lazy) vs {b.shape} (eager)"
    assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes(), f"{what}: values differ"


def _run(fn, arrays, grad_mask, lazy, grad):
    ins = [it.tensor(a, requires_grad=bool(g and grad)) if _is_float(a) else it.tensor(a)
           for a, g in zip(arrays, grad_mask)]
    mode = contextlib.nullcontext() if grad else it.no_grad()
    with mode, (it.lazy() if lazy else contextlib.nullcontext()):
        outs = _as_tuple(fn(*ins))
        diff = [o for o in outs if o.requires_grad]
        if diff:
            rng = np.random.default_rng(1)
            cots = [it.tensor(rng.standard_normal(o.shape).astype(o.dtype)) for o in diff]
            it.autograd.backward(diff, cots)  # inside the block: backward realises
    return [o.numpy() for o in outs], [t.grad.numpy() if t.grad is not None else None for t in ins]


def compare_lazy(specs, it_fn, torch_fn=None, *, grad=True, seed=0, low=-2.0, high=2.0, grad_mask=None, **_):
    """check_op's signature: the op under lazy mode equals eager mode bit for bit (outputs and gradients)."""
    arrays = make_inputs(specs, seed, low, high)
    grad_mask = grad_mask or [grad and _is_float(a) for a in arrays]
    for with_grad in (True, False):
        eager_out, eager_grads = _run(it_fn, arrays, grad_mask, False, with_grad)
        lazy_out, lazy_grads = _run(it_fn, arrays, grad_mask, True, with_grad)
        assert len(eager_out) == len(lazy_out)
        for k, (a, b) in enumerate(zip(lazy_out, eager_out)):
            _same(a, b, f"output {k} (grad={with_grad})")
        for k, (a, b) in enumerate(zip(lazy_grads, eager_grads)):
            assert (a is None) == (b is None), f"gradient of input {k}: present in one mode only"
            if a is not None:
                _same(a, b, f"gradient of input {k}")
    compare_lazy.calls += 1


compare_lazy.calls = 0


def run_case(mod_name, func_name, kwargs, monkeypatch):
    """Run one op test with check_op replaced by compare_lazy; returns how many ops it compared."""
    mod = importlib.import_module(mod_name)
    monkeypatch.setattr(mod, "check_op", compare_lazy)
    before = compare_lazy.calls
    getattr(mod, func_name)(**kwargs)
    return compare_lazy.calls - before
