"""Run under mpiexec -n 2: a non-finite gradient on one rank only makes every rank skip that step and back off.

Both ranks start from the same parameters and see the same inputs, except that rank 1 gets an inf at step 2 and
rank 0 a nan at step 5. Each rank must skip exactly steps 2 and 5 and end with the scales and parameters of a
single torch run that sees both non-finite steps; once with the world group, once with an explicit group.
"""
import numpy as np

from infini_train import distributed as dist
from infini_train.amp import GradScaler
from tests.amp.scripted_steps import assert_same_run, run, script

dist.init_process_group("mpi")
rank, world = dist.get_rank(), dist.get_world_size()
assert world == 2, f"worker_grad_scaler: expected 2 ranks, got {world}"

KW = dict(growth_interval=2)
STEPS = 8
mine = script(STEPS, **({"inf": [2]} if rank == 1 else {"nan": [5]}))
both = script(STEPS, inf=[2], nan=[5])  # what a torch run that sees every rank's non-finite steps gets
reference, _ = run(True, both, KW)
expected_stepped = [[i not in (2, 5)] for i in range(STEPS)]

for name, group in [("world", None), ("new_group", dist.new_group([0, 1]))]:
    kw = dict(KW, process_group=group) if group is not None else KW
    records, _ = run(False, mine, scaler=GradScaler("cpu", **kw))
    assert [r["stepped"] for r in records] == expected_stepped, (name, rank, [r["stepped"] for r in records])
    assert_same_run(records, reference, grads="ignored")  # each rank's gradients hold only its own inf/nan
    # and the two ranks hold the very same parameters
    final = np.concatenate([p.ravel() for p in records[-1]["params"]])
    gathered = [np.zeros_like(final) for _ in range(world)]
    dist.all_gather(gathered, final)
    np.testing.assert_array_equal(gathered[0], gathered[1], err_msg=name)
    print(f"rank {rank} {name} scales {[r['scale'] for r in records]}", flush=True)

print(f"rank {rank} GRADSCALER OK", flush=True)
dist.destroy_process_group()
