"""Run under ``mpiexec -n 1`` or ``-n 2`` on a GPU machine (one GPU per rank): the NCCL backend's collectives on
cupy arrays against numpy references (the flat all_gather_into_tensor / reduce_scatter_tensor in place and not),
async Work, host tensors on an NCCL group (through MPI), stream-only waits, an MPI group staging cupy arrays
through the host, the all-reduce hook on GPU gradients, the experts' all-to-all (uneven splits, its gradient) and
ring attention (forward and gradients against causal attention of the whole sequence) on the NCCL group.
Prints "rank R NCCL OK <checks>"."""
import os

import cupy as cp
import numpy as np

import infini_train as it
from infini_train import distributed as dist
from infini_train.backend import CPU, Device
from infini_train.distributed.nccl_backend import BLOCKING_WAIT_ENV

from collective_inputs import inputs  # beside this script
from tests.distributed.rank_checks import RankChecks

world_group = dist.init_process_group("nccl", timeout=120)
rank, world = dist.get_rank(), dist.get_world_size()
assert world_group.backend == "nccl", world_group
dev = Device.parse(f"cuda:{dist.get_local_rank()}")
assert cp.cuda.Device().id == dev.index
check = RankChecks(rank)


def reference(arrays, op):
    acc = arrays[0].astype(np.float64) if arrays[0].dtype.kind == "f" else arrays[0].copy()
    for a in arrays[1:]:
        acc = {"sum": np.add, "avg": np.add, "max": np.maximum, "min": np.minimum, "product": np.multiply}[op](acc, a)
    return acc / world if op == "avg" else acc


def gpu(array):
    with cp.cuda.Device(dev.index):
        return it.Tensor._make(cp.asarray(array), dev)


def host(t):
    return cp.asnumpy(t.array)


OPS = ["sum", "avg", "max", "min", "product"]
TOL = {np.dtype(np.float16): 2e-3, np.dtype(np.float32): 1e-6, np.dtype(np.float64): 1e-12}


def all_reduce_checks(group, label):
    for dtype in (np.float32, np.float64, np.float16, np.int32, np.int64):
        for op in OPS:
            if op == "avg" and np.dtype(dtype).kind != "f":
                continue
            for async_op in (False, True):
                t = gpu(inputs(rank, (33,), dtype, op))
                work = dist.all_reduce(t, op, group=group, async_op=async_op)
                if async_op:
                    check(work.wait() and work.is_completed(), "async wait")
                ref = reference([inputs(r, (33,), dtype, op) for r in range(world)], op)
                np.testing.assert_allclose(host(t), ref, rtol=TOL.get(np.dtype(dtype), 0),
                                           err_msg=f"{label} all_reduce {op} {dtype}")
                check(t.dtype == dtype, "dtype kept")


all_reduce_checks(None, "nccl")

# strided view and bool
base = cp.asarray(inputs(rank, (4, 3), np.float32))
dist.all_reduce(it.Tensor._make(base.T, dev))
np.testing.assert_allclose(cp.asnumpy(base), reference([inputs(r, (4, 3), np.float32) for r in range(world)], "sum"),
                           rtol=1e-6)
flags = [inputs(r, (16,), bool) for r in range(world)]
t = gpu(flags[rank])
dist.all_reduce(t, "max")
check(np.array_equal(host(t), np.logical_or.reduce(flags)), "bool max")

# broadcast / all_gather / reduce_scatter / reduce
for src in range(world):
    t = gpu(inputs(rank, (2, 5), np.float32))
    dist.broadcast(t, src=src)
    check(np.array_equal(host(t), inputs(src, (2, 5), np.float32)), f"broadcast from {src}")
outs = [gpu(np.zeros((2, 3), np.float32)) for _ in range(world)]
dist.all_gather(outs, gpu(inputs(rank, (2, 3), np.float32)), async_op=True).wait()
for r in range(world):
    check(np.array_equal(host(outs[r]), inputs(r, (2, 3), np.float32)), f"all_gather part {r}")
for op in OPS:
    lists = [[inputs(10 * r + k, (3, 2), np.float32, op) for k in range(world)] for r in range(world)]
    out = gpu(np.zeros((3, 2), np.float32))
    dist.reduce_scatter(out, [gpu(a) for a in lists[rank]], op)
    np.testing.assert_allclose(host(out), reference([lists[r][rank] for r in range(world)], op), rtol=1e-6)
    check.count += 1
