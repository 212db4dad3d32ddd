"""Table-driven op checking (in the spirit of tinygrad's helper_test_op).

``check_op`` runs an infini_train function and its torch counterpart on the same inputs and compares
forward values and input gradients (float32), then checks the infini_train gradients in float64 against
central finite differences.

Both frameworks run on ``DEVICE`` (``pytest --op-device cuda:0``: infini_train through cupy, torch on its CUDA
device with TF32 off, as cupy's float32; ``cpu:N`` runs on a logical CPU device). The device is also the default
of any tensor the op functions create.
"""
from __future__ import annotations

import contextlib

import numpy as np
import torch

import infini_train as it

DEVICE = "cpu"  # set by tests/conftest.py from --op-device


@contextlib.contextmanager
def on_device():
    """Run the enclosed code with ``DEVICE`` the default device of both frameworks."""
    with it.device(DEVICE), torch.device("cuda:" + DEVICE.split(":")[1] if DEVICE.startswith("cuda") else "cpu"):
        yield


def host(t):
    """A torch or infini_train tensor's values as a numpy array."""
    return t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else t.numpy()


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def make_inputs(specs, seed=0, low=-2.0, high=2.0):
    """Specs are shapes (random float inputs that get gradients) or numpy arrays (used as given)."""
    rng = np.random.default_rng(seed)
    arrays = []
    for spec in specs:
        if isinstance(spec, np.ndarray):
            arrays.append(spec)
        else:
            arrays.append(rng.uniform(low, high, size=tuple(spec)).astype(np.float32))
    return arrays


def _is_float(a):
    return a.dtype.kind == "f"


def _run_it(fn, arrays, dtype, grad_mask):
    ts = []
    for a, g in zip(arrays, grad_mask):
        if _is_float(a):
            ts.append(it.tensor(a.astype(dtype), requires_grad=g, device=DEVICE))
        else:
            ts.append(it.tensor(a, device=DEVICE))
    return ts, _as_tuple(fn(*ts))


def check_op(specs, it_fn, torch_fn, *, rtol=1e-5, atol=1e-6, grad=True, fd=True, fd_tol=1e-6, seed=0,
             low=-2.0, high=2.0, grad_mask=None, eps=1e-6):
    with on_device():
        _check_op(specs, it_fn, torch_fn, rtol, atol, grad, fd, fd_tol, seed, low, high, grad_mask, eps)


def _check_op(specs, it_fn, torch_fn, rtol, atol, grad, fd, fd_tol, seed, low, high, grad_mask, eps):
    arrays = make_inputs(specs, seed, low, high)
    grad_mask = grad_mask or [grad and _is_float(a) for a in arrays]

    # ---- forward and gradients vs torch (float32)
    it_in, it_out = _run_it(it_fn, arrays, np.float32, grad_mask)
    th_in = [torch.tensor(a, requires_grad=bool(g and _is_float(a))) for a, g in zip(arrays, grad_mask)]
    th_out = _as_tuple(torch_fn(*th_in))
    assert len(it_out) == len(th_out), f"{len(it_out)} outputs vs torch's {len(th_out)}"
    for o, r in zip(it_out, th_out):
        r = host(r)
        assert tuple(o.shape) == tuple(r.shape), f"shape {o.shape} vs torch {r.shape}"
        if r.dtype.kind in "biu":
            np.testing.assert_array_equal(host(o), r)
        else:
            np.testing.assert_allclose(host(o), r, rtol=rtol, atol=atol, err_msg="forward differs from torch")
    if not any(grad_mask):
        return
    rng = np.random.default_rng(seed + 1)
    diff_out = [i for i, o in enumerate(it_out) if o.requires_grad]
    cots = [rng.standard_normal(it_out[i].shape).astype(np.float32) for i in diff_out]
    it.autograd.backward([it_out[i] for i in diff_out], [it.tensor(c) for c in cots])
    torch.autograd.backward([th_out[i] for i in diff_out], [torch.tensor(c) for c in cots])
    for k, (ti, tt) in enumerate(zip(it_in, th_in)):
        if not grad_mask[k]:
            continue
        expect = host(tt.grad) if tt.grad is not None else np.zeros(tt.shape, np.float32)
        got = ti.grad.numpy() if ti.grad is not None else np.zeros(ti.shape, np.float32)
        np.testing.assert_allclose(got, expect, rtol=rtol, atol=atol, err_msg=f"gradient of input {k} differs")

    # ---- float64 gradients vs central finite differences
    if fd:
        check_finite_differences(it_fn, arrays, grad_mask, tol=fd_tol, eps=eps, seed=seed)


def check_finite_differences(fn, arrays, grad_mask, tol=1e-6, eps=1e-6, seed=0):
    with on_device():
        _check_finite_differences(fn, arrays, grad_mask, tol, eps, seed)


def _check_finite_differences(fn, arrays, grad_mask, tol, eps, seed):
    arrays64 = [a.astype(np.float64) if _is_float(a) else a for a in arrays]
    ins, outs = _run_it(fn, arrays64, np.float64, grad_mask)
    diff_out = [i for i, o in enumerate(outs) if o.requires_grad]
    rng = np.random.default_rng(seed + 2)
    cots = [rng.standard_normal(outs[i].shape) for i in diff_out]
    it.autograd.backward([outs[i] for i in diff_out], [it.tensor(c) for c in cots])

    def objective(xs):
        with it.no_grad():
            res = _as_tuple(fn(*[it.tensor(x) for x in xs]))
        return sum(float((res[i].numpy().astype(np.float64) * c).sum()) for i, c in zip(diff_out, cots))

    for k, a in enumerate(arrays64):
        if not grad_mask[k]:
            continue
        numeric = np.zeros_like(a)
        flat = numeric.reshape(-1)
        for j in range(a.size):
            xs = [x.copy() if _is_float(x) else x for x in arrays64]
            xs[k].reshape(-1)[j] += eps
            up = objective(xs)
            xs[k].reshape(-1)[j] -= 2 * eps
            flat[j] = (up - objective(xs)) / (2 * eps)
        got = ins[k].grad.numpy() if ins[k].grad is not None else np.zeros_like(a)
        np.testing.assert_allclose(got, numeric, rtol=tol, atol=tol,
                                   err_msg=f"float64 gradient of input {k} differs from finite differences")
