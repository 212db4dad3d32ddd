"""Run under ``mpiexec -n N python worker_flat_collectives.py mpi`` (any N >= 1), or as a plain ``python
worker_flat_collectives.py single`` (a world of one): all_gather_into_tensor and reduce_scatter_tensor against
numpy, sync and async, in place and not, for several dtypes, shapes and buffer layouts, every ReduceOp, on the
world and on a sub-group whose group ranks are not the world ranks; then the argument errors (checked the same
way on every rank, so no rank is left waiting). Prints "rank R FLAT OK <checks>"."""
import sys

import ml_dtypes
import numpy as np

import infini_train as it
from infini_train import distributed as dist
from infini_train.backend import CPU, Device

from collective_inputs import inputs  # beside this script
from tests.distributed.rank_checks import RankChecks

backend = sys.argv[1]
world_group = dist.init_process_group(backend, timeout=60)
rank, world = dist.get_rank(), dist.get_world_size()
assert world_group.backend == backend, world_group
check = RankChecks(rank)
BF16 = np.dtype(ml_dtypes.bfloat16)
NARROW = (np.dtype(np.float16), BF16)
OPS = ["sum", "avg", "max", "min", "product"]


def tensor(array):
    return it.Tensor._make(array, CPU)  # wraps without copying: views stay views of their buffer


def source(r, shape, dtype, op="sum"):
    """Rank r's data: float16/bfloat16 rounded from float32 values, other dtypes as collective_inputs makes them."""
    dtype = np.dtype(dtype)
    made = inputs(r, shape, np.float32, op).astype(dtype) if dtype in NARROW else inputs(r, shape, dtype, op)
    return np.array(made, dtype)


def reference(arrays, op):
    """The reduction across ranks: booleans as logical or/and, float16/bfloat16 in float64 (compared to 1 ulp)."""
    if arrays[0].dtype.kind == "b":
        return (np.logical_or if op in ("sum", "max") else np.logical_and).reduce(arrays)
    if arrays[0].dtype in NARROW:
        arrays = [a.astype(np.float64) for a in arrays]
    acc = arrays[0].copy()
    for a in arrays[1:]:
        acc = {"sum": np.add, "avg": np.add, "max": np.maximum, "min": np.minimum, "product": np.multiply}[op](acc, a)
    return acc / len(arrays) if op == "avg" else acc


def assert_reduced(got, ref, label):
    dtype = got.dtype
    if dtype.kind in "iub":
        check(np.array_equal(got, ref), label)
        return
    rtol = {np.dtype(np.float32): 1e-6, np.dtype(np.float64): 1e-12, np.dtype(np.float16): 2.0 ** -10,
            BF16: 2.0 ** -7}[dtype]
    np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float64), rtol=rtol, atol=rtol,
                               err_msg=f"rank {rank}: {label}")
    check.count += 1


def finish(work, group, async_op, label):
    if async_op:
        check(isinstance(work, dist.Work) and work.timeout == group.timeout, f"{label}: a Work with the timeout")
        check(work.wait() is True and work.is_completed(), f"{label}: async wait")
    else:
        check(work is None, f"{label}: sync returns None")


def gather_checks(group, ranks, dtypes):
    """all_gather_into_tensor on ``group`` (world ranks ``ranks`` in group order)."""
    size, me = group.size, group.rank
    for dtype in dtypes:
        for shape in ((5,), (2, 3), ()):
            n = int(np.prod(shape))
            layouts = {"flat": (size * n,), "stacked": (size,) + shape}
            if shape:
                layouts["rows"] = (size * shape[0],) + shape[1:]  # torch's concatenation along dim 0
            parts = [source(r, shape, dtype) for r in ranks]
            for layout, out_shape in layouts.items():
                expected = np.concatenate([p.reshape(-1) for p in parts]).reshape(out_shape)
                for in_place in (False, True):
                    for async_op in (False, True):
                        label = f"all_gather_into_tensor {dtype} {shape} {layout} in_place={in_place} async={async_op}"
                        out = np.zeros(out_shape, dtype)
                        if in_place:
                            chunk = out.reshape(-1)[me * n:(me + 1) * n]
                            chunk[...] = parts[me].reshape(-1)
                            mine = chunk.reshape(shape)  # a view of out: this rank's chunk
                        else:
                            mine = parts[me].copy()
                        out_t = tensor(out)
                        work = dist.all_gather_into_tensor(out_t, tensor(mine), group=group, async_op=async_op)
                        finish(work, group, async_op, label)
                        check(out.tobytes() == expected.tobytes(), label)
                        check(out_t.version == 1, f"{label}: the version counter bumped")
                        check(mine.tobytes() == parts[me].tobytes(), f"{label}: input intact")
    out = np.zeros(size * 3, np.float32)  # raw numpy arrays
    dist.all_gather_into_tensor(out, source(ranks[me], (3,), np.float32), group=group)
    check(np.array_equal(out, np.concatenate([source(r, (3,), np.float32) for r in ranks])), "raw arrays")


