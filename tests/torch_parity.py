"""Run one piece of code with infini_train and with torch, and compare what comes out.

``same(fn)`` calls ``fn(it)`` and ``fn(torch)`` (the function uses only names both modules share: tensor,
zeros, no_grad, float32, ...) and asserts the results are equal: tensors by dtype, shape and values,
sequences element by element, numbers by value. Values are compared as float64 with ``rtol``/``atol``.
"""
from __future__ import annotations

import numpy as np
import torch

import infini_train as it


def to_numpy(t):
    if isinstance(t, torch.Tensor):
        return t.detach().float().numpy() if t.dtype == torch.bfloat16 else t.detach().numpy()
    return t.numpy()


def dtype_name(t):
    return str(t.dtype).replace("torch.", "")


def assert_same(ours, theirs, rtol=1e-6, atol=1e-6, where="result"):
    if isinstance(theirs, torch.Tensor):
        assert isinstance(ours, it.Tensor), f"{where}: expected a Tensor, got {type(ours).__name__}"
        assert dtype_name(ours) == dtype_name(theirs), f"{where}: dtype {ours.dtype} vs torch's {theirs.dtype}"
        assert tuple(ours.shape) == tuple(theirs.shape), f"{where}: shape {tuple(ours.shape)} vs {tuple(theirs.shape)}"
        a, b = to_numpy(ours), to_numpy(theirs)
        if a.dtype.kind in "biu":
            np.testing.assert_array_equal(a, b, err_msg=where)
        else:
            np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=atol,
                                       err_msg=where, equal_nan=True)
    elif isinstance(theirs, (tuple, list)):
        assert isinstance(ours, (tuple, list)) and len(ours) == len(theirs), f"{where}: {ours!r} vs {theirs!r}"
        for i, (a, b) in enumerate(zip(ours, theirs)):
            assert_same(a, b, rtol, atol, f"{where}[{i}]")
    elif isinstance(theirs, torch.dtype):
        assert str(ours) == dtype_name(theirs), f"{where}: dtype {ours} vs torch's {theirs}"
    elif isinstance(theirs, float):
        np.testing.assert_allclose(ours, theirs, rtol=rtol, atol=atol, err_msg=where)
    else:
        assert ours == theirs, f"{where}: {ours!r} vs torch's {theirs!r}"


def same(fn, rtol=1e-6, atol=1e-6):
    """Assert ``fn(it)`` equals ``fn(torch)``; returns infini_train's result."""
    ours, theirs = fn(it), fn(torch)
    assert_same(ours, theirs, rtol, atol)
    return ours


def grads(*tensors):
    """The ``.grad`` of each tensor (None stays None), for comparing after backward."""
    return tuple(t.grad for t in tensors)
