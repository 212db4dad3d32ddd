"""ProcessGroup and ReduceOp: the collectives every backend offers, with their argument checks.

Collectives work in place on a Tensor's array (``t.array``), as torch.distributed's do. They are not
autograd operations: they write the memory under the graph and bump the tensor's version counter, so a
tensor saved for backward and then overwritten by a collective is caught. A raw numpy/cupy array is
accepted too. Every call is asynchronous underneath and returns a Work; ``async_op=False`` waits on it, so
sync calls get the collective timeout as well.

The flat collectives ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` work on one contiguous buffer
that holds a chunk per rank (chunk r is elements [r*n, (r+1)*n) of the flattened buffer, whatever its shape),
and accept the in-place form where the per-rank tensor is this rank's own chunk of that buffer (ZeRO
all-gathers its updated shard straight into the flat parameters this way).

``all_to_all_single`` (torch's) splits ``input`` along dim 0 into one block of rows per rank (``input_split_sizes``,
None: equal blocks) and concatenates the blocks every rank sent this one into ``output`` in rank order
(``output_split_sizes`` rows from each); expert parallelism dispatches tokens with it.

A backend subclass implements ``_all_reduce``, ``_broadcast``, ``_all_gather``, ``_reduce_scatter``,
``_all_gather_into_tensor``, ``_reduce_scatter_tensor``, ``_all_to_all_single``, ``_reduce``, ``_barrier``,
``_send`` and ``_recv`` on arrays, each returning a Work. The flat ones get 1-D views and whether the call is in
place; ``_all_to_all_single`` gets the split sizes as tuples of ints (rows), checked.
"""
from __future__ import annotations

import enum
import functools

import numpy as np

from .. import backend
from ..autograd import observers
from . import comm_counters, hang
from . import work as work_module
from ..tensor import array_of
from .work import DEFAULT_TIMEOUT, CompletedWork, Launch, Work


class ReduceOp(enum.Enum):
    SUM = "sum"
    AVG = "avg"
    MAX = "max"
    MIN = "min"
    PRODUCT = "product"

    @classmethod
    def parse(cls, op, what="reduce op"):
        """A ReduceOp from a ReduceOp or a name such as "sum", "AVG", "prod" (what autograd hooks pass on)."""
        if isinstance(op, cls):
            return op
        name = op.lower() if isinstance(op, str) else None
        found = _OP_NAMES.get(name)
        if found is None:
            raise ValueError(f"{what}: expected a ReduceOp or one of {sorted(_OP_NAMES)}, got {op!r}\n"
                             "HINT: use infini_train.distributed.ReduceOp.SUM / AVG / MAX / MIN / PRODUCT")
        return found


_OP_NAMES = {"sum": ReduceOp.SUM, "avg": ReduceOp.AVG, "mean": ReduceOp.AVG, "max": ReduceOp.MAX,
             "min": ReduceOp.MIN, "product": ReduceOp.PRODUCT, "prod": ReduceOp.PRODUCT}


def is_floating(dtype):
    return dtype.kind in "fc" or dtype.name == "bfloat16"


def _array_of(tensor, what, writes):
    """The array under a Tensor (or a raw numpy/cupy array), checked to be writable when the call writes."""
    arr = array_of(tensor)
    if not (backend.is_device_array(arr) or isinstance(arr, np.generic)):
        raise TypeError(f"{what}: expected an infini_train Tensor (or a numpy/cupy array), got "
                        f"{type(tensor).__name__}")
    if writes and type(arr) is np.ndarray and not arr.flags.writeable:
        raise ValueError(f"{what}: expected a writable tensor, got a read-only array of shape {arr.shape}\n"
                         "HINT: collectives write in place; pass a tensor that owns its memory (t.contiguous() "
                         "or a copy), not a broadcast view")
    return arr


def _place(tensor, arr):
    """Where ``arr`` lives, for device checks: the Tensor's device, or "cpu" / "cuda:N" for a raw array."""
    if tensor is not arr:
        return str(tensor.device)
    return "cpu" if isinstance(arr, np.ndarray) else f"cuda:{arr.device.id}"


def _address(arr):
    return arr.__array_interface__["data"][0] if isinstance(arr, np.ndarray) else arr.data.ptr


