"""Under ``mpiexec -n 2``: DistributedDataParallel's communication hooks (default_hooks) and join() against the
gradients computed in one process. Every rank computes both ranks' local gradients itself (each rank's batch comes
from a generator seeded with its rank), so the expected reduced gradients are exact:

- no hook and allreduce_hook: the average; fp16/bf16_compress_hook: each rank's gradient cast, divided by 2 there,
  summed (in float32: MPI reduces 16-bit floats so) and cast once, then back to float32; and not the exact average.
- a second hook, or one after a backward, is refused.
- join(): rank 0 has 3 batches, rank 1 one; SGD steps; the first step averages both, the others rank 0's alone,
  divided by the world size (divide_by_initial_world_size=True) or by 1 (False); both ranks end with rank 0's model.
Prints "rank R hooks ok N" (N checks)."""
import numpy as np

import infini_train as it
from infini_train import distributed as dist
from infini_train import nn
from infini_train.backend import bfloat16
from infini_train.distributed.algorithms.ddp_comm_hooks import default_hooks
from infini_train.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("mpi")
rank, world = dist.get_rank(), dist.get_world_size()
checks = 0


def refused(call, args, text, what):
    """``call(*args)`` raises a RuntimeError whose message holds ``text`` (``what``: the failure otherwise)."""
    try:
        call(*args)
    except RuntimeError as exc:
        assert text in str(exc), exc
        return
    raise AssertionError(what)

def model():
    it.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))


def batch(r, k=0):
    rng = np.random.default_rng(100 * r + k)
    return it.tensor(rng.standard_normal((4, 6)).astype(np.float32)), it.tensor(rng.standard_normal((4, 3)).astype(
        np.float32))


def loss_of(m, xy):
    x, y = xy
    return ((m(x) - y) ** 2).mean()


def local_grads(r, k=0, weights=None):
    m = model()
    if weights is not None:
        for p, w in zip(m.parameters(), weights):
            p.array[...] = w
    loss_of(m, batch(r, k)).backward()
    return [p.grad.numpy().copy() for p in m.parameters()]


def compressed_average(grads, dtype):
    parts = [(g.astype(dtype) / np.asarray(world, dtype)).astype(dtype).astype(np.float32) for g in grads]
    return sum(parts).astype(dtype).astype(np.float32)


mine = [local_grads(r) for r in range(world)]
exact = [sum(gs) / world for gs in zip(*mine)]
for name in ["none", "allreduce_hook", "fp16_compress_hook", "bf16_compress_hook"]:
    ddp = DDP(model(), bucket_cap_mb=1e-4, first_bucket_mb=1e-4)  # several buckets
    assert len(ddp.bucket_sizes) > 1, ddp.bucket_sizes
    if name != "none":
        ddp.register_comm_hook(None, getattr(default_hooks, name))
    loss_of(ddp, batch(rank)).backward()
    for i, p in enumerate(ddp.module.parameters()):
        got = p.grad.numpy()
        if name in ("none", "allreduce_hook"):
            np.testing.assert_allclose(got, exact[i], rtol=1e-6, atol=1e-7, err_msg=f"{name} param {i}")
        else:
            dtype = np.float16 if name.startswith("fp16") else bfloat16
            want = compressed_average([g[i] for g in mine], dtype)
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=f"{name} param {i}")
        checks += 1
    if name.endswith("compress_hook"):
        assert max(np.abs(p.grad.numpy() - e).max() for p, e in zip(ddp.module.parameters(), exact)) > 1e-6, name
    if name != "none":
        refused(ddp.register_comm_hook, (None, default_hooks.allreduce_hook), "only be called once",
                "a second hook was accepted")
        checks += 1
late = DDP(model())
loss_of(late, batch(rank)).backward()
refused(late.register_comm_hook, (None, default_hooks.allreduce_hook), "before the first backward",
        "a hook after backward was accepted")
checks += 1

# join: uneven inputs
for divide in (True, False):
    ddp = DDP(model())
    opt = it.optim.SGD(ddp.parameters(), lr=0.1)
    batches = 3 if rank == 0 else 1
    with ddp.join(divide_by_initial_world_size=divide):
        for k in range(batches):
            opt.zero_grad()
            loss_of(ddp, batch(rank, k)).backward()
            opt.step()
    weights = [p.numpy().copy() for p in model().parameters()]
    for k in range(3):
        if k == 0:
            grads = [sum(gs) / world for gs in zip(*[local_grads(r, k, weights) for r in range(world)])]
        else:
            grads = [g / (world if divide else 1) for g in local_grads(0, k, weights)]
        weights = [w - np.float32(0.1) * g for w, g in zip(weights, grads)]
    for i, (p, w) in enumerate(zip(ddp.module.parameters(), weights)):
        np.testing.assert_allclose(p.numpy(), w, rtol=1e-5, atol=1e-6, err_msg=f"join divide={divide} param {i}")
        checks += 1
# join(throw_on_early_termination=True): rank 1 runs out after one batch; both ranks raise, rank 0 in its second step
ddp = DDP(model())
opt = it.optim.SGD(ddp.parameters(), lr=0.1)
steps = 0
try:
    with ddp.join(throw_on_early_termination=True):
        for k in range(3 if rank == 0 else 1):
            opt.zero_grad()
            loss_of(ddp, batch(rank, k)).backward()
            opt.step()
            steps += 1
    raise AssertionError("join(throw_on_early_termination=True) did not raise")
except RuntimeError as exc:
    assert "a rank ran out of inputs" in str(exc), exc
assert steps == 1, steps  # rank 0's second forward saw the count drop
checks += 1
print(f"rank {rank} hooks ok {checks}", flush=True)
