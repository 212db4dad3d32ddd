"""Devices, array modules (numpy | cupy), dtypes and the random generator.

A Device names where a tensor's memory lives: "cpu" (the host, index 0), "cpu:N" (logical CPU devices:
host memory whose device tag is checked like a GPU's), or "cuda:N" (CuPy). Every kernel is written once
against ``device.xp``, which is numpy for CPU devices and cupy for CUDA devices.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading

import numpy as np

try:  # bfloat16/float16 helpers for CPU arrays
    import ml_dtypes
except ImportError:  # pragma: no cover - ml_dtypes is a runtime dependency, kept optional here
    ml_dtypes = None

# ---------------------------------------------------------------------------------------------- dtypes
float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
float16 = np.dtype(np.float16)
bfloat16 = np.dtype(ml_dtypes.bfloat16) if ml_dtypes is not None else None
int64 = np.dtype(np.int64)
int32 = np.dtype(np.int32)
int16 = np.dtype(np.int16)
int8 = np.dtype(np.int8)
uint8 = np.dtype(np.uint8)
uint16 = np.dtype(np.uint16)
bool_ = np.dtype(np.bool_)

_DTYPE_NAMES = {
    "float32": float32, "float": float32, "fp32": float32,
    "float64": float64, "double": float64, "fp64": float64,
    "float16": float16, "half": float16, "fp16": float16,
    "int64": int64, "long": int64, "int32": int32, "int": int32, "int16": int16, "int8": int8,
    "uint8": uint8, "uint16": uint16, "bool": bool_,
}
if bfloat16 is not None:
    _DTYPE_NAMES.update({"bfloat16": bfloat16, "bf16": bfloat16})

_default_dtype = float32


def get_default_dtype():
    return _default_dtype


def set_default_dtype(dtype):
    global _default_dtype
    _default_dtype = as_dtype(dtype)


def as_dtype(dtype):
    """Accept a numpy dtype, a Python/numpy type, or a name like "float32"; return a numpy dtype."""
    if dtype is None:
        return None
    if isinstance(dtype, str):
        try:
            return _DTYPE_NAMES[dtype.lower()]
        except KeyError:
            raise TypeError(f"unknown dtype {dtype!r}: expected one of {sorted(_DTYPE_NAMES)}") from None
    if dtype is bool:
        return bool_
    if dtype is float:
        return float32
    if dtype is int:
        return int64
    try:
        return np.dtype(dtype)
    except TypeError:
        raise TypeError(f"unknown dtype {dtype!r}: expected a numpy dtype or a name like 'float32'") from None


def is_floating(dtype):
    return dtype.kind == "f" or (bfloat16 is not None and dtype == bfloat16)


# --------------------------------------------------------------------------------------------- devices
_cupy = None


def cupy_module():
    """Import cupy on first use; raise a clear error where it is missing."""
    global _cupy
    if _cupy is None:
        try:
            import cupy
        except ImportError as exc:
            raise RuntimeError(
                "a cuda device needs cupy, which is not installed.\n"
                "HINT: pip install -e '.[cuda]' on a machine with an NVIDIA GPU, or use device='cpu'") from exc
        _cupy = cupy
    return _cupy


def cuda_available():
    try:
        return cupy_module().cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


class Device:
    """A device tag. Instances are interned: ``Device.parse("cpu:1") is Device.parse("cpu:1")``."""

    __slots__ = ("type", "index", "xp", "_name")
    _interned: dict = {}

    def __init__(self, type_, index):
        self.type = type_
        self.index = index
        self.xp = np if type_ == "cpu" else _META_XP if type_ == "meta" else None
        self._name = "cpu" if (type_ == "cpu" and index == 0) else "meta" if type_ == "meta" else f"{type_}:{index}"

    @classmethod
    def parse(cls, spec=None) -> "Device":
        if spec is None:
            return _default.device
        if isinstance(spec, Device):
            return spec
        key = spec
        found = cls._interned.get(key)
        if found is not None:
            return found
        if not isinstance(spec, str):
            raise TypeError(f"device: expected a string like 'cpu', 'cpu:1' or 'cuda:0', got {type(spec).__name__}")
        kind, _, idx = spec.strip().partition(":")
        if kind not in ("cpu", "cuda", "meta") or (idx and not idx.isdigit()):
            raise ValueError(f"device: expected 'cpu', 'cpu:N', 'cuda:N' or 'meta', got {spec!r}")
        index = int(idx) if idx else 0
        norm = (kind, index)
        dev = cls._interned.get(norm)
        if dev is None:
            dev = cls(kind, index)
            cls._interned[norm] = dev
        cls._interned[key] = dev
        return dev

    def array_module(self):
        if self.xp is None:
            self.xp = cupy_module()
        return self.xp

    @property
    def is_cuda(self):
        return self.type == "cuda"

    def context(self):
        """Context manager making this device current (a no-op for CPU devices)."""
        if self.type == "cuda":
            return cupy_module().cuda.Device(self.index)
        return _NULL_CONTEXT

    def __enter__(self):
        """``with it.device("meta"):`` makes this the device of factories and layers given none."""
        _default.stack.append(_default.device)
        _default.device = self
        return self

    def __exit__(self, *exc):
        _default.device = _default.stack.pop()
        return False

    def __repr__(self):
        return f"device('{self._name}')"

    def __str__(self):
        return self._name

    def __reduce__(self):
        return (Device.parse, (self._name,))


class _NullContext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NULL_CONTEXT = _NullContext()


def host_errstate(xp, **kinds):
    """``numpy.errstate(**kinds)`` for the host's array modules (numpy, the meta device's); a no-op for cupy, which
    has no floating-point warnings to silence."""
    return np.errstate(**kinds) if xp is np or xp is _META_XP else _NULL_CONTEXT


class _MetaArrays:
    """The array module of the meta device: arrays with a shape and dtype but no storage (every element aliases one
    zero, read-only), and writes into them dropped; anything else is numpy's."""

    @staticmethod
    def empty(shape, dtype=None, **_):
        return np.broadcast_to(np.zeros((), dtype or np.float32), shape)

    zeros = ones = empty

    @staticmethod
    def full(shape, fill_value, dtype=None, **_):
        return _MetaArrays.empty(shape, dtype if dtype is not None else np.asarray(fill_value).dtype)

    @staticmethod
    def copyto(dst, src, **_):
        return None

    def __getattr__(self, name):
        return getattr(np, name)