def _check_alike(what, first, second):
    """Two operands (name, array, tensor) of one collective: one dtype, on one device."""
    (a_name, a, a_tensor), (b_name, b, b_tensor) = first, second
    if a.dtype != b.dtype:
        raise ValueError(f"{what}: expected {a_name} and {b_name} of one dtype, got {a_name} {a.dtype} and {b_name} "
                         f"{b.dtype}\nHINT: cast one of them with t.to(dtype)")
    where_a, where_b = _place(a_tensor, a), _place(b_tensor, b)
    if where_a != where_b:
        raise ValueError(f"{what}: expected {a_name} and {b_name} on one device, got {a_name} on {where_a} and "
                         f"{b_name} on {where_b}\nHINT: move one with t.to(device)")


def _span(arr):
    """The byte range [start, end) that ``arr``'s elements occupy, whatever its strides (empty: nothing)."""
    if arr.size == 0:
        return 0, 0
    start = end = _address(arr)
    for n, stride in zip(arr.shape, arr.strides):
        if stride < 0:
            start += (n - 1) * stride
        else:
            end += (n - 1) * stride
    return start, end + arr.itemsize


def _bump(*tensors):
    for t in tensors:
        version = getattr(t, "_version", None)
        if version is not None:
            version[0] += 1


def _result(work, async_op):
    if async_op:
        return work
    work.wait()
    return None


def _observed(name, sent=None, kind=None, size=None):
    """Run the collective as a ``"<backend>:<name>"`` range for the op observers (the profiler's collectives) and
    count what it moves (argument ``sent``: the position of what this rank hands over) for the open communication
    counters (comm_counters.py); one list test for each when none is open.

    ``kind`` "collective" numbers the call on its group (``group.sequence``: every rank of a group calls its
    collectives in the same order, so the numbers agree across ranks) and "transfer" (a send or receive; the peer is
    the argument after the tensor) does not; either way the Works started inside carry the call's Launch (work.py),
    which a timeout reports (hang.py), with the bytes of argument ``sent`` (or ``size``: a receive's buffer). A group
    of one (it completes at once, it cannot hang) skips that. None: a wrapper of calls that do this themselves."""
    def wrap(method):
        @functools.wraps(method)
        def observed(self, *args, **kwargs):
            if not observers.ACTIVE:
                return method(self, *args, **kwargs)
            with observers.record(f"{self.backend}:{name}", "collective"):
                return method(self, *args, **kwargs)

        if kind is None:
            return observed

        @functools.wraps(method)
        def run(self, *args, **kwargs):
            if self.size == 1:  # a group of one completes at once: nothing can hang, no Launch
                if comm_counters.ACTIVE and sent is not None:
                    comm_counters.record(name, self.ranks, args[sent] if len(args) > sent else None)
                return observed(self, *args, **kwargs)
            at = sent if sent is not None else size
            nbytes = comm_counters.nbytes(args[at]) if at is not None and len(args) > at else 0
            if comm_counters.ACTIVE and sent is not None:
                comm_counters.add(name, self.ranks, nbytes)
            if kind == "collective":
                self.sequence += 1
                launch = self.last_collective = Launch(name, self, self.sequence, nbytes)
            else:
                launch = self.last_transfer = Launch(name, self, None, nbytes, self._world_peer(args, kwargs))
            work_module._launch = launch
            try:
                return observed(self, *args, **kwargs)
            finally:
                work_module._launch = None
        return run
    return wrap


