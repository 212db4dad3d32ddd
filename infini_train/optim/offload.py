"""Where an optimizer keeps its per-parameter state (``train.optimizer_offload``), and how its update reaches it.

A state store gives the optimizer its state arrays (``zeros``, ``keep``) and hands the update its arrays chunk by chunk
(``chunks``): the parameter's, the gradient's and the state's pieces of one range of elements, on one device. The
update itself is the optimizer's, element for element the same arithmetic wherever the state lives, so every store
gives the same bits.

* ``InMemory`` (``none``): the state arrays beside the parameters, on their device; one chunk, the whole arrays.
* ``HostStore`` (``host``, DeepSpeed's ZeRO-Offload): the state in the host's memory (pinned on GPU runs); the update
  runs on the host, ``CHUNK`` elements at a time: the gradient's chunk copied to the host, the parameter's copied back.
* ``DiskStore`` (``disk``, ZeRO-Infinity's NVMe offload): the state in a file per rank under
  ``out_dir/offload/rank<R>/``, read and written back ``CHUNK`` elements at a time (the next chunk read on a background
  thread while the current one is updated), so a rank's memory holds one chunk of it between steps. The state arrays
  the optimizer keeps are ``OffloadedArray`` records of regions of that file; reading one (``numpy.asarray``, slices)
  reads the file, so state dicts and checkpoints see the same values as in memory, one piece at a time. The file is
  sparse scratch space, never a checkpoint: made afresh by each run (a stale one of a killed run is removed) and
  removed with the store (at the latest when the process exits).
"""
from __future__ import annotations

import glob
import os
import tempfile
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .. import backend

KINDS = ("none", "disk", "host")
CHUNK = 1 << 20  # elements per chunk of an offloaded update (4 MB of each float32 array)
_ALIGN = 4096  # file regions start on page boundaries
_FILE_PREFIX = "optimizer-state-"


class OffloadError(RuntimeError):
    """An offload directory that cannot take the optimizer state (unwritable, or too little free space)."""


class InMemory:
    """The state arrays on the parameters' device (no offload)."""

    kind = "none"

    def reserve(self, params, arrays_per_param):
        """Check that the state of ``params`` (``arrays_per_param`` arrays of each one's size) fits; nothing here."""

    def zeros(self, p, key):
        """A zero state array ``key`` for ``p`` (the tensor the optimizer steps)."""
        with p.device.context():
            return p.device.array_module().zeros_like(p.array)

    def keep(self, p, key, array):
        """The state array ``key`` of ``p`` to keep, from ``array`` (restored on ``p``'s device, the caller's)."""
        return array

    def holds(self, value):
        """Whether ``value`` is a state array this store keeps elsewhere than in memory (kept as it is on load)."""
        return False

    def offloaded(self, value):
        """Whether ``value`` (a state array) lives outside the device memory."""
        return False

    def copy_out(self, p, value):
        """A copy of the state array ``value`` of ``p`` on ``p``'s device (a state dict's snapshot)."""
        return value.copy()

    def chunks(self, p, states):
        """(device, [parameter, gradient, *states]) for each chunk of ``p``'s elements; whatever the caller updates in
        place reaches the parameter and the state once it asks for the next chunk. Here: one chunk, the arrays."""
        yield p.device, [p.array, p.grad.array, *states]

    def close(self):
        """Release what the store holds outside the optimizer's arrays (files, buffers)."""


