"""Run under mpiexec -n 2: DDP on half batches equals one process on the full batch; no_sync; unused params."""
import numpy as np

import infini_train as it
from infini_train import distributed as dist
from infini_train import nn
from infini_train.models.gpt2 import GPT2, GPT2Config
from infini_train.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("mpi")
rank, world = dist.get_rank(), dist.get_world_size()
cfg = GPT2Config(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32)
rng = np.random.default_rng(0)
x = rng.integers(0, 64, size=(4, 16))
y = rng.integers(0, 64, size=(4, 16))


def build(seed):
    it.manual_seed(seed)
    return GPT2(cfg)


# reference: one process, full batch (every rank computes it)
ref = build(100)  # rank 0 of the DDP job also starts from seed 100
opt = ref.configure_optimizers(0.1, 1e-3)
for step in range(5):
    opt.zero_grad()
    _, loss = ref(it.tensor(x), it.tensor(y))
    loss.backward()
    if step == 0:
        ref_grads = {n: p.grad.numpy().copy() for n, p in ref.named_parameters()}
    opt.step()

# DDP: rank r gets rows [2r, 2r+2); different init seeds prove the rank-0 broadcast
model = build(100 + rank)
ddp = DDP(model, bucket_cap_mb=0.01, first_bucket_mb=0.002)
assert len(ddp.reducer.buckets) > 2, "small caps give several buckets"
opt = model.configure_optimizers(0.1, 1e-3)
half = slice(2 * rank, 2 * rank + 2)
for step in range(5):
    opt.zero_grad()
    _, loss = ddp(it.tensor(x[half]), it.tensor(y[half]))
    loss.backward()
    if step == 0:
        grads = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
    opt.step()
for n, g in grads.items():
    # atol 1e-7: float32 sums over the batch in another order (entries with cancellation)
    np.testing.assert_allclose(g, ref_grads[n], rtol=1e-5, atol=1e-7, err_msg=f"step-0 gradient {n}")
# atol 5e-6: the attention key biases have an exactly-zero gradient in exact arithmetic (softmax ignores a
# per-row shift), so AdamW turns float32 rounding noise (~1e-9) into lr-sized steps of arbitrary sign there
for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
    np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-5, atol=5e-6, err_msg=f"weights {n}")
# both ranks hold identical (averaged) gradients
for n, g in grads.items():
    parts = [it.zeros(*g.shape) for _ in range(world)]
    dist.all_gather(parts, it.tensor(g))
    np.testing.assert_array_equal(parts[0].numpy(), parts[1].numpy(), err_msg=n)

# no_sync: two local micro-steps then one synced step == the average of all four micro-batches' gradients
model = build(7)
ddp = DDP(model)
quarters = [slice(0, 1), slice(1, 2), slice(2, 3), slice(3, 4)]
mine = quarters[2 * rank:2 * rank + 2]
model.zero_grad()
with ddp.no_sync():
    _, loss = ddp(it.tensor(x[mine[0]]), it.tensor(y[mine[0]]))
    (loss / 2).backward()
local_only = model.transformer.wte.weight.grad.numpy().copy()
_, loss = ddp(it.tensor(x[mine[1]]), it.tensor(y[mine[1]]))
(loss / 2).backward()
ref = build(7)
_, loss = ref(it.tensor(x), it.tensor(y))
loss.backward()
for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
    np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-4, atol=1e-7, err_msg=f"no_sync {n}")
assert not np.allclose(local_only, ref.transformer.wte.weight.grad.numpy())


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.used = nn.Linear(3, 2)
        self.unused = nn.Linear(3, 2)

    def forward(self, v):
        return self.used(v)


it.manual_seed(1)
m = TwoHeads()
strict = DDP(m)
try:
    strict(it.ones(2, 3)).sum().backward()
    raise AssertionError("expected an unused-parameter error")
except RuntimeError as exc:
    assert "received no gradient" in str(exc) and "find_unused_parameters=True" in str(exc)
strict.reducer.remove()  # one DDP wrapper per module at a time
m.zero_grad()
lenient = DDP(m, find_unused_parameters=True)
lenient(it.ones(2, 3) * (rank + 1)).sum().backward()
np.testing.assert_allclose(m.used.weight.grad.numpy(), 3.0)  # mean over ranks of 2 rows * (rank + 1)
assert m.unused.weight.grad is None  # unused on every rank: left alone (None), as torch's reducer does


class Routed(nn.Module):  # as a mixture of experts: which head runs depends on the rank's data
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleList([nn.Linear(3, 2) for _ in range(3)])

    def forward(self, v, head):
        return self.heads[head](v)


routed = Routed()
ddp = DDP(routed, find_unused_parameters=True)
with ddp.no_sync():  # head 0 runs on both ranks in the first micro-batch, then head 1 on rank 0 only
    ddp(it.ones(2, 3), 0).sum().backward()
ddp(it.ones(2, 3), 1 if rank == 0 else 0).sum().backward()
np.testing.assert_allclose(routed.heads[0].weight.grad.numpy(), 3.0)  # (2 + 4) / 2: kept through no_sync
np.testing.assert_allclose(routed.heads[1].weight.grad.numpy(), 1.0)  # rank 0's 2, averaged with rank 1's zeros
assert routed.heads[2].weight.grad is None
ddp.reducer.remove()

# ignored_parameters (an expert-parallel layer's local experts): not broadcast from rank 0, not averaged
it.manual_seed(7 + rank)  # different weights per rank
own = Routed()
mine = own.heads[2].weight.numpy().copy()
ddp = DDP(own, find_unused_parameters=True, ignored_parameters=list(own.heads[2].parameters()))
np.testing.assert_array_equal(own.heads[2].weight.numpy(), mine)  # kept; the others are rank 0's
(ddp(it.ones(2, 3), 0).sum() + ddp(it.ones(2, 3) * (rank + 1), 2).sum()).backward()
np.testing.assert_allclose(own.heads[0].weight.grad.numpy(), 2.0)
np.testing.assert_allclose(own.heads[2].weight.grad.numpy(), 2.0 * (rank + 1))  # this rank's own gradient
assert own.heads[1].weight.grad is None
dist.barrier()
print(f"rank {rank} DDP OK", flush=True)
