"""Run under ``mpiexec -n 2`` (any N >= 2 works): every collective and ReduceOp, sync and async, for several
dtypes, against numpy references; new_group; send/recv; the AllReducePostAccumulateHook. Every rank can
compute every rank's input (seeded by rank), so each checks its own result. Prints "rank R OK <checks>"."""
import ml_dtypes
import numpy as np

import infini_train as it
from infini_train import distributed as dist
from infini_train.backend import CPU

from collective_inputs import inputs  # beside this script
from tests.distributed.rank_checks import RankChecks

world_group = dist.init_process_group("mpi", timeout=60)
rank, world = dist.get_rank(), dist.get_world_size()
assert world >= 2 and world_group.backend == "mpi" and dist.get_backend() == "mpi", (world, world_group)
assert dist.default_group() is world_group and dist.is_initialized()
assert dist.get_local_rank() == rank and dist.get_local_world_size() == world  # one node
check = RankChecks(rank)
BF16 = np.dtype(ml_dtypes.bfloat16)


def reference(arrays, op):
    """The reduction of ``arrays`` across ranks, as numpy computes it in their own dtype."""
    acc = arrays[0].copy()
    for a in arrays[1:]:
        acc = {"sum": np.add, "avg": np.add, "max": np.maximum, "min": np.minimum, "product": np.multiply}[op](acc, a)
    if op == "avg":
        acc = acc / world
    return acc


def tensor(array):
    return it.Tensor._make(np.array(array), CPU)


OPS = ["sum", "avg", "max", "min", "product"]

# ---- all_reduce: every ReduceOp, sync and async, float32/float64/int32/int64, ReduceOp or string
for dtype in (np.float32, np.float64, np.int32, np.int64):
    for op in OPS:
        if op == "avg" and np.dtype(dtype).kind != "f":
            continue
        for async_op in (False, True):
            for shape in ((7,), (3, 4), ()):
                t = tensor(inputs(rank, shape, dtype, op))
                version = t._version[0]
                ref = reference([inputs(r, shape, dtype, op) for r in range(world)], op)
                red_op = getattr(dist.ReduceOp, op.upper()) if async_op else op
                work = dist.all_reduce(t, red_op, async_op=async_op)
                if async_op:
                    check(isinstance(work, dist.Work) and work.wait() is True and work.is_completed(), "async Work")
                else:
                    check(work is None, "sync all_reduce returns None")
                check(t._version[0] == version + 1, "all_reduce bumps the version counter")
                check(t.dtype == dtype and t.shape == shape, "dtype and shape unchanged")
                np.testing.assert_allclose(t.numpy(), ref, rtol=1e-6, err_msg=f"all_reduce {op} {dtype} {shape}")
                check.count += 1

# ---- float16 / bfloat16: reduced in float32, rounded once
for dtype in (np.float16, BF16):
    for op in ("sum", "avg", "max", "product"):
        parts = [inputs(r, (10,), np.float32, op).astype(dtype) for r in range(world)]
        t = tensor(parts[rank])
        dist.all_reduce(t, op)
        ref = reference([p.astype(np.float32) for p in parts], op).astype(dtype)
        check(t.dtype == dtype, f"{dtype} kept")
        np.testing.assert_array_equal(t.numpy().astype(np.float32), ref.astype(np.float32),
                                      err_msg=f"all_reduce {op} {dtype}")

# ---- bool: SUM/MAX = logical or, PRODUCT/MIN = logical and
flags = [inputs(r, (16,), bool) for r in range(world)]
for op, ref in (("sum", np.logical_or.reduce(flags)), ("max", np.logical_or.reduce(flags)),
                ("min", np.logical_and.reduce(flags)), ("product", np.logical_and.reduce(flags))):
    t = tensor(flags[rank])
    dist.all_reduce(t, op)
    check(t.dtype == np.bool_ and np.array_equal(t.numpy(), ref), f"bool all_reduce {op}")

# ---- a strided view: the result lands in the viewed memory
base = inputs(rank, (4, 3), np.float32)
view = it.Tensor._make(base.T, CPU)  # not C-contiguous
dist.all_reduce(view, "sum")
np.testing.assert_allclose(base, reference([inputs(r, (4, 3), np.float32) for r in range(world)], "sum"),
                           rtol=1e-6)
check.count += 1
# ---- a raw numpy array works too
raw = np.full(5, rank + 1.0)
dist.all_reduce(raw, dist.ReduceOp.MAX)
check(np.array_equal(raw, np.full(5, float(world))), "raw array all_reduce")