for dst in range(world):
    mine = inputs(rank, (6,), np.float64)
    t = gpu(mine)
    dist.reduce(t, dst=dst, op="sum")
    expected = reference([inputs(r, (6,), np.float64) for r in range(world)], "sum") if rank == dst else mine
    np.testing.assert_allclose(host(t), expected, rtol=1e-12)
    check.count += 1
if world == 2:
    if rank == 0:
        dist.send(gpu(np.arange(4.0)), dst=1)
    else:
        got = gpu(np.zeros(4))
        dist.recv(got, src=0)
        check(host(got).tolist() == [0.0, 1.0, 2.0, 3.0], "send/recv")
dist.barrier()


def flat_checks(group, label):
    """all_gather_into_tensor and reduce_scatter_tensor on cupy arrays, in place (a chunk of the flat buffer) and
    not, sync and async, every ReduceOp."""
    me = group.rank
    for dtype in (np.float32, np.float16, np.int64, np.bool_):
        for in_place in (False, True):
            for async_op in (False, True):
                parts = [np.array(inputs(r, (2, 3), dtype)) for r in range(world)]
                with cp.cuda.Device(dev.index):
                    out = cp.zeros((world, 2, 3), dtype)
                    mine = out[me] if in_place else cp.empty((2, 3), dtype)
                    mine[...] = cp.asarray(parts[me])
                out_t = it.Tensor._make(out, dev)
                work = dist.all_gather_into_tensor(out_t, it.Tensor._make(mine, dev), group=group, async_op=async_op)
                if async_op:
                    check(work.wait() and work.timeout == group.timeout, "async wait")
                what = f"{label} all_gather_into_tensor {np.dtype(dtype)} in_place={in_place} async={async_op}"
                check(cp.asnumpy(out).tobytes() == np.stack(parts).tobytes(), what)
                check(out_t.version == 1, f"{what}: version bumped")
    for dtype in (np.float32, np.float64, np.float16, np.int32, np.bool_):
        for op in OPS:
            if (op == "avg" and np.dtype(dtype).kind != "f") or (np.dtype(dtype).kind == "b" and op != "max"):
                continue
            full = [np.array(inputs(10 + r, (world * 5,), dtype, op)) for r in range(world)]
            chunks = [f[me * 5:(me + 1) * 5] for f in full]
            ref = np.logical_or.reduce(chunks) if np.dtype(dtype).kind == "b" else reference(chunks, op)
            for in_place in (False, True):
                for async_op in (False, True):
                    with cp.cuda.Device(dev.index):
                        arr = cp.asarray(full[me])
                        out = arr[me * 5:(me + 1) * 5] if in_place else cp.zeros(5, dtype)
                    work = dist.reduce_scatter_tensor(it.Tensor._make(out, dev), it.Tensor._make(arr, dev), op,
                                                      group=group, async_op=async_op)
                    if async_op:
                        check(work.wait(), "async wait")
                    tol = TOL.get(np.dtype(dtype), 0)
                    np.testing.assert_allclose(cp.asnumpy(out), ref, rtol=tol, atol=tol,
                                               err_msg=f"{label} reduce_scatter_tensor {op} {np.dtype(dtype)} "
                                                       f"in_place={in_place} async={async_op}")
                    check.count += 1


flat_checks(world_group, "nccl")
with cp.cuda.Device(dev.index):
    gpu_out = cp.zeros(world * 2, np.float32)
try:
    dist.all_gather_into_tensor(it.Tensor._make(gpu_out, dev), it.Tensor._make(np.zeros(2, np.float32), CPU))
except ValueError as exc:
    check(f"expected input and output on one device, got input on cpu and output on {dev}" in str(exc), str(exc))
else:
    raise AssertionError("a host input with a GPU output must be refused")
host_out = np.zeros(world * 3)  # host arrays on an NCCL group go through MPI (here in place)
host_out[rank * 3:(rank + 1) * 3] = rank
dist.all_gather_into_tensor(host_out, host_out[rank * 3:(rank + 1) * 3])
check(np.array_equal(host_out, np.repeat(np.arange(world, dtype=np.float64), 3)), "host all_gather_into_tensor")
host_rs = np.zeros(2)
dist.reduce_scatter_tensor(host_rs, np.arange(world * 2, dtype=np.float64) * (rank + 1), "sum")
check(np.array_equal(host_rs, np.arange(rank * 2, rank * 2 + 2) * sum(range(1, world + 1))), "host reduce_scatter")