def scatter_checks(group, ranks, dtypes):
    """reduce_scatter_tensor on ``group``: every ReduceOp, in place (output = this rank's chunk of input) and not."""
    size, me = group.size, group.rank
    for dtype in dtypes:
        for op in OPS:
            if op == "avg" and np.dtype(dtype).kind not in "f" and np.dtype(dtype) not in NARROW:
                continue
            for shape in ((4,), (2, 3), ()):
                n = int(np.prod(shape))
                for layout, in_shape in (("flat", (size * n,)), ("stacked", (size,) + shape)):
                    full = [source(r, in_shape, dtype, op) for r in ranks]
                    ref = reference([f.reshape(-1)[me * n:(me + 1) * n] for f in full], op).reshape(shape)
                    for in_place in (False, True):
                        for async_op in (False, True):
                            label = (f"reduce_scatter_tensor {op} {np.dtype(dtype)} {shape} {layout} "
                                     f"in_place={in_place} async={async_op}")
                            arr = full[me].copy()
                            out = arr.reshape(-1)[me * n:(me + 1) * n].reshape(shape) if in_place else \
                                np.zeros(shape, dtype)
                            out_t = tensor(out)
                            red_op = getattr(dist.ReduceOp, op.upper()) if async_op else op
                            work = dist.reduce_scatter_tensor(out_t, tensor(arr), red_op, group=group,
                                                              async_op=async_op)
                            finish(work, group, async_op, label)
                            check(out.dtype == dtype and out.shape == shape, f"{label}: dtype and shape kept")
                            assert_reduced(out, ref, label)
                            check(out_t.version == 1, f"{label}: the version counter bumped")
                            others = np.ones(size * n, bool)
                            others[me * n:(me + 1) * n] = not in_place
                            check(arr.reshape(-1)[others].tobytes() == full[me].reshape(-1)[others].tobytes(),
                                  f"{label}: the rest of input intact")


ALL = (np.float32, np.float64, np.int32, np.int64, np.float16, BF16, np.bool_)
gather_checks(world_group, list(range(world)), ALL)
scatter_checks(world_group, list(range(world)), ALL)

# a sub-group of every rank but 0: group rank g is world rank g + 1 (with 2 ranks, a group of one)
rest = dist.new_group(range(1, world)) if world > 1 else None
if rest is not None:
    check(rest.ranks == list(range(1, world)) and rest.rank == rank - 1, "sub-group")
    gather_checks(rest, rest.ranks, (np.float32, BF16))
    scatter_checks(rest, rest.ranks, (np.float64, np.int64))
    dist.destroy_process_group(rest)

# ---- on MPI, contiguous host arrays travel as they are (no staging copy), in place with MPI.IN_PLACE
if backend == "mpi":
    class Recording:
        """Forwards to the communicator, keeping the arguments of every call."""

        def __init__(self, comm):
            self.comm, self.calls = comm, []

        def __getattr__(self, name):
            method = getattr(self.comm, name)
            return lambda *args, **kwargs: self.calls.append((name, args)) or method(*args, **kwargs)

    from mpi4py import MPI

    comm = world_group.comm
    world_group.comm = recording = Recording(comm)
    flat = np.zeros(world * 6, np.float32)
    mine = source(rank, (6,), np.float32)
    dist.all_gather_into_tensor(flat, mine)
    (name, (send, recv)), = recording.calls
    check(name == "Iallgather" and np.shares_memory(send[0], mine) and np.shares_memory(recv[0], flat),
          "all_gather_into_tensor sends and receives in place")
    recording.calls.clear()
    dist.all_gather_into_tensor(flat, flat[rank * 6:(rank + 1) * 6])
    (name, (send, recv)), = recording.calls
    check(send is MPI.IN_PLACE and np.shares_memory(recv[0], flat), "in place: MPI.IN_PLACE")
    recording.calls.clear()
    out = np.zeros(6, np.float32)
    dist.reduce_scatter_tensor(out, flat, "sum")
    (name, (send, recv, _)), = recording.calls
    check(name == "Ireduce_scatter_block" and np.shares_memory(send, flat) and np.shares_memory(recv, out),
          "reduce_scatter_tensor: no copies")
    world_group.comm = comm