# ---- broadcast from every src, several dtypes (raw bytes: exact), sync and async
for src in range(world):
    for dtype in (np.float32, np.float64, np.int64, BF16, np.float16, bool):
        for async_op in (False, True):
            mine = inputs(rank, (2, 5), np.float32).astype(dtype)
            t = tensor(mine)
            work = dist.broadcast(t, src=src, async_op=async_op)
            if async_op:
                work.wait()
            expected = inputs(src, (2, 5), np.float32).astype(dtype)
            check(t.numpy().tobytes() == expected.tobytes(), f"broadcast src {src} {dtype}")
scalar = tensor(np.float64(rank * 10 + 3))
dist.broadcast(scalar, src=world - 1)
check(scalar.item() == (world - 1) * 10 + 3, "0-d broadcast")

# ---- all_gather
for dtype in (np.float32, np.int64, BF16):
    for async_op in (False, True):
        outs = [it.Tensor._make(np.zeros((2, 3), dtype), CPU) for _ in range(world)]
        work = dist.all_gather(outs, tensor(inputs(rank, (2, 3), np.float32).astype(dtype)), async_op=async_op)
        if async_op:
            check(work.wait(), "all_gather wait")
        for r in range(world):
            check(outs[r].numpy().tobytes() == inputs(r, (2, 3), np.float32).astype(dtype).tobytes(),
                  f"all_gather {dtype} part {r}")

# ---- reduce_scatter: rank r receives the reduction of everyone's input_list[r]
for dtype in (np.float32, np.float64):
    for op in OPS:
        for async_op in (False, True):
            lists = [[inputs(10 * r + k, (3, 2), dtype, op) for k in range(world)] for r in range(world)]
            out = tensor(np.zeros((3, 2), dtype))
            work = dist.reduce_scatter(out, [tensor(a) for a in lists[rank]], op, async_op=async_op)
            if async_op:
                work.wait()
            ref = reference([lists[r][rank] for r in range(world)], op)
            np.testing.assert_allclose(out.numpy(), ref, rtol=1e-6, err_msg=f"reduce_scatter {op} {dtype}")
            check.count += 1
parts16 = [[inputs(10 * r + k, (4,), np.float32).astype(np.float16) for k in range(world)] for r in range(world)]
out16 = tensor(np.zeros(4, np.float16))
dist.reduce_scatter(out16, [tensor(a) for a in parts16[rank]], "sum")
check(np.array_equal(out16.numpy(), reference([parts16[r][rank].astype(np.float32) for r in range(world)], "sum")
                     .astype(np.float16)), "float16 reduce_scatter")

# ---- reduce to every dst: only dst changes
for dst in range(world):
    for op in OPS:
        for async_op in (False, True):
            mine = inputs(rank, (6,), np.float64, op)
            t = tensor(mine)
            work = dist.reduce(t, dst=dst, op=op, async_op=async_op)
            if async_op:
                work.wait()
            if rank == dst:
                np.testing.assert_allclose(t.numpy(), reference([inputs(r, (6,), np.float64, op)
                                                                 for r in range(world)], op), rtol=1e-12)
                check.count += 1
            else:
                check(np.array_equal(t.numpy(), mine), "reduce leaves non-dst ranks unchanged")

# ---- send / recv (tags matched out of order), isend / irecv
peer_next, peer_prev = (rank + 1) % world, (rank - 1) % world
sends = [dist.isend(tensor(np.full(3, 100.0 * rank + tag)), peer_next, tag=tag) for tag in (5, 9)]
got9, got5 = tensor(np.zeros(3)), tensor(np.zeros(3))
dist.recv(got9, peer_prev, tag=9)  # received before the tag-5 message although sent after it
work5 = dist.irecv(got5, peer_prev, tag=5)
check(work5.wait() and all(w.wait() for w in sends), "isend/irecv complete")
check(got9.tolist() == [100.0 * peer_prev + 9] * 3 and got5.tolist() == [100.0 * peer_prev + 5] * 3, "tags")
if rank == 0:
    dist.send(tensor(inputs(0, (2, 2), np.float32).astype(BF16)), dst=1)
elif rank == 1:
    got = it.Tensor._make(np.zeros((2, 2), BF16), CPU)
    dist.recv(got, src=0)
    check(got.numpy().tobytes() == inputs(0, (2, 2), np.float32).astype(BF16).tobytes(), "bf16 send/recv")