# a host tensor on an NCCL group goes through MPI
cpu_t = it.Tensor._make(np.full(3, rank + 1.0), CPU)
dist.all_reduce(cpu_t, "avg")
check(np.allclose(cpu_t.numpy(), (world + 1) / 2), "host tensor on the NCCL group")

# a second NCCL group with stream-only waits
os.environ[BLOCKING_WAIT_ENV] = "0"
streamed = dist.new_group(range(world))
del os.environ[BLOCKING_WAIT_ENV]
check(streamed.backend == "nccl" and not streamed.blocking_wait, "stream-only group")
t = gpu(np.full(1000, rank + 1.0, np.float32))
work = dist.all_reduce(t, "sum", group=streamed, async_op=True)
work.wait()
check(np.all(host(t) == world * (world + 1) / 2), "stream-ordered result")

# an MPI group stages cupy arrays through the host
mpi_group = dist.new_group(range(world), backend="mpi")
check(mpi_group.backend == "mpi", "mpi sub-group")
all_reduce_checks(mpi_group, "mpi-on-cupy")
flat_checks(mpi_group, "mpi-on-cupy")

# the autograd hook on a GPU gradient
w = it.tensor([1.0, 2.0], device=str(dev), requires_grad=True)
w.register_post_accumulate_grad_hook(it.autograd.AllReducePostAccumulateHook("avg"))
(w * (rank + 1)).sum().backward()
np.testing.assert_allclose(host(w.grad), np.full(2, (world + 1) / 2))
check.count += 1

# the experts' token exchange: all_to_all_single with uneven splits (rank r sends j + 1 + r rows to rank j), as an
# autograd Op whose gradient returns each row where it came from
from infini_train.nn.parallel.all_to_all import all_to_all  # noqa: E402
from infini_train.nn.parallel.ring_attention import chunks_of, ring_attention  # noqa: E402

rows_to = [j + 1 + rank for j in range(world)]
rows_from = [rank + 1 + r for r in range(world)]
sent = np.concatenate([np.full((n, 3), rank * 100 + j * 10, np.float32) + np.arange(n, dtype=np.float32)[:, None]
                       for j, n in enumerate(rows_to)])
want = np.concatenate([np.full((n, 3), r * 100 + rank * 10, np.float32) + np.arange(n, dtype=np.float32)[:, None]
                       for r, n in enumerate(rows_from)])
x = gpu(sent)
x.requires_grad = True
y = all_to_all(x, rows_from, rows_to, group=world_group)
check(np.array_equal(host(y), want), "all_to_all forward (uneven splits)")
(y * y.detach()).sum().backward()
check(np.array_equal(host(x.grad), sent), "all_to_all backward")

# ring attention over the NCCL group: this rank's chunks of a causal sequence against the whole sequence's attention
rng = np.random.default_rng(5)
B, H, E, c = 2, 4, 16, 8
full = [rng.standard_normal((B, H, 2 * world * c, E)).astype(np.float32) for _ in range(3)]
idx = np.concatenate([np.arange(i * c, (i + 1) * c) for i in chunks_of(rank, world)])
whole = [gpu(a) for a in full]
for t in whole:
    t.requires_grad = True
ref = it.nn.functional.scaled_dot_product_attention(*whole, is_causal=True)
ref_grad = np.asarray(rng.standard_normal(ref.shape), np.float32)
ref.backward(gpu(ref_grad))
mine = [gpu(a[:, :, idx]) for a in full]
for t in mine:
    t.requires_grad = True
out = ring_attention(*mine, group=world_group)
out.backward(gpu(ref_grad[:, :, idx]))
np.testing.assert_allclose(host(out), host(ref)[:, :, idx], rtol=1e-4, atol=1e-5, err_msg="ring attention forward")
for name, t, w in zip("qkv", mine, whole):
    np.testing.assert_allclose(host(t.grad), host(w.grad)[:, :, idx], rtol=1e-4, atol=1e-5,
                               err_msg=f"ring attention grad {name}")
check.count += 4

dist.barrier()
dist.destroy_process_group()
print(f"rank {rank} NCCL OK {check.count}", flush=True)