_META_XP = _MetaArrays()


class _InitRecording(threading.local):
    calls = None


_init_recording = _InitRecording()


@contextlib.contextmanager
def recording_inits():
    """Build a model inside this (and ``with it.device("meta"):``) to collect, in order, the init calls its
    constructor makes on meta tensors: (tensor, "normal" | "uniform" | "constant" | "copied", args). Sharded
    initialisation (nn/parallel/sharded_init.py) replays them."""
    previous, _init_recording.calls = _init_recording.calls, []
    try:
        yield _init_recording.calls
    finally:
        _init_recording.calls = previous


def record_init(tensor, kind, *args):
    """Called by a meta tensor's ``normal_`` / ``uniform_`` / fill: remembers the call while recording."""
    if _init_recording.calls is not None:
        _init_recording.calls.append((tensor, kind, args))


def copy_array(array, dev):
    """A copy of ``array`` on ``dev``; on the meta device, a fresh array of its shape and dtype with no storage."""
    return _META_XP.empty(array.shape, array.dtype) if dev is META else array.copy()


class _DefaultDevice(threading.local):
    """The device factories use when given none (``with it.device(...)``), per thread."""

    def __init__(self):
        self.device, self.stack = CPU, []


CPU = Device.parse("cpu")
_default = _DefaultDevice()
META = Device.parse("meta")


def device(spec=None) -> Device:
    return Device.parse(spec)


def data_pointer(array):
    """The address of an array's first element (numpy or cupy)."""
    return array.ctypes.data if isinstance(array, np.ndarray) else array.data.ptr  # (cupy: a MemoryPointer)


def get_xp(dev: Device):
    return dev.xp if dev.xp is not None else dev.array_module()


def device_count(kind="cuda"):
    """Real GPUs for "cuda"; for "cpu", the logical CPU devices (INFINI_TRAIN_CPU_DEVICES, default 8)."""
    if kind == "cuda":
        return cupy_module().cuda.runtime.getDeviceCount() if cuda_available() else 0
    if kind == "cpu":
        return int(os.environ.get("INFINI_TRAIN_CPU_DEVICES", "8"))
    raise ValueError(f"device_count: expected 'cuda' or 'cpu', got {kind!r}")


