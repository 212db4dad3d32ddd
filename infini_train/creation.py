"""Tensor creation functions: it.tensor, zeros, ones, empty, full, randn, rand, randint, randperm, arange, *_like."""
from __future__ import annotations

import numbers

import numpy as np

from . import backend
from .generator import draw_source
from .tensor import Tensor


def as_array(data, dtype, dev, copy=True):
    """Turn data (Tensor, array, list, scalar) into an array of ``dtype`` on device ``dev``."""
    dtype = backend.as_dtype(dtype)
    if isinstance(data, Tensor):
        arr = data.array
    elif isinstance(data, (list, tuple)) and any(isinstance(x, Tensor) for x in data):
        arr = np.stack([x.numpy() if isinstance(x, Tensor) else np.asarray(x) for x in data])
    else:
        arr = data
        if not backend.is_array_like(arr):
            try:
                arr = np.asarray(arr)
            except ValueError as exc:
                raise ValueError(
                    f"tensor: expected a number or a rectangular nested sequence of numbers, got a ragged sequence "
                    f"(sub-sequences of different lengths: {_ragged_example(data)})\n"
                    "HINT: pad the rows to one length, or build one tensor per row") from exc
            if dtype is None and arr.dtype == np.float64:
                dtype = backend.get_default_dtype()  # Python floats become the default dtype
            if arr.dtype.kind not in "biufcV":
                raise TypeError(f"tensor: cannot build a tensor from {type(data).__name__} "
                                f"(numpy made dtype {arr.dtype}); expected numbers or nested lists of numbers")
    arr = backend.to_device_array(arr, dev)
    xp = dev.array_module()
    if dtype is not None and arr.dtype != dtype:
        return arr.astype(dtype)
    if copy:
        return xp.array(arr, copy=True)
    return arr


def _ragged_example(data):
    """The first two places, level by level, whose lengths differ: 'data[0] has 2 items, data[1] has 1 items'."""
    def length(x):
        return len(x) if isinstance(x, (list, tuple)) else None

    def describe(path, n):
        return f"{path} has " + ("no length" if n is None else f"{n} items")

    level = [("data", data)]
    while level:
        first_path, first_len = level[0][0], length(level[0][1])
        for path, x in level[1:]:
            if length(x) != first_len:
                return f"{describe(first_path, first_len)}, {describe(path, length(x))}"
        if first_len is None:
            return "mixed numbers and sequences"
        level = [(f"{path}[{i}]", item) for path, x in level for i, item in enumerate(x)]
    return "mixed numbers and sequences"


def tensor(data, dtype=None, device=None, requires_grad=False):
    """A new tensor holding a copy of ``data``. Python floats give float32; numpy arrays keep their dtype. Given no
    ``device``: a Tensor's or a GPU array's own device, else the default device (``with it.device(...)``), as
    torch.tensor."""
    if device is None and not isinstance(data, Tensor):
        default = backend.Device.parse(None)
        if default is not backend.CPU and backend.device_of_array(data) is backend.CPU:
            device = default
    return Tensor(data, dtype=dtype, device=device, requires_grad=requires_grad)


def from_numpy(array):
    """A CPU tensor sharing memory with a numpy array."""
    return Tensor._make(np.asarray(array), backend.CPU)


def _shape(shape):
    if len(shape) == 1 and not isinstance(shape[0], numbers.Integral):
        shape = tuple(shape[0])
    try:
        shape = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise TypeError(f"shape: expected integers, got {shape!r}") from None
    if any(s < 0 for s in shape):
        raise ValueError(f"shape: expected non-negative sizes, got {shape}")
    return shape


def _new(fill, shape, dtype, device, requires_grad):
    dev = backend.Device.parse(device)
    dtype = backend.as_dtype(dtype) or backend.get_default_dtype()
    xp = dev.array_module()
    with dev.context():
        arr = fill(xp, shape, dtype)
    t = Tensor._make(arr, dev)
    if requires_grad:
        t.requires_grad = True
    return t


def zeros(*shape, dtype=None, device=None, requires_grad=False):
    return _new(lambda xp, s, d: xp.zeros(s, d), _shape(shape), dtype, device, requires_grad)