class ProcessGroup:
    """A set of ranks and the collectives among them.

    ``ranks`` are world ranks in group order, ``rank`` is this process's rank inside the group, ``size`` the
    number of ranks, ``world_rank`` this process's world rank, ``timeout`` the collective timeout (seconds).
    ``sequence`` counts the collectives called on the group (the last one's Launch: ``last_collective``; the last
    send or receive's: ``last_transfer``); ``key`` names the group alike on every member (hang.py).
    """

    backend = "base"

    def __init__(self, ranks, rank, timeout=DEFAULT_TIMEOUT):
        self.ranks = list(ranks)
        self.rank = int(rank)
        self.size = len(self.ranks)
        self.world_rank = self.ranks[self.rank]
        self.timeout = float(timeout)
        self.sequence = 0
        self.last_collective = self.last_transfer = None
        self.key = hang.register(self)

    def _world_peer(self, args, kwargs):
        """The world rank of a send's or receive's peer (its group rank follows the tensor), or None."""
        peer = args[1] if len(args) > 1 else kwargs.get("dst", kwargs.get("src"))
        if isinstance(peer, (int, np.integer)) and 0 <= peer < self.size:
            return self.ranks[peer]
        return None

    def describe(self, name):
        """``name`` with the group's ranks, this rank and the backend, for error messages."""
        return (f"{name} on group ranks {self.ranks} (this is world rank {self.world_rank}, group rank {self.rank}; "
                f"backend {self.backend})")

    def __repr__(self):
        return f"<{type(self).__name__} backend={self.backend} ranks={self.ranks} rank={self.rank}>"

    # ------------------------------------------------------------------------------ collectives
    @_observed("all_reduce", sent=0, kind="collective")
    def all_reduce(self, tensor, op=ReduceOp.SUM, async_op=False):
        """Reduce ``tensor`` across the group; every rank ends with the result, in place."""
        arr = _array_of(tensor, "all_reduce", writes=True)
        op = self._reduce_op(op, arr.dtype, "all_reduce")
        work = self._all_reduce(arr, op)
        _bump(tensor)
        return _result(work, async_op)

    @_observed("broadcast", sent=0, kind="collective")
    def broadcast(self, tensor, src=0, async_op=False):
        """Copy rank ``src``'s ``tensor`` into ``tensor`` on every other rank."""
        arr = _array_of(tensor, "broadcast", writes=True)
        self._check_peer(src, "broadcast", "src", allow_self=True)
        work = self._broadcast(arr, src)
        if self.rank != src:
            _bump(tensor)
        return _result(work, async_op)

    @_observed("all_gather", sent=1, kind="collective")
    def all_gather(self, tensor_list, tensor, async_op=False):
        """``tensor_list[r]`` receives rank r's ``tensor`` on every rank."""
        arr = _array_of(tensor, "all_gather", writes=False)
        outs = self._check_list(tensor_list, arr, "all_gather", "tensor_list", writes=True)
        work = self._all_gather(outs, arr)
        _bump(*tensor_list)
        return _result(work, async_op)

    @_observed("reduce_scatter", sent=1, kind="collective")
    def reduce_scatter(self, output, input_list, op=ReduceOp.SUM, async_op=False):
        """``output`` on rank r receives the reduction over ranks of their ``input_list[r]``."""
        out = _array_of(output, "reduce_scatter", writes=True)
        ins = self._check_list(input_list, out, "reduce_scatter", "input_list", writes=False)
        op = self._reduce_op(op, out.dtype, "reduce_scatter")
        work = self._reduce_scatter(out, ins, op)
        _bump(output)
        return _result(work, async_op)

    @_observed("all_gather_into_tensor", sent=1, kind="collective")
    def all_gather_into_tensor(self, output, input, async_op=False):
        """Rank r's ``input`` lands in chunk r of ``output`` (``output.numel() == size * input.numel()``, e.g.
        shape ``(size * n,)``, ``(size * d0, ...)`` or ``(size, *input.shape)``), on every rank. ``input`` may be
        this rank's own chunk of ``output`` (in place)."""
        what = "all_gather_into_tensor"
        out = _array_of(output, what, writes=True)
        arr = _array_of(input, what, writes=False)
        out, arr, in_place = self._check_flat(what, out, arr, output, input, "output", "input")
        work = self._all_gather_into_tensor(out, arr, in_place)
        _bump(output)
        return _result(work, async_op)

    @_observed("reduce_scatter_tensor", sent=1, kind="collective")
    def reduce_scatter_tensor(self, output, input, op=ReduceOp.SUM, async_op=False):
        """``output`` on rank r receives the reduction over ranks of chunk r of their ``input``
        (``input.numel() == size * output.numel()``). ``output`` may be this rank's own chunk of ``input``."""
        what = "reduce_scatter_tensor"
        out = _array_of(output, what, writes=True)
        arr = _array_of(input, what, writes=False)
        op = self._reduce_op(op, out.dtype, what)
        arr, out, in_place = self._check_flat(what, arr, out, input, output, "input", "output")
        work = self._reduce_scatter_tensor(out, arr, op, in_place)
        _bump(output)
        return _result(work, async_op)

    @_observed("all_to_all_single", sent=1, kind="collective")
    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None, async_op=False):
        """Rank i sends its ``input``'s j-th block of rows (dim 0, ``input_split_sizes[j]`` rows) to rank j and
        receives into ``output`` the blocks every rank j sent it, concatenated in rank order
        (``output_split_sizes[j]`` rows from rank j). None splits dim 0 evenly over the group. ``input`` and
        ``output`` share the dtype and the rows' shape (``shape[1:]``); blocks may be empty. Ranks must agree:
        rank i's ``input_split_sizes[j]`` is rank j's ``output_split_sizes[i]`` (only this rank's own block is
        checked here; the rest would need communication)."""
        what = "all_to_all_single"
        out = _array_of(output, what, writes=True)
        arr = _array_of(input, what, writes=False)
        out_splits, in_splits = self._check_all_to_all(what, out, arr, output, input, output_split_sizes,
                                                       input_split_sizes)
        work = self._all_to_all_single(out, arr, out_splits, in_splits)
        _bump(output)
        return _result(work, async_op)

    @_observed("reduce", sent=0, kind="collective")
    def reduce(self, tensor, dst=0, op=ReduceOp.SUM, async_op=False):
        """Reduce ``tensor`` across the group into rank ``dst``'s ``tensor`` (the others' stay unchanged)."""
        arr = _array_of(tensor, "reduce", writes=self.rank == dst)
        self._check_peer(dst, "reduce", "dst", allow_self=True)
        op = self._reduce_op(op, arr.dtype, "reduce")
        work = self._reduce(arr, dst, op)
        if self.rank == dst:
            _bump(tensor)
        return _result(work, async_op)

    @_observed("barrier", kind="collective")
    def barrier(self, async_op=False):
        """Return (or complete the Work) once every rank of the group reached the barrier."""
        return _result(self._barrier(), async_op)

    @_observed("isend", sent=0, kind="transfer")
    def isend(self, tensor, dst, tag=0) -> Work:
        arr = _array_of(tensor, "send", writes=False)
        self._check_peer(dst, "send", "dst")
        return self._send(arr, dst, int(tag))

    @_observed("irecv", kind="transfer", size=0)
    def irecv(self, tensor, src, tag=0) -> Work:
        arr = _array_of(tensor, "recv", writes=True)
        self._check_peer(src, "recv", "src")
        work = self._recv(arr, src, int(tag))
        _bump(tensor)
        return work

    @_observed("batch_isend_irecv")
    def batch_isend_irecv(self, ops):
        """Start the point-to-point ops ``[(kind, tensor, peer, tag)]`` (kind "send" or "recv") together; returns
        their Works in order. Backends whose p2p calls block in turn (NCCL) launch them as one group, so two ranks
        that each send to and receive from the other in the same batch cannot deadlock."""
        works = []
        for kind, tensor, peer, tag in ops:
            if kind not in ("send", "recv"):
                raise ValueError(f"batch_isend_irecv: expected ops of kind 'send' or 'recv', got {kind!r}")
            works.append(self.isend(tensor, peer, tag) if kind == "send" else self.irecv(tensor, peer, tag))
        return works

    @_observed("send")
    def send(self, tensor, dst, tag=0):
        self.isend(tensor, dst, tag).wait()

    @_observed("recv")
    def recv(self, tensor, src, tag=0):
        self.irecv(tensor, src, tag).wait()

    def destroy(self):
        """Release the backend's communicator (the group is unusable afterwards)."""

    # ------------------------------------------------------------------------------ checks
    def _reduce_op(self, op, dtype, what):
        op = ReduceOp.parse(op, what)
        if op is ReduceOp.AVG and not is_floating(dtype):
            raise ValueError(f"{what}: expected a floating tensor for ReduceOp.AVG, got dtype {dtype}\n"
                             "HINT: reduce integers with ReduceOp.SUM and divide, or cast to float first")
        return op

    def _check_peer(self, peer, what, role, allow_self=False):
        if not isinstance(peer, (int, np.integer)) or not 0 <= peer < self.size:
            raise ValueError(f"{what}: expected {role} to be a group rank in [0, {self.size}) of group "
                             f"{self.ranks}, got {peer!r}\nHINT: ranks are ranks inside the group, not world ranks")
        if not allow_self and peer == self.rank:
            raise ValueError(f"{what}: expected {role} to be another rank than this one, got {peer} (itself)")

    def _check_list(self, tensors, like, what, name, writes):
        if not isinstance(tensors, (list, tuple)) or len(tensors) != self.size:
            got = f"{len(tensors)} tensors" if isinstance(tensors, (list, tuple)) else type(tensors).__name__
            raise ValueError(f"{what}: expected {name} to hold one tensor per rank ({self.size}), got {got}")
        arrays = [_array_of(t, what, writes) for t in tensors]
        for i, a in enumerate(arrays):
            if a.shape != like.shape or a.dtype != like.dtype:
                raise ValueError(f"{what}: expected {name}[{i}] of shape {tuple(like.shape)} and dtype "
                                 f"{like.dtype}, got shape {tuple(a.shape)} and dtype {a.dtype}")
        return arrays

    def _check_flat(self, what, whole, part, whole_tensor, part_tensor, whole_name, part_name):
        """The flat collectives' checks: ``whole`` holds ``size`` chunks the size of ``part``, both contiguous, of
        one dtype, on one device. Returns both as 1-D views, and whether ``part`` is ``whole``'s chunk for this
        rank (in place). Any other overlap of the two is refused: the result would depend on the backend."""
        for name, a in ((whole_name, whole), (part_name, part)):
            if not a.flags.c_contiguous:
                raise ValueError(f"{what}: expected a contiguous {name}, got a strided view of shape "
                                 f"{tuple(a.shape)} (strides {tuple(a.strides)})\nHINT: the flat collectives use "
                                 "memory as one block; pass a contiguous tensor (t.contiguous()) or a slice of one")
        _check_alike(what, (part_name, part, part_tensor), (whole_name, whole, whole_tensor))
        n = part.size
        if whole.size != self.size * n:
            raise ValueError(f"{what}: expected {whole_name} to hold group size x {part_name}.numel() = {self.size} "
                             f"x {n} = {self.size * n} elements, got {whole_name} of shape {tuple(whole.shape)} "
                             f"({whole.size} elements) for {part_name} of shape {tuple(part.shape)}\nHINT: allocate "
                             f"{whole_name} as it.empty({self.size * n}) or it.empty(({self.size},) + "
                             f"{part_name}.shape): the group has {self.size} rank(s)")
        whole, part = whole.reshape(-1), part.reshape(-1)
        start, end = _address(whole), _address(whole) + whole.nbytes
        mine = _address(part)
        if n == 0 or mine + part.nbytes <= start or mine >= end:
            return whole, part, False
        if mine == start + self.rank * part.nbytes:
            return whole, part, True
        offset = (mine - start) / part.itemsize
        raise ValueError(f"{what}: expected {part_name} to be separate from {whole_name} or exactly this rank's "
                         f"chunk of it (elements [{self.rank * n}, {(self.rank + 1) * n}) for group rank {self.rank}), "
                         f"got {part_name} overlapping {whole_name} from element {offset:g}\nHINT: in place, "
                         f"pass {whole_name}[rank * n:(rank + 1) * n] with rank = get_rank(group)")

    def _check_all_to_all(self, what, out, arr, output, input, output_split_sizes, input_split_sizes):
        """all_to_all_single's checks; returns (output splits, input splits) as tuples of ints (rows per rank)."""
        for name, a in (("input", arr), ("output", out)):
            if a.ndim == 0:
                raise ValueError(f"{what}: expected {name} with a dim 0 to split into rows, got a 0-d {name}\n"
                                 f"HINT: reshape a scalar to shape (1,)")
        _check_alike(what, ("input", arr, input), ("output", out, output))
        if out.shape[1:] != arr.shape[1:]:
            raise ValueError(f"{what}: expected output rows of input's row shape input.shape[1:] = "
                             f"{tuple(arr.shape[1:])}, got output of shape {tuple(out.shape)} for input of shape "
                             f"{tuple(arr.shape)}\nHINT: allocate output as it.empty((sum(output_split_sizes),) + "
                             f"input.shape[1:]); only dim 0 differs between the two")
        in_splits = self._split_sizes(what, "input", input_split_sizes, arr.shape[0])
        out_splits = self._split_sizes(what, "output", output_split_sizes, out.shape[0])
        me = self.rank
        if in_splits[me] != out_splits[me]:
            raise ValueError(f"{what}: expected input_split_sizes[{me}] == output_split_sizes[{me}] (the rows group "
                             f"rank {me} sends itself), got {in_splits[me]} and {out_splits[me]}\nHINT: rank i's "
                             "input_split_sizes[j] must be rank j's output_split_sizes[i]; exchange the counts "
                             "first (e.g. all_to_all_single of one count per rank)")
        (a0, a1), (b0, b1) = _span(arr), _span(out)
        if a0 < b1 and b0 < a1:
            raise ValueError(f"{what}: expected output separate from input, got output of shape {tuple(out.shape)} "
                             f"overlapping input of shape {tuple(arr.shape)} in memory\nHINT: receive into a new "
                             "tensor (it.empty_like) and copy it back if needed")
        return out_splits, in_splits

    def _split_sizes(self, what, name, splits, length):
        """``splits`` (rows per group rank, None: equal) checked against a dim 0 of ``length`` rows."""
        arg = f"{name}_split_sizes"
        if splits is None:
            if length % self.size:
                raise ValueError(f"{what}: expected {name}.shape[0] divisible by the group size {self.size} when "
                                 f"{arg} is None, got {name}.shape[0] = {length}\nHINT: pass {arg}, one row count "
                                 f"per rank of the group")
            return (length // self.size,) * self.size
        if isinstance(splits, np.ndarray) and splits.ndim == 1:
            splits = splits.tolist()
        if not isinstance(splits, (list, tuple, range)):
            raise TypeError(f"{what}: expected {arg} to be None or a list of ints, got {type(splits).__name__}\n"
                            "HINT: pass a list (a tensor of counts: counts.tolist())")
        splits = [int(n) if isinstance(n, np.integer) else n for n in splits]  # numpy ints print as plain ints
        if len(splits) != self.size:
            raise ValueError(f"{what}: expected {arg} to hold one row count per rank of the group ({self.size}), "
                             f"got {len(splits)} entries {splits}\nHINT: entry j is the rows exchanged with group "
                             f"rank j of {self.ranks}")
        for j, n in enumerate(splits):
            if isinstance(n, (bool, np.bool_)) or not isinstance(n, int) or n < 0:
                raise ValueError(f"{what}: expected {arg} to hold non-negative ints, got {n!r} at index {j} of "
                                 f"{splits}\nHINT: entry j is a number of rows along dim 0")
        if sum(splits) != length:
            raise ValueError(f"{what}: expected {arg} to sum to {name}.shape[0] = {length}, got {splits} (sum "
                             f"{sum(splits)})\nHINT: the blocks cover dim 0 of {name} exactly, in rank order")
        return tuple(splits)


class SingleProcessGroup(ProcessGroup):
    """The world of one process (a plain ``python script.py``): every collective is the identity."""

    backend = "single"

    def __init__(self, timeout=DEFAULT_TIMEOUT):
        super().__init__([0], 0, timeout)

    def _all_reduce(self, arr, op):
        return CompletedWork(self, "all_reduce")

    def _broadcast(self, arr, src):
        return CompletedWork(self, "broadcast")

    def _all_gather(self, outs, arr):
        return CompletedWork(self, "all_gather", lambda: _copy_into(outs[0], arr))

    def _reduce_scatter(self, out, ins, op):
        return CompletedWork(self, "reduce_scatter", lambda: _copy_into(out, ins[0]))

    def _all_gather_into_tensor(self, out, arr, in_place):
        return CompletedWork(self, "all_gather_into_tensor", None if in_place else lambda: _copy_into(out, arr))

    def _reduce_scatter_tensor(self, out, arr, op, in_place):
        return CompletedWork(self, "reduce_scatter_tensor", None if in_place else lambda: _copy_into(out, arr))

    def _all_to_all_single(self, out, arr, out_splits, in_splits):
        return CompletedWork(self, "all_to_all_single", lambda: _copy_into(out, arr))

    def _reduce(self, arr, dst, op):
        return CompletedWork(self, "reduce")

    def _barrier(self):
        return CompletedWork(self, "barrier")

    def _send(self, arr, dst, tag):  # unreachable: _check_peer rejects every peer in a group of one
        raise RuntimeError("send: a group of one process has no peer")

    _recv = _send


def _copy_into(dst, src):
    if dst is not src:
        dst[...] = src


__all__ = ["ReduceOp", "ProcessGroup", "SingleProcessGroup", "Work", "CompletedWork", "is_floating"]