def is_array_like(value):
    """True for anything shaped and typed as an array: numpy and cupy arrays and scalars, Tensors, other libraries'
    tensors. Their types are not all ours, so this is the one place that asks by attribute."""
    return hasattr(value, "shape") and hasattr(value, "dtype")


def is_cupy_array(value):
    """True for a cupy array (cupy has been imported wherever one exists)."""
    cupy = sys.modules.get("cupy")
    return cupy is not None and isinstance(value, cupy.ndarray)


def is_device_array(value):
    """True for a numpy or cupy ndarray (not a scalar, a Tensor or another library's tensor)."""
    return isinstance(value, np.ndarray) or is_cupy_array(value)


def is_writeable(array):
    """Whether ``array`` may be written in place: a numpy array can be read-only (a broadcast view, the meta
    device's arrays) and a numpy scalar never can; a cupy array always can."""
    return array.flags.writeable if isinstance(array, (np.ndarray, np.generic)) else True


def device_of_array(array):
    """The Device holding a raw array (numpy -> cpu, cupy -> its cuda device)."""
    if is_cupy_array(array):
        return Device.parse(f"cuda:{array.device.id}")
    return CPU


def to_device_array(array, dev: Device):
    """Copy a host or device array onto ``dev`` (returns the same array when nothing needs to move)."""
    if dev.type == "cpu":
        if isinstance(array, np.ndarray):
            return array
        return array.get() if is_cupy_array(array) else np.asarray(array)
    cp = dev.array_module()
    with cp.cuda.Device(dev.index):
        return cp.asarray(array)


# ------------------------------------------------------------------------------------------------- RNG
_host_generator = None
_global_seed = None
_cuda_generators: dict = {}


def manual_seed(seed: int):
    """Seed every generator infini_train draws from (the host's, and each GPU's on first use)."""
    global _host_generator, _global_seed
    _global_seed = int(seed)
    _host_generator = np.random.Generator(np.random.PCG64(_global_seed))
    _cuda_generators.clear()


def host_generator() -> np.random.Generator:
    global _host_generator
    if _host_generator is None:
        _host_generator = np.random.Generator(np.random.PCG64(_global_seed))
    return _host_generator


def generator_for(dev: Device):
    """The random generator for a device: numpy's on CPU devices, a seeded cupy generator on CUDA."""
    if dev.type == "cpu":
        return host_generator()
    gen = _cuda_generators.get(dev.index)
    if gen is None:
        cp = dev.array_module()
        with cp.cuda.Device(dev.index):
            seed = int(host_generator().integers(0, 2**63 - 1))
            gen = cp.random.Generator(cp.random.XORWOW(seed)) if hasattr(cp.random, "XORWOW") \
                else cp.random.RandomState(seed)
        _cuda_generators[dev.index] = gen
    return gen


_forks: dict = {}  # name -> (host generator, {cuda index: generator}): separate random streams


def seed_fork(name, seed):
    """(Re)seed the random stream ``name``, kept apart from the default one (see ``fork_rng``)."""
    _forks[name] = (np.random.Generator(np.random.PCG64(int(seed))), {})


class fork_rng:
    """``with fork_rng(name):`` draws from the stream ``name`` (host and GPUs) instead of the default one; the
    default stream is untouched, and the fork's state carries over to its next use. Tensor parallelism uses it
    for dropout on sharded activations: the default stream is the same on every rank of a tensor group (masks of
    replicated tensors agree), the fork differs per rank (masks of shards are independent)."""

    def __init__(self, name):
        if name not in _forks:
            raise KeyError(f"fork_rng: no random stream named {name!r}\nHINT: seed it first with seed_fork(name, seed)")
        self.name = name

    def __enter__(self):
        global _host_generator, _cuda_generators
        self._saved = (_host_generator, _cuda_generators)
        _host_generator, _cuda_generators = _forks[self.name]
        return self

    def __exit__(self, *exc):
        global _host_generator, _cuda_generators
        _forks[self.name] = (_host_generator, _cuda_generators)
        _host_generator, _cuda_generators = self._saved
        return False


