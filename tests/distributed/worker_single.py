"""Run as a plain ``python worker_single.py`` (no mpirun): a world of one where every collective is the
identity (or a copy), initialised lazily; the autograd all-reduce hook works unchanged. Prints "single OK"."""
import numpy as np

import infini_train as it
from infini_train import distributed as dist

assert not dist.is_initialized()
t = it.tensor([1.0, -2.0, 3.0])
assert dist.all_reduce(t, dist.ReduceOp.AVG) is None and t.tolist() == [1.0, -2.0, 3.0]
assert dist.is_initialized() and dist.get_world_size() == 1 and dist.get_rank() == 0 and dist.get_local_rank() == 0
assert dist.get_backend() == "single"
for op in ("sum", "avg", "max", "min", "product"):
    assert dist.all_reduce(t, op, async_op=True).wait() and t.tolist() == [1.0, -2.0, 3.0]
dist.broadcast(t, src=0)
out = [it.zeros(3)]
dist.all_gather(out, t)
assert out[0].tolist() == t.tolist()
rs = it.zeros(3)
dist.reduce_scatter(rs, [it.tensor([4.0, 5.0, 6.0])], "sum")
assert rs.tolist() == [4.0, 5.0, 6.0]
dist.reduce(t, dst=0, op="max")
dist.barrier()
assert dist.barrier(async_op=True).is_completed()
assert dist.new_group([0]).size == 1
# an explicit init_process_group after the lazy one re-initialises with its settings
world = dist.init_process_group(timeout=7)
assert world.timeout == 7.0 and dist.default_group() is world
w = it.tensor([1.0, 2.0], requires_grad=True)
w.register_post_accumulate_grad_hook(it.autograd.AllReducePostAccumulateHook("avg"))
(w * 3).sum().backward()
np.testing.assert_array_equal(w.grad.numpy(), [3.0, 3.0])
dist.destroy_process_group()
assert not dist.is_initialized()
print("single OK", flush=True)