# ---- argument errors: name the collective, what was expected and what came, with a hint
base = np.zeros(world * 4 + 1)
CPU1 = Device.parse("cpu:1")
ERRORS = [
    (lambda: dist.all_gather_into_tensor(tensor(np.zeros(world * 4 + 1)), tensor(np.zeros(4))),
     f"all_gather_into_tensor: expected output to hold group size x input.numel() = {world} x 4 = {world * 4} "
     f"elements, got output of shape ({world * 4 + 1},)"),
    (lambda: dist.reduce_scatter_tensor(tensor(np.zeros((2, 2))), tensor(np.zeros(world * 4 - 1))),
     f"reduce_scatter_tensor: expected input to hold group size x output.numel() = {world} x 4"),
    (lambda: dist.all_gather_into_tensor(tensor(np.zeros(world * 4)), tensor(np.zeros(4, np.float32))),
     "all_gather_into_tensor: expected input and output of one dtype, got input float32 and output float64"),
    (lambda: dist.reduce_scatter_tensor(tensor(np.zeros(4, np.int64)), tensor(np.zeros(world * 4, np.int32))),
     "reduce_scatter_tensor: expected output and input of one dtype, got output int64 and input int32"),
    (lambda: dist.all_gather_into_tensor(tensor(np.zeros((world * 4, 2))[:, 0]), tensor(np.zeros(4))),
     f"all_gather_into_tensor: expected a contiguous output, got a strided view of shape ({world * 4},)"),
    (lambda: dist.all_gather_into_tensor(tensor(np.zeros(world * 4)), tensor(np.zeros(8)[::2])),
     "all_gather_into_tensor: expected a contiguous input"),
    (lambda: dist.reduce_scatter_tensor(tensor(np.zeros(8)[::2]), tensor(np.zeros(world * 4))),
     "reduce_scatter_tensor: expected a contiguous output"),
    (lambda: dist.reduce_scatter_tensor(tensor(np.zeros(4)), tensor(np.zeros((world * 4, 2))[:, 0])),
     "reduce_scatter_tensor: expected a contiguous input"),
    (lambda: dist.all_gather_into_tensor(tensor(base[:world * 4]), tensor(base[1:5])),
     "all_gather_into_tensor: expected input to be separate from output or exactly this rank's chunk of it "
     f"(elements [{4 * rank}, {4 * rank + 4}) for group rank {rank}), got input overlapping output from element 1"),
    (lambda: dist.reduce_scatter_tensor(tensor(base[1:5]), tensor(base[:world * 4])),
     "reduce_scatter_tensor: expected output to be separate from input or exactly this rank's chunk"),
    (lambda: dist.all_gather_into_tensor(tensor(np.zeros(world * 2)), it.Tensor._make(np.zeros(2), CPU1)),
     "all_gather_into_tensor: expected input and output on one device, got input on cpu:1 and output on cpu"),
    (lambda: dist.reduce_scatter_tensor(tensor(np.zeros(2, np.int64)), tensor(np.zeros(world * 2, np.int64)), "avg"),
     "reduce_scatter_tensor: expected a floating tensor for ReduceOp.AVG, got dtype int64"),
    (lambda: dist.reduce_scatter_tensor(tensor(np.zeros(2)), tensor(np.zeros(world * 2)), "median"),
     "reduce_scatter_tensor: expected a ReduceOp"),
    (lambda: dist.all_gather_into_tensor(np.broadcast_to(np.zeros(1), (world * 2,)), np.zeros(2)),
     "all_gather_into_tensor: expected a writable tensor"),
    (lambda: dist.all_gather_into_tensor([0.0] * world, np.zeros(1)),
     "all_gather_into_tensor: expected an infini_train Tensor (or a numpy/cupy array), got list"),
]
for call, needle in ERRORS:
    try:
        call()
    except (ValueError, TypeError) as exc:
        hinted = isinstance(exc, TypeError) or "\nHINT: " in str(exc)
        check(needle in str(exc) and hinted, f"error message {exc!r}, expected {needle!r}")
    else:
        raise AssertionError(f"rank {rank}: expected an error mentioning {needle!r}")

dist.barrier()
dist.destroy_process_group()
print(f"rank {rank} FLAT OK {check.count}", flush=True)