class HostStore(InMemory):
    """The state in host memory (pinned when the parameters are on a GPU); the update runs there in chunks."""

    kind = "host"

    def __init__(self, chunk=None):
        self.chunk = int(chunk or CHUNK)
        self._buffers = {}  # (name, dtype) -> a host array of at least one chunk (pinned on GPU runs)

    def zeros(self, p, key):
        array = self._host_array(p.array.shape, p.array.dtype, p.device)
        array[...] = 0
        return array

    def keep(self, p, key, array):
        kept = self._host_array(array.shape, array.dtype, p.device)
        kept[...] = backend.to_device_array(array, backend.CPU)
        return kept

    def offloaded(self, value):
        return True

    def copy_out(self, p, value):
        return backend.to_device_array(np.array(value), p.device)

    @staticmethod
    def _host_array(shape, dtype, device):
        if device.type == "cpu":
            return np.empty(shape, dtype)
        import cupy

        count = int(np.prod(shape, dtype=np.int64))
        memory = cupy.cuda.alloc_pinned_memory(max(count, 1) * np.dtype(dtype).itemsize)
        return np.frombuffer(memory, dtype, count).reshape(shape)  # (the array keeps the pinned memory alive)

    def _buffer(self, name, length, dtype, device):
        key = (name, np.dtype(dtype))
        buf = self._buffers.get(key)
        if buf is None or buf.size < length:
            buf = self._buffers[key] = self._host_array((max(length, self.chunk),), dtype, device)
        return buf[:length]

    def chunks(self, p, states):
        param, grad = p.array, p.grad.array
        on_host = p.device.type == "cpu"
        if not (param.flags.c_contiguous and grad.flags.c_contiguous):  # a transposed parameter: one whole chunk
            yield from self._whole(p, param, grad, states)
            return
        flat_param, flat_grad, size = param.reshape(-1), grad.reshape(-1), param.size
        reads = self._state_reads(states, size)
        for begin in range(0, size, self.chunk):
            end = min(begin + self.chunk, size)
            if on_host:
                host_param, host_grad = flat_param[begin:end], flat_grad[begin:end]
            else:  # the gradient's chunk to the host, the parameter's back after the update
                host_param = flat_param[begin:end].get(out=self._buffer("param", end - begin, param.dtype, p.device))
                host_grad = flat_grad[begin:end].get(out=self._buffer("grad", end - begin, grad.dtype, p.device))
            pieces = reads.take(begin, end)
            yield backend.CPU, [host_param, host_grad, *pieces]
            reads.put_back(begin, end, pieces)
            if not on_host:
                flat_param[begin:end].set(host_param)
                _synchronize()

    def _whole(self, p, param, grad, states):
        host_param = np.array(backend.to_device_array(param, backend.CPU))
        host_grad = backend.to_device_array(grad, backend.CPU)
        reads = self._state_reads(states, param.size)
        pieces = [piece.reshape(param.shape) for piece in reads.take(0, param.size)]
        yield backend.CPU, [host_param, host_grad, *pieces]
        reads.put_back(0, param.size, [piece.reshape(-1) for piece in pieces])
        param[...] = backend.to_device_array(host_param, p.device)

    def _state_reads(self, states, size):
        return _HostViews(states)


class _HostViews:
    """The chunks of host state arrays: views, written in place."""

    def __init__(self, states):
        self.flat = [s.reshape(-1) for s in states]

    def take(self, begin, end):
        return [s[begin:end] for s in self.flat]

    def put_back(self, begin, end, pieces):
        pass


def _synchronize():
    import cupy

    cupy.cuda.get_current_stream().synchronize()  # the pinned buffer is reused by the next chunk


