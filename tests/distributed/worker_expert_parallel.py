"""Run under ``mpiexec -n N python worker_expert_parallel.py E [E ...]`` (N a multiple of each E): for every
expert-parallel size E, ``expert_parallel`` against the one-process ``it.nn.MoE``. Every rank builds the same layer
(same seed) and computes every rank's tokens (different per rank, seeded by rank), so it checks its own part:
the outputs and input gradients against the one-process layer over its expert group's tokens (in rank order), its
local experts' gradients against that layer's, the router's and shared expert's summed over the group, the metrics
(tokens per expert, drops, all-to-all bytes), float64 at rtol 1e-10. Cases: an expert no token reaches, a rank
that sends nothing to a peer, a rank without tokens, top_k = num_experts, top_k = 1, a capacity factor with drops,
a shared expert with its gate; then the expert-data reduction and the whole/sharded state dicts.
Prints "rank R EP OK N"."""
import sys
import warnings

import numpy as np

import infini_train as it
from infini_train import distributed as dist
from infini_train.distributed.expert_groups import expert_groups
from infini_train.nn.parallel import (all_reduce_expert_grads, expert_parallel, expert_parameters,
                                      shard_expert_state_dict, whole_expert_state_dict)
from tests.distributed.rank_checks import RankChecks

warnings.simplefilter("ignore", RuntimeWarning)  # a rank without tokens: its aux and z losses are means of nothing
dist.init_process_group("mpi", timeout=60)
rank, world = dist.get_rank(), dist.get_world_size()
DIM, HIDDEN = 8, 5
check = RankChecks(rank)


def close(a, b, what):
    a, b = np.asarray(a), np.asarray(b)
    check(a.shape == b.shape and np.allclose(a, b, rtol=1e-10, atol=1e-12), f"{what}: {a} != {b}")


def build(n, k, **kw):
    it.manual_seed(7)
    return it.nn.MoE(DIM, HIDDEN, n, k, dtype=it.float64, **kw)


