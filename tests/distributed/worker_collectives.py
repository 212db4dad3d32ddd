"""Run under mpiexec -n 2: every collective and ReduceOp, sync and async, vs numpy references."""
import numpy as np

import infini_train as it
from infini_train import distributed as dist

g = dist.init_process_group("mpi")
rank, world = dist.get_rank(), dist.get_world_size()
assert world == 2 and g.backend == "mpi"
rng = np.random.default_rng(0)
data = [rng.standard_normal(5).astype(np.float64) for _ in range(world)]  # every rank knows all inputs
refs = {"sum": sum(data), "avg": sum(data) / world, "max": np.maximum(*data), "min": np.minimum(*data),
        "product": data[0] * data[1]}
for dtype in (np.float32, np.float64):
    for op, ref in refs.items():
        for async_op in (False, True):
            t = it.tensor(data[rank].astype(dtype))
            work = dist.all_reduce(t, getattr(dist.ReduceOp, op.upper()), async_op=async_op)
            if async_op:
                assert work.wait() and work.is_completed()
            else:
                assert work is None
            np.testing.assert_allclose(t.numpy(), ref, rtol=1e-6, err_msg=f"all_reduce {op} {dtype}")
ints = it.tensor(np.array([rank + 1, 10], np.int64))
dist.all_reduce(ints, "sum")
assert ints.tolist() == [3, 20]

b = it.tensor(np.full(3, float(rank)))
dist.broadcast(b, src=1)
np.testing.assert_array_equal(b.numpy(), 1.0)

outs = [it.zeros(2, 2) for _ in range(world)]
work = dist.all_gather(outs, it.full((2, 2), rank + 0.5), async_op=True)
work.wait()
for r in range(world):
    np.testing.assert_array_equal(outs[r].numpy(), r + 0.5)

ins = [it.tensor(np.arange(3, dtype=np.float32) + 10 * r + rank) for r in range(world)]
out = it.zeros(3)
dist.reduce_scatter(out, ins, "sum")
np.testing.assert_array_equal(out.numpy(), 2 * (np.arange(3) + 10 * rank) + 1)

red = it.tensor(np.array([rank + 1.0, 2.0]))
dist.reduce(red, dst=0, op="product")
if rank == 0:
    np.testing.assert_array_equal(red.numpy(), [2.0, 4.0])

if rank == 0:
    dist.send(it.tensor(np.arange(4.0)), dst=1, tag=7)
else:
    got = it.zeros(4, dtype=it.float64)
    dist.recv(got, src=0, tag=7)
    np.testing.assert_array_equal(got.numpy(), np.arange(4.0))

sub = dist.new_group([1])
if rank == 1:
    t = it.ones(2)
    dist.all_reduce(t, group=sub)
    assert sub.size == 1 and t.tolist() == [1.0, 1.0]
else:
    assert sub is None
both = dist.new_group([0, 1])
t = it.tensor([float(rank)])
dist.all_reduce(t, group=both)
assert t.tolist() == [1.0]

# the autograd hook all-reduces a parameter's gradient once it is accumulated
w = it.tensor([1.0, 2.0], requires_grad=True)
w.register_post_accumulate_grad_hook(it.autograd.AllReducePostAccumulateHook("avg", dist.default_group()))
(w * (rank + 1)).sum().backward()
np.testing.assert_allclose(w.grad.numpy(), [1.5, 1.5])
dist.barrier()
print(f"rank {rank} OK", flush=True)
