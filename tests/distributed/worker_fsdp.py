"""Under ``mpiexec -n N``: a GPT-2 fully sharded over N ranks (each running its slice of every batch) gives the
one-process losses and clipped gradient norms for 6 steps (rtol 1e-5) and the same weights (up to what Adam makes of
last-bit gradient differences: tests/adam_bounds.py); each rank holds about 1/N of the parameters. Prints
"rank R: fsdp ok"."""
import numpy as np

import infini_train as it
from infini_train import distributed as dist
from tests.adam_bounds import assert_close_after_adam
from tests.distributed.fsdp_cases import LR, batches, build, reference_steps, sharded, sharded_steps

dist.init_process_group("mpi")
rank, world = dist.get_rank(), dist.get_world_size()


def mean(value):
    total = it.Tensor(np.array([value], np.float64))
    dist.all_reduce(total, "avg")
    return float(total.numpy()[0])


data = batches(6)
reference = build()
want = reference_steps(reference, data)
model = sharded(build())
whole = sum(p.numel() for p in model.parameters())
held = sum(s.shard.size for m in model.modules() if getattr(m, "_fsdp", None) and m._fsdp.unit
           for s in m._fsdp.unit.spaces)
assert held <= whole / world + 64, (held, whole)
got = sharded_steps(model, data, rank, world, reduce_loss=mean)
np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
np.testing.assert_allclose(got[1], want[1], rtol=1e-5)
with model.unsharded():
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert_close_after_adam(p.numpy(), q.numpy(), LR, len(data), err_msg=name)
print(f"rank {rank}: fsdp ok", flush=True)