def get_rng_state():
    """A JSON-serialisable snapshot of the host generator (for checkpoints)."""
    return host_generator().bit_generator.state


def set_rng_state(state):
    global _host_generator
    gen = np.random.Generator(np.random.PCG64())
    gen.bit_generator.state = state
    _host_generator = gen
    _cuda_generators.clear()


def get_rng_state_all():
    """A snapshot of every random stream: the default one (the host generator and each GPU generator created so
    far) and every named fork (``seed_fork``), for ``set_rng_state_all``. Activation recomputation uses the pair
    to replay dropout masks. GPU states are copies of the generators' device arrays (cupy's XORWOW keeps one
    curand state per thread), so the snapshot is for this process; ``get_rng_state`` is the serialisable one."""
    return {"default": _stream_state(host_generator(), _cuda_generators),
            "forks": {name: _stream_state(host, gpus) for name, (host, gpus) in _forks.items()}}


def set_rng_state_all(state):
    """Put every random stream back as ``get_rng_state_all`` saw it: states are written into the existing
    generators, so inside ``fork_rng`` the current stream and its fork stay one object; the current stream is
    written last, so draws from it continue as they did at the snapshot. Generators and forks created since are
    dropped, ones dropped since are re-created."""
    global _host_generator
    forks = state["forks"]
    for name in [n for n in _forks if n not in forks]:
        del _forks[name]
    for name, (host, gpus) in forks.items():
        old_host, old_gpus = _forks.get(name, (None, {}))
        _forks[name] = (_restore_stream(old_host, old_gpus, host, gpus), old_gpus)
    host, gpus = state["default"]
    _host_generator = _restore_stream(_host_generator, _cuda_generators, host, gpus)


def _stream_state(host, gpus):
    return host.bit_generator.state, {index: _gpu_state(index, gen) for index, gen in gpus.items()}


def _gpu_state(index, gen):
    bits = getattr(gen, "bit_generator", None)
    if getattr(bits, "_state", None) is None:
        raise RuntimeError(
            f"get_rng_state_all: the generator of cuda:{index} ({type(gen).__name__}) has no state that can be "
            "copied.\nHINT: use a cupy with cupy.random.XORWOW (v9 or later), or checkpoint(..., "
            "preserve_rng_state=False) if the function draws no random numbers on the GPU")
    with cupy_module().cuda.Device(index):
        return bits._state.copy()


def _restore_stream(host, gpus, host_state, gpu_states):
    """Write the saved states into ``host`` (a new generator when None) and the GPU dict ``gpus``, in place."""
    if host is None or type(host.bit_generator).__name__ != host_state["bit_generator"]:
        host = np.random.Generator(getattr(np.random, host_state["bit_generator"])())
    host.bit_generator.state = host_state
    for index in [i for i in gpus if i not in gpu_states]:
        del gpus[index]
    for index, saved in gpu_states.items():
        cp = cupy_module()
        with cp.cuda.Device(index):
            gen = gpus.get(index)
            if gen is None:
                gen = gpus[index] = cp.random.Generator(cp.random.XORWOW(0))
            gen.bit_generator._state[...] = saved
    return host


# ---------------------------------------------------------------------------------------- host memory
def tune_host_allocator(threshold=1 << 30, top_pad=256 << 20):
    """Keep large host buffers in glibc's heap so they are reused across training steps.

    By default glibc serves every allocation over 32 MB with a fresh mmap and unmaps it on free, so each
    step page-faults its logits, embedding gradients and optimizer scratch in again (measured: GPT-2 124M
    steps alternated 1.2 s / 1.6 s). Raising the mmap and trim thresholds removes that. Linux/glibc only;
    returns whether it was applied. Disabled with INFINI_TRAIN_TUNE_MALLOC=0.
    """
    import ctypes
    import sys

    if sys.platform != "linux" or os.environ.get("INFINI_TRAIN_TUNE_MALLOC", "1") == "0":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
    return bool(libc.mallopt(M_MMAP_THRESHOLD, threshold) and libc.mallopt(M_TRIM_THRESHOLD, threshold)
                and libc.mallopt(M_TOP_PAD, top_pad))


HOST_ALLOCATOR_TUNED = tune_host_allocator()