# ---- batch_isend_irecv: send to both neighbours and receive from both in one batch (any shape, any order)
if world > 1:
    out_next = tensor(np.full((2, 3), 10.0 * rank + 1))
    out_prev = tensor(np.full((4,), 10.0 * rank + 2, np.float32))
    in_prev, in_next = tensor(np.zeros((2, 3))), tensor(np.zeros(4, np.float32))
    ops = [dist.P2POp(dist.irecv, in_prev, peer_prev, tag=1), dist.P2POp(dist.isend, out_next, peer_next, tag=1),
           dist.P2POp(dist.isend, out_prev, peer_prev, tag=2), dist.P2POp(dist.irecv, in_next, peer_next, tag=2)]
    works = dist.batch_isend_irecv(ops)
    check(len(works) == 4 and all(w.wait() for w in works), "batch_isend_irecv completes")
    check(in_prev.tolist() == np.full((2, 3), 10.0 * peer_prev + 1).tolist(), "batched recv from the previous rank")
    check(in_next.tolist() == [10.0 * peer_next + 2] * 4, "batched recv from the next rank")
    check(dist.batch_isend_irecv([]) == [], "empty batch")
    try:
        dist.batch_isend_irecv([dist.P2POp(dist.all_reduce, out_next, peer_next)])
        check(False, "a collective in batch_isend_irecv is refused")
    except ValueError as exc:
        check("expected op dist.isend or dist.irecv" in str(exc), "P2POp names the accepted ops")

# ---- barrier
check(dist.barrier() is None, "sync barrier")
check(dist.barrier(async_op=True).wait(), "async barrier")

# ---- new_group: the whole world again, one rank alone, and every rank but 0 (group ranks != world ranks)
everyone = dist.new_group(range(world))
check(everyone is not world_group and everyone.ranks == list(range(world)) and everyone.rank == rank, "new_group")
t = tensor(np.array([float(rank)]))
dist.all_reduce(t, group=everyone)
check(t.tolist() == [sum(range(world))], "all_reduce on a new group")
alone = dist.new_group([1])
if rank == 1:
    t = tensor(np.ones(2))
    dist.all_reduce(t, "sum", group=alone)
    check(alone.size == 1 and alone.rank == 0 and alone.world_rank == 1 and t.tolist() == [1.0, 1.0], "group of 1")
else:
    check(alone is None, "non-members get None")
rest = dist.new_group(range(1, world))
if rank >= 1:
    t = tensor(np.array([float(rank)]))
    dist.broadcast(t, src=0, group=rest)  # group rank 0 is world rank 1
    check(t.tolist() == [1.0] and dist.get_rank(rest) == rank - 1 and dist.get_world_size(rest) == world - 1,
          "broadcast src is a group rank")
    dist.destroy_process_group(rest)

# ---- argument errors name the collective (checked symmetrically on every rank: no communication)
for call, needle in ((lambda: dist.all_gather([tensor(np.zeros(2))], tensor(np.zeros(2))), "one tensor per rank"),
                     (lambda: dist.all_reduce(tensor(np.ones(2, np.int64)), "avg"), "floating tensor"),
                     (lambda: dist.all_reduce(tensor(np.ones(2)), "median"), "ReduceOp"),
                     (lambda: dist.broadcast(tensor(np.ones(2)), src=world), "src"),
                     (lambda: dist.send(tensor(np.ones(2)), dst=rank), "another rank")):
    try:
        call()
    except (ValueError, TypeError) as exc:
        check(needle in str(exc), f"error message {exc}")
    else:
        raise AssertionError(f"expected an error mentioning {needle!r}")

# ---- AllReducePostAccumulateHook: ranks with different grads end with their average / sum
w = it.tensor([1.0, 2.0], requires_grad=True)
w.register_post_accumulate_grad_hook(it.autograd.AllReducePostAccumulateHook("avg"))  # default group, a string
(w * (rank + 1)).sum().backward()
np.testing.assert_allclose(w.grad.numpy(), np.full(2, (world + 1) / 2))
v = it.tensor([[1.0, 2.0]], requires_grad=True)
v.register_post_accumulate_grad_hook(it.autograd.AllReducePostAccumulateHook(dist.ReduceOp.SUM, everyone))
(v * v * (rank + 1)).sum().backward()  # d/dv = 2 v (rank + 1)
np.testing.assert_allclose(v.grad.numpy(), np.array([[2.0, 4.0]]) * sum(r + 1 for r in range(world)))
check.count += 2

dist.barrier()
dist.destroy_process_group()
check(not dist.is_initialized(), "destroyed")
print(f"rank {rank} OK {check.count}", flush=True)