def tokens(j, case, n, E):
    """Rank j's tokens and upstream gradient (world rank j; different sizes per rank)."""
    rng = np.random.default_rng(1000 * j + 17)
    rows = 0 if case == "empty_rank" and j % E == 1 else 3 + 2 * j
    x = rng.standard_normal((rows, DIM)) * 0.1
    if case == "no_token":  # expert n - 1 far behind for every token (its gate row is -5 e_{n-1})
        x[:, n - 1] = -3.0
    if case == "local_only" and j % E == 0:  # these ranks' tokens stay with their own experts
        x[:, :n // E] += 3.0
    return x, rng.standard_normal((rows, DIM))


def steer(moe, case):
    if case in ("no_token", "local_only"):
        with it.no_grad():
            gate = np.zeros((moe.num_experts, DIM))
            gate[np.arange(moe.num_experts), np.arange(moe.num_experts)] = 5.0
            if case == "no_token":
                gate[-1, -1] = 5.0
            moe.gate.weight.copy_(it.tensor(gate))


def grads(module):
    return {name: (None if p.grad is None else p.grad.numpy().copy()) for name, p in module.named_parameters()}


def run_case(E, groups, n, k, case="plain", **kw):
    members = groups.expert_group.ranks
    me = groups.expert_group.rank
    data = [tokens(j, case, n, E) for j in members]
    ref = build(n, k, **kw)
    steer(ref, case)
    xs = it.tensor(np.concatenate([d[0] for d in data]), requires_grad=True)
    out = ref(xs)
    (out * it.tensor(np.concatenate([d[1] for d in data]))).sum().backward()
    rows = np.cumsum([0] + [len(d[0]) for d in data])
    mine = slice(rows[me], rows[me + 1])

    moe = build(n, k, **kw)
    steer(moe, case)
    expert_parallel(moe, groups.expert_group)
    x = it.tensor(data[me][0], requires_grad=True)
    y = moe(x)
    (y * it.tensor(data[me][1])).sum().backward()
    what = f"E{E} n{n} k{k} {case} {kw}"
    close(y.numpy(), out.numpy()[mine], f"{what}: output")
    gx = x.grad.numpy() if x.grad is not None else np.zeros(x.shape)  # None: every assignment dropped
    close(gx, xs.grad.numpy()[mine], f"{what}: input gradient")
    local = range(me * n // E, (me + 1) * n // E)
    check(sorted(moe.experts.keys(), key=int) == [str(e) for e in local], f"{what}: local experts")
    ref_grads, ep_grads = grads(ref), grads(moe)
    for name, g in ep_grads.items():
        if name.startswith("experts."):
            if ref_grads[name] is None:
                check(g is None, f"{what}: {name} has a gradient but the one-process expert got no token")
            else:
                close(g, ref_grads[name], f"{what}: {name}")
        else:  # replicated: this rank's tokens' part; summed over the group it is the one-process gradient
            total = it.tensor(g if g is not None else np.zeros_like(ref_grads[name]))
            dist.all_reduce(total, group=groups.expert_group)
            close(total.numpy(), ref_grads[name], f"{what}: {name} summed over the group")
    check(set(ep_grads) <= set(ref_grads) and len(ep_grads) < len(ref_grads) or E == 1, f"{what}: names")
    np.testing.assert_array_equal(moe.tokens_per_expert, ref.tokens_per_expert[local.start:local.stop])
    np.testing.assert_array_equal(moe.group_tokens_per_expert, ref.tokens_per_expert)
    dropped = it.tensor(np.array([moe.dropped_tokens], np.int64))
    dist.all_reduce(dropped, group=groups.expert_group)
    check(int(dropped.item()) == ref.dropped_tokens, f"{what}: dropped {dropped.item()} != {ref.dropped_tokens}")
    sizes = [len(d[0]) for d in data]
    if "capacity_factor" in kw:
        check(ref.dropped_tokens > 0, f"{what}: the case drops nothing")
    if case == "no_token":
        check(ref.tokens_per_expert[-1] == 0 and ref.experts[n - 1].up_proj.weight.grad is None, f"{what}: reached")
    if case == "empty_rank":
        check(0 in sizes, f"{what}: no rank without tokens")
    if case == "plain" and k == n:  # every token goes to every expert: the bytes are known
        L = n // E
        expect = (E - 1) * n * 8 + (sizes[me] * L * (E - 1) + L * (sum(sizes) - sizes[me])) * DIM * 8
        check(moe.all_to_all_bytes == expect, f"{what}: all_to_all_bytes {moe.all_to_all_bytes} != {expect}")
    if case == "local_only" and me == 0:  # sends no token to its peers, only the results of theirs back
        expect = (E - 1) * n * 8 + (moe.tokens_per_expert.sum() - sizes[0] * k) * DIM * 8
        check(moe.all_to_all_bytes == expect, f"{what}: all_to_all_bytes {moe.all_to_all_bytes} != {expect}")
    return moe, ref


def refusal(groups, E):
    try:
        expert_parallel(it.nn.MoE(DIM, HIDDEN, E + 1, 1), groups.expert_group)
    except ValueError as e:
        check(f"num_experts ({E + 1}) must be divisible by the expert-parallel size ({E})" in str(e)
              and "HINT" in str(e), str(e))
    else:
        check(False, "num_experts not divisible by E was accepted")


def expert_data_and_state(E, groups):
    """Every rank's tokens through one layer: the expert-data reduction gives the one-process gradient / DP; the
    whole state dict is the one-process state dict; a sharded one loads back."""
    n, k = 2 * E, 2
    ref = build(n, k)
    data = [tokens(j, "plain", n, E) for j in range(world)]
    out = ref(it.tensor(np.concatenate([d[0] for d in data])))
    (out * it.tensor(np.concatenate([d[1] for d in data]))).sum().backward()
    moe = expert_parallel(build(n, k), groups.expert_group)
    (moe(it.tensor(data[rank][0])) * it.tensor(data[rank][1])).sum().backward()
    check(groups.data_size == world and len(expert_parameters(moe)) == 3 * n // E, "expert parameters")
    all_reduce_expert_grads(moe, groups.expert_data_group, groups.data_size)
    ref_grads = grads(ref)
    for name, g in grads(moe).items():
        if name.startswith("experts."):
            close(g, ref_grads[name] / world, f"E{E}: {name} reduced over the expert-data group")
    whole = whole_expert_state_dict(moe, groups.expert_group)
    full = ref.state_dict()
    check(list(whole) == list(full), f"whole state names {list(whole)} != {list(full)}")
    for name, t in full.items():
        close(whole[name].numpy(), t.numpy(), f"whole state {name}")
    fresh = expert_parallel(build(n, k, capacity_factor=None), groups.expert_group)
    with it.no_grad():
        for p in fresh.parameters():
            p.zero_()
    fresh.load_state_dict(shard_expert_state_dict(fresh, full), strict=True)
    for name, t in fresh.state_dict().items():
        close(t.numpy(), full[name].numpy(), f"sharded state {name}")


for E in [int(a) for a in sys.argv[1:]]:
    groups = expert_groups(range(world), E)
    check(groups.expert_group.ranks == list(range(rank // E * E, rank // E * E + E)), "expert group")
    check(groups.expert_data_group.ranks == list(range(rank % E, world, E)), "expert-data group")
    refusal(groups, E)
    for n, k, case, kw in [
        (2 * E, 2, "plain", {}),
        (E, E, "plain", {}),                       # top_k = num_experts
        (2 * E, 2 * E, "plain", {}),               # top_k = num_experts, two experts a rank
        (2 * E, 1, "plain", {}),                   # top_k = 1
        (4, 2, "no_token", {}) if 4 % E == 0 else (2 * E, 2, "plain", {}),
        (2 * E, 2, "local_only", {}),              # the group's rank 0 sends nothing to its peers
        (2 * E, 2, "empty_rank", {}),              # group rank 1 has no token
        (2 * E, 2, "plain", {"capacity_factor": 0.5}),
        (2 * E, 1, "plain", {"capacity_factor": 1.0}),
        (2 * E, 2, "plain", {"num_shared_experts": 1, "shared_expert_gate": True}),
    ]:
        run_case(E, groups, n, k, case, **kw)
    expert_data_and_state(E, groups)
print(f"rank {rank} EP OK {check.count}", flush=True)