def ones(*shape, dtype=None, device=None, requires_grad=False):
    return _new(lambda xp, s, d: xp.ones(s, d), _shape(shape), dtype, device, requires_grad)


def empty(*shape, dtype=None, device=None, requires_grad=False):
    return _new(lambda xp, s, d: xp.empty(s, d), _shape(shape), dtype, device, requires_grad)


def full(shape, fill_value, dtype=None, device=None, requires_grad=False):
    if dtype is None and isinstance(fill_value, bool):
        dtype = backend.bool_
    elif dtype is None and isinstance(fill_value, numbers.Integral):
        dtype = backend.int64
    return _new(lambda xp, s, d: xp.full(s, fill_value, d), _shape((shape,)), dtype, device, requires_grad)


def randn(*shape, generator=None, dtype=None, device=None, requires_grad=False):
    dev = backend.Device.parse(device)
    gen = draw_source(generator, dev, "randn")
    return _new(lambda xp, s, d: gen.standard_normal(s, dtype=np.float32).astype(d, copy=False)
                if d in (np.float32, np.float64) else gen.standard_normal(s).astype(d),
                _shape(shape), dtype, device, requires_grad)


def rand(*shape, generator=None, dtype=None, device=None, requires_grad=False):
    dev = backend.Device.parse(device)
    gen = draw_source(generator, dev, "rand")
    return _new(lambda xp, s, d: gen.random(s).astype(d), _shape(shape), dtype, device, requires_grad)


def randint(low, high=None, size=(), dtype=None, device=None, *, generator=None):
    if high is None:
        low, high = 0, low
    dev = backend.Device.parse(device)
    gen = draw_source(generator, dev, "randint")
    dtype = backend.as_dtype(dtype) or backend.int64
    return _new(lambda xp, s, d: xp.asarray(gen.integers(low, high, s)).astype(d), _shape((size,)), dtype,
                device, False)


def randperm(n, *, generator=None, dtype=None, device=None, requires_grad=False):
    """A random permutation of 0 .. n-1 (int64 unless ``dtype``), drawn from ``generator`` or the global stream."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
        raise ValueError(f"randperm: expected n, a non-negative int, got {n!r}\nHINT: randperm(10) permutes 0..9")
    dev = backend.Device.parse(device)
    gen = draw_source(generator, dev, "randperm")
    dtype = backend.as_dtype(dtype) or backend.int64
    return _new(lambda xp, s, d: xp.asarray(gen.permutation(int(n))).astype(d), (), dtype, device, requires_grad)


def arange(start, end=None, step=1, dtype=None, device=None, requires_grad=False):
    if end is None:
        start, end = 0, start
    if dtype is None:
        ints = all(isinstance(v, numbers.Integral) for v in (start, end, step))
        dtype = backend.int64 if ints else backend.get_default_dtype()
    return _new(lambda xp, s, d: xp.arange(start, end, step, dtype=d), (), dtype, device, requires_grad)


def linspace(start, end, steps, dtype=None, device=None):
    return _new(lambda xp, s, d: xp.linspace(start, end, steps, dtype=d), (), dtype, device, False)


def _like(fill, t, dtype, device, requires_grad):
    return _new(fill, t.shape, dtype or t.dtype, device or t.device, requires_grad)


def zeros_like(t, dtype=None, device=None, requires_grad=False):
    return _like(lambda xp, s, d: xp.zeros(s, d), t, dtype, device, requires_grad)


def ones_like(t, dtype=None, device=None, requires_grad=False):
    return _like(lambda xp, s, d: xp.ones(s, d), t, dtype, device, requires_grad)


def empty_like(t, dtype=None, device=None, requires_grad=False):
    return _like(lambda xp, s, d: xp.empty(s, d), t, dtype, device, requires_grad)


def full_like(t, fill_value, dtype=None, device=None, requires_grad=False):
    return _like(lambda xp, s, d: xp.full(s, fill_value, d), t, dtype, device, requires_grad)


def randn_like(t, dtype=None, device=None, requires_grad=False, *, generator=None):
    return randn(*t.shape, generator=generator, dtype=dtype or t.dtype, device=device or t.device,
                 requires_grad=requires_grad)
