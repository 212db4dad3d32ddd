"""Run under ``mpiexec -n N python worker_deepseek_moe.py`` (N even): DeepSeek-MoE routing across ranks against one
process. Every rank builds the same DeepSeekMoE (same seed; group-limited top-k, shared experts, a random nonzero
correction bias) and computes every rank's tokens. Over 3 steps of 2 micro-batches, with the experts split over
expert groups of 2 (EP2 x N/2 data) and replicated (data parallelism alone): each rank's outputs and input gradients
equal the one-process layer's over the same micro-batch of every rank's tokens (rank order), its local experts'
gradients the one-process ones over its expert group's tokens, and after each step's bias update (models/
expert_bias.py, the loads summed over the data ranks) the correction bias equals the one-process layer's after the
same update on the whole batch -- the same on every rank, and moving; the sequence-wise balance loss over slices of
the sequences (sequence parallelism) sums to the one-process loss. float64 at rtol 1e-10. Prints "rank R DS OK N".
"""
from types import SimpleNamespace

import numpy as np

import infini_train as it
from infini_train import distributed as dist
from infini_train.distributed.expert_groups import expert_groups
from infini_train.models.expert_bias import update_expert_biases
from infini_train.nn.moe_routing import DeepSeekMoE, sequence_balance_loss
from infini_train.nn.parallel import expert_parallel
from tests.distributed.rank_checks import RankChecks

dist.init_process_group("mpi", timeout=60)
rank, world = dist.get_rank(), dist.get_world_size()
DIM, HIDDEN, E_TOTAL, K = 8, 5, 8, 2
check = RankChecks(rank)


def close(a, b, what):
    a, b = np.asarray(a), np.asarray(b)
    check(a.shape == b.shape and np.allclose(a, b, rtol=1e-10, atol=1e-12), f"{what}: {a} != {b}")


def build():
    it.manual_seed(7)
    moe = DeepSeekMoE(DIM, HIDDEN, E_TOTAL, K, n_shared_experts=1, n_group=4, topk_group=2, routed_scaling_factor=2.0,
                      bias_update_rate=0.01, dtype=it.float64)
    with it.no_grad():
        moe.gate.e_score_correction_bias.copy_(it.tensor(np.random.default_rng(3).normal(0, 0.05, E_TOTAL)))
    return moe


def tokens(j, step, micro):
    """World rank j's tokens and upstream gradient for a micro-batch (sizes differ per rank)."""
    rng = np.random.default_rng(10000 * step + 100 * micro + j)
    x = rng.standard_normal((3 + j, DIM)) * 0.5 + 0.3  # skewed: the loads are uneven, so the bias moves
    return x, rng.standard_normal((3 + j, DIM))


def grads(module):
    return {name: (None if p.grad is None else p.grad.numpy().copy()) for name, p in module.named_parameters()}


def run(ep):
    """3 steps of 2 micro-batches; ``ep``: the expert-parallel size (1: replicated experts)."""
    groups = expert_groups(range(world), ep) if ep > 1 else None
    members = groups.expert_group.ranks if ep > 1 else [rank]
    ref, moe = build(), build()
    if ep > 1:
        expert_parallel(moe, groups.expert_group)
    dims = SimpleNamespace(grad_size=world, grad_group=dist.default_group(), sequence_parallel=False)
    biases = []
    for step in range(3):
        for micro in range(2):
            data = [tokens(j, step, micro) for j in range(world)]
            rows = np.cumsum([0] + [len(d[0]) for d in data])
            xs = it.tensor(np.concatenate([d[0] for d in data]), requires_grad=True)
            ref.zero_grad()
            out = ref(xs)
            (out * it.tensor(np.concatenate([d[1] for d in data]))).sum().backward()
            x = it.tensor(data[rank][0], requires_grad=True)
            moe.zero_grad()
            y = moe(x)
            (y * it.tensor(data[rank][1])).sum().backward()
            what = f"EP{ep} step {step} micro {micro}"
            close(y.detach().numpy(), out.detach().numpy()[rows[rank]:rows[rank + 1]], f"{what}: output")
            close(x.grad.numpy(), xs.grad.numpy()[rows[rank]:rows[rank + 1]], f"{what}: input gradient")
            if ep > 1 and micro == 0 and step == 0:  # a local expert's gradient: its expert group's tokens only
                group_ref = build()
                gx = it.tensor(np.concatenate([data[j][0] for j in members]))
                (group_ref(gx) * it.tensor(np.concatenate([data[j][1] for j in members]))).sum().backward()
                want, got = grads(group_ref), grads(moe)
                for name, g in got.items():
                    if name.startswith("experts.") and want[name] is not None:
                        close(g, want[name], f"{what}: {name}")
                check(len([n for n in got if n.startswith("experts.")]) == 3 * E_TOTAL // ep, f"{what}: local")
        update_expert_biases(ref)
        update_expert_biases(moe, dims)
        bias = moe.gate.e_score_correction_bias.numpy().copy()
        close(bias, ref.gate.e_score_correction_bias.numpy(), f"EP{ep} step {step}: bias vs one process")
        every = [it.tensor(bias.copy()) for _ in range(world)]
        dist.all_gather(every, it.tensor(bias.copy()))
        check(all(np.array_equal(b.numpy(), bias) for b in every), f"EP{ep} step {step}: bias differs over ranks")
        check(moe.expert_load.sum() == 0, "loads restarted")
        biases.append(bias)
    check(not np.array_equal(biases[0], biases[-1]), f"EP{ep}: the bias did not move")


def sequence_slices():
    """Sequence parallelism's sequence-wise balance loss: each rank holds a slice of every sequence; its part (the
    counts summed over the group) and its gradient, summed over the ranks, are the one-process loss and gradient."""
    B, T = 3, 4 * world
    rng = np.random.default_rng(5)
    scores_np = 1 / (1 + np.exp(-rng.standard_normal((B, T, E_TOTAL))))
    idx_np = np.argsort(-scores_np, -1, kind="stable")[..., :K]
    whole = it.tensor(scores_np.reshape(-1, E_TOTAL), requires_grad=True)
    ref = sequence_balance_loss(whole, it.tensor(idx_np.reshape(-1, K)), B, K)
    ref.backward()
    mine = slice(rank * 4, rank * 4 + 4)
    part_in = it.tensor(scores_np[:, mine].reshape(-1, E_TOTAL), requires_grad=True)
    part = sequence_balance_loss(part_in, it.tensor(idx_np[:, mine].reshape(-1, K)), B, K, dist.default_group())
    part.backward()
    total = it.tensor(np.array([part.item()]))
    dist.all_reduce(total)
    close(total.numpy()[0], ref.item(), "sequence-parallel balance loss")
    close(part_in.grad.numpy(), whole.grad.numpy().reshape(B, T, E_TOTAL)[:, mine].reshape(-1, E_TOTAL),
          "sequence-parallel balance loss gradient")


run(1)
if world % 2 == 0:
    run(2)
sequence_slices()
print(f"rank {rank} DS OK {check.count}", flush=True)