class DiskStore(HostStore):
    """The state in one file per rank under ``directory``/rank<R>/ (see the module docstring)."""

    kind = "disk"

    def __init__(self, directory, rank=0, chunk=None, prefetch=True):
        super().__init__(chunk)
        self.directory = os.path.join(os.path.abspath(directory), f"rank{rank:05d}")
        try:
            os.makedirs(self.directory, exist_ok=True)
            for stale in glob.glob(os.path.join(self.directory, f"{_FILE_PREFIX}*")):  # a killed run's scratch file
                os.remove(stale)
            fd, self.path = tempfile.mkstemp(prefix=_FILE_PREFIX, suffix=".bin", dir=self.directory)
        except OSError as exc:
            raise OffloadError(f"train.optimizer_offload: expected a writable directory for the optimizer state, got "
                               f"{self.directory!r}: {exc.strerror or exc}\nHINT: set out_dir to a writable directory "
                               "with room for the optimizer state, or train.optimizer_offload=none") from None
        self.fd = fd
        self.size = 0  # bytes of the file given out
        self.regions = {}  # (id of the stepped tensor, key) -> OffloadedArray
        self.prefetch = ThreadPoolExecutor(1, thread_name_prefix="offload-read") if prefetch else None
        self._finalizer = weakref.finalize(self, _remove, fd, self.path, self.directory, self.prefetch)

    # ----------------------------------------------------------------------------------------- the file
    def reserve(self, params, arrays_per_param):
        need = sum(_aligned(p.array.nbytes) for p in params) * arrays_per_param
        stat = os.statvfs(self.directory)
        free = stat.f_bavail * stat.f_frsize
        if need > free:
            raise OffloadError(f"train.optimizer_offload: expected room for this rank's optimizer state "
                               f"({need / 2 ** 20:.2f} MB) in {self.directory}, got {free / 2 ** 20:.2f} MB free\n"
                               "HINT: free space there, point out_dir at a larger disk, or train.optimizer_offload="
                               "none (or host on GPUs)")

    def _region(self, p, key):
        region = self.regions.get((id(p), key))
        if region is None or region.shape != tuple(p.array.shape) or region.dtype != p.array.dtype:
            offset = self.size
            nbytes = p.array.nbytes
            self.size += _aligned(nbytes)
            if nbytes:
                try:
                    os.posix_fallocate(self.fd, offset, _aligned(nbytes))  # disk full: an error now, not mid-step
                except OSError as exc:
                    raise OffloadError(f"train.optimizer_offload: could not extend {self.path} to "
                                       f"{self.size / 2 ** 20:.1f} MB: {exc.strerror or exc}\nHINT: free space in "
                                       f"{self.directory}, or train.optimizer_offload=none") from None
            region = self.regions[(id(p), key)] = OffloadedArray(self, offset, p.array.shape, p.array.dtype)
        return region

    def zeros(self, p, key):
        region = self._region(p, key)
        zeros = np.zeros(min(region.size, self.chunk), region.dtype)
        for begin in range(0, region.size, self.chunk):
            end = min(begin + self.chunk, region.size)
            self.write(region.offset + begin * region.dtype.itemsize, zeros[:end - begin])
        return region

    def keep(self, p, key, array):
        region = self._region(p, key)
        host = np.ascontiguousarray(backend.to_device_array(array, backend.CPU), dtype=region.dtype).reshape(-1)
        self.write(region.offset, host)
        return region

    def holds(self, value):
        return isinstance(value, OffloadedArray) and value.store is self

    def copy_out(self, p, value):
        return backend.to_device_array(np.asarray(value), p.device)

    def read_into(self, offset, out):
        view = memoryview(out.reshape(-1).view(np.uint8))
        while len(view):
            n = os.preadv(self.fd, [view], offset)
            if n <= 0:
                raise OffloadError(f"train.optimizer_offload: {self.path} ended at byte {offset} (removed while the "
                                   "run was using it?)")
            view, offset = view[n:], offset + n
        return out

    def write(self, offset, array):
        view = memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
        while len(view):
            n = os.pwrite(self.fd, view, offset)
            view, offset = view[n:], offset + n

    def _state_reads(self, states, size):
        return _FileChunks(self, states, size)

    def resident_bytes(self):
        """The bytes of chunk buffers this store holds."""
        return sum(b.nbytes for b in self._buffers.values())

    def close(self):
        self._finalizer()


class _FileChunks:
    """The chunks of a parameter's file-backed state arrays, read into two alternating sets of buffers: while the
    caller updates one chunk, the next one is read on the store's background thread."""

    def __init__(self, store, states, size):
        self.store, self.states, self.size = store, states, size
        self.sets = [[store._buffer(f"state{k}.{side}", min(store.chunk, size), s.dtype, backend.CPU)
                      for k, s in enumerate(states)] for side in range(2)]
        self.turn = 0
        self.pending = None  # (begin, future) of the chunk being read ahead

    def _read(self, begin, end, side):
        out = [buf[:end - begin] for buf in self.sets[side]]
        for s, buf in zip(self.states, out):
            self.store.read_into(s.offset + begin * s.dtype.itemsize, buf)
        return out

    def take(self, begin, end):
        side = self.turn
        if self.pending is not None and self.pending[0] == begin:
            pieces = self.pending[1].result()
        else:
            pieces = self._read(begin, end, side)
        self.pending = None
        following = end + self.store.chunk
        if end < self.size and self.store.prefetch is not None:
            self.pending = (end, self.store.prefetch.submit(self._read, end, min(following, self.size), 1 - side))
        self.turn = 1 - side
        return pieces

    def put_back(self, begin, end, pieces):
        if self.store.prefetch is None:
            self._write(begin, pieces)
            return
        # queued after the read ahead, so before the next read into these buffers; the last chunk's waited for (and
        # with it every earlier one), so the file holds the whole update when the step goes on
        written = self.store.prefetch.submit(self._write, begin, pieces)
        if end == self.size:
            written.result()

    def _write(self, begin, pieces):
        for s, piece in zip(self.states, pieces):
            self.store.write(s.offset + begin * s.dtype.itemsize, piece)


def _remove(fd, path, directory, prefetch):
    if prefetch is not None:
        prefetch.shutdown(wait=True)
    try:
        os.close(fd)
    except OSError:
        pass
    with _quiet():
        os.remove(path)
    for folder in (directory, os.path.dirname(directory)):  # rank<R>/ and offload/ once empty
        with _quiet():
            os.rmdir(folder)


class _quiet:
    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        return kind is not None and issubclass(kind, OSError)


def _aligned(nbytes):
    return -(-int(nbytes) // _ALIGN) * _ALIGN


class OffloadedArray:
    """A state array kept in a DiskStore's file: ``shape``, ``dtype`` and the byte ``offset`` of its C-ordered
    elements. Reading it (``numpy.asarray``, ``copy``) reads the file; ``reshape`` and slices that select a contiguous
    range are records of that range (read when they are read), other slices are read at once."""

    def __init__(self, store, offset, shape, dtype):
        self.store, self.offset = store, int(offset)
        self.shape, self.dtype = tuple(int(n) for n in shape), np.dtype(dtype)

    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: int(np.prod(self.shape, dtype=np.int64)))
    nbytes = property(lambda self: self.size * self.dtype.itemsize)

    def __len__(self):
        return self.shape[0]

    def __array__(self, dtype=None, copy=None):
        out = self.store.read_into(self.offset, np.empty(self.shape, self.dtype))
        return out if dtype is None else out.astype(dtype, copy=False)

    def copy(self):
        return np.asarray(self)

    def reshape(self, *shape):
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        shape = list(shape)
        if -1 in shape:
            known = int(np.prod([n for n in shape if n != -1], dtype=np.int64))
            shape[shape.index(-1)] = self.size // known if known else 0
        if int(np.prod(shape, dtype=np.int64)) != self.size:
            raise ValueError(f"cannot reshape an offloaded array of size {self.size} into shape {tuple(shape)}")
        return OffloadedArray(self.store, self.offset, shape, self.dtype)

    def __getitem__(self, key):
        key = key if isinstance(key, tuple) else (key,)
        ranges = _contiguous(key, self.shape)
        if ranges is None:  # not a contiguous block: read it
            return np.asarray(self)[key]
        start, shape = ranges
        return OffloadedArray(self.store, self.offset + start * self.dtype.itemsize, shape, self.dtype)

    def __repr__(self):
        return f"OffloadedArray(shape={self.shape}, dtype={self.dtype}, file={self.store.path!r}@{self.offset})"


def _contiguous(key, shape):
    """(first flat element, shape) of what basic slices ``key`` select from a C-ordered array of ``shape``, when that
    is one contiguous range; None otherwise."""
    if len(key) > len(shape) or not all(isinstance(k, slice) for k in key):
        return None
    key = key + (slice(None),) * (len(shape) - len(key))
    bounds = []
    for k, n in zip(key, shape):
        start, stop, step = k.indices(n)
        if step != 1:
            return None
        bounds.append((start, max(stop, start)))
    sizes = [b - a for a, b in bounds]
    if all(sizes):  # the axes after the first one selecting more than one element must be whole
        first = next((i for i, n in enumerate(sizes) if n != 1), len(sizes))
        if any(sizes[i] != shape[i] for i in range(first + 1, len(shape))):
            return None
    start = 0
    for (a, _), n in zip(bounds, shape):
        start = start * n + a
    return start, tuple(sizes)


def materialized(value):
    """``value`` as an array in memory (an OffloadedArray read from its file; anything else as it is)."""
    return np.asarray(value) if isinstance(value, OffloadedArray) else value


def make_store(kind, directory=None, rank=0):
    """The store for ``train.optimizer_offload`` = ``kind``: none, host, or disk (under ``directory``)."""
    if kind == "none":
        return InMemory()
    if kind == "host":
        return HostStore()
    if kind == "disk":
        if directory is None:
            raise ValueError("make_store: disk offload needs a directory, got None")
        return DiskStore(directory, rank)
    raise ValueError(f"train.optimizer_offload: expected one of {KINDS}, got {kind!r}")


__all__ = ["KINDS", "CHUNK", "InMemory", "HostStore", "DiskStore", "OffloadedArray", "OffloadError", "make_store",
           "materialized"]
