"""Mixture of experts: the layer, expert-parallel runs and load balancing. Nothing here is a test.

    python benchmarks/bench_moe.py layer --repeats 5      # it.nn.MoE's grouped dispatch vs a per-expert loop vs torch
    python benchmarks/bench_moe.py runs --repeats 3       # tiny Qwen3-MoE at EP1 / EP2 / EP4, same global batch
    python benchmarks/bench_moe.py balance --steps 50     # router_aux_loss_coef 0 vs 0.01 vs 0.1
    python benchmarks/bench_moe.py memory                 # per-rank peak memory by phase, 6 layouts
    python benchmarks/bench_moe.py runs --arch deepseek_v3    # the tiny DeepSeek-V3 at EP1 / EP2 / EP4
    python benchmarks/bench_moe.py memory --arch deepseek_v3  # its per-rank peak memory by phase at EP1 / EP2 / EP4
    python benchmarks/bench_moe.py memory --zero          # ZeRO-2 against ZeRO-3 at EP2 x DP2 and TP2 (sp) x DP2

layer: forward + backward of one MoE layer (float32, one thread each) on (tokens, dim) inputs, median of the
repeats: ``it.nn.MoE`` (dropless: the assignments sorted by expert, one matmul per projection per expert over its
contiguous rows, one index_add back), the same experts' weights run by a per-expert loop (for each expert: a mask
of the tokens that chose it, gather them, run it, weight and scatter-add back), and a plain torch implementation of
the sorted dispatch with the same weights.

runs: the tiny Qwen3-MoE (configs/qwen3_moe_tiny.yaml, shrunk by RUN) trained at EP1 (one process), EP2 and EP4
with the same global batch; the median step time from each run's metrics.jsonl after its first steps, and the
all-to-all bytes a rank sends per step (forward + backward = 2 x the layers' ``all_to_all_bytes``), measured by
this script under mpiexec (``a2a`` mode: the model built as the run builds it, one micro-batch forward + backward).

balance: short runs of the tiny MoE with different ``model.router_aux_loss_coef``; ``expert_load_max`` and
``experts_idle`` from metrics.jsonl at the first and last steps.

memory: a 26M-parameter Qwen3-MoE (MEMORY_MODEL) in one process and at EP2, EP4, PP2, EP2 x PP2 and TP2 x EP2: every
rank's peak resident memory of each phase (build, first and steady steps, save, and load when resumed), from the
runs' memory records in metrics.jsonl. With --zero, the same model in one process and on 4 ranks at EP2 x DP2 and
TP2 (sp) x DP2 under ZeRO-2 and ZeRO-3 (ZERO_LAYOUTS), with the bytes of parameters, gradients and optimizer state
each rank holds (the run's own report).

--arch deepseek_v3: runs and memory of configs/deepseek_v3_tiny.yaml's model (multi-head latent attention, one dense
layer, DeepSeek-MoE layers of 8 routed experts, top-2 in 2 groups, and a shared expert) instead, at EP1 / EP2 / EP4
(ARCHS).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from benchmarks.train_runs import train_run  # noqa: E402

CONFIG = os.path.join(REPO, "configs", "qwen3_moe_tiny.yaml")
# the tiny MoE made small: 3 layers (2 sparse), width 64, 8 experts of width 64, top-2; global batch 8 x 64 tokens
RUN = ["model.n_layer=3", "model.n_embd=64", "model.head_dim=16", "model.intermediate_size=128",
       "model.moe_intermediate_size=64", "train.batch_size=2", "train.sequence_length=64",
       "train.total_batch_size=512", "train.val_loss_every=0", "train.sample_every=0", "train.save_every=0",
       "train.warmup_iters=1", "train.log_every=1"]
# DeepSeek-V3 (configs/deepseek_v3_tiny.yaml's model as it is); the same global batch of 8 x 64 tokens
RUN_DEEPSEEK = ["train.batch_size=2", "train.sequence_length=64", "train.total_batch_size=512",
                "train.val_loss_every=0", "train.sample_every=0", "train.save_every=0", "train.warmup_iters=1",
                "train.log_every=1"]
EP_LAYOUTS = [("one process", 1, []), ("EP2", 2, ["parallel.expert=2"]), ("EP4", 4, ["parallel.expert=4"])]
SHAPES = [(2048, 256, 512, 8, 2), (2048, 256, 512, 32, 2)]  # tokens, dim, hidden, experts, top-k


# ---------------------------------------------------------------------------------------------------------- layer
def loop_forward(moe, x):
    """The same layer computed expert by expert: each expert's tokens found by a mask and gathered separately."""
    import infini_train as it

    route = moe.gate(x)
    ids = route.indices.array                                   # (N, k)
    out = it.zeros(*x.shape, dtype=x.dtype)
    for e, expert in enumerate(moe.experts):
        tok, slot = np.nonzero(ids == e)
        if tok.size == 0:
            continue
        t = it.Tensor._make(tok.astype(np.int64), x.device)
        w = route.weights.reshape(-1).index_select(0, it.Tensor._make((tok * moe.top_k + slot).astype(np.int64),
                                                                         x.device))
        out = out.index_add(0, t, expert(x.index_select(0, t)) * w.unsqueeze(-1))
    return out


def torch_layer(moe, top_k):
    """A torch module computing the sorted dispatch with ``moe``'s weights."""
    import torch
    import torch.nn.functional as tf

    gate = torch.tensor(moe.gate.weight.numpy())
    experts = [tuple(torch.tensor(getattr(ex, n).weight.numpy()) for n in ("gate_proj", "up_proj", "down_proj"))
               for ex in moe.experts]
    params = [gate] + [w for ex in experts for w in ex]
    for p in params:
        p.requires_grad_(True)

    def forward(x):
        probs = torch.softmax(x @ gate.T, dim=-1, dtype=torch.float32)
        w, idx = probs.topk(top_k, dim=-1)
        w = (w / w.sum(-1, keepdim=True)).to(x.dtype)
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=len(experts)).tolist()
        rows = x.index_select(0, order // top_k)
        outs = [tf.linear(tf.silu(tf.linear(r, g)) * tf.linear(r, u), d)
                for (g, u, d), r, c in zip(experts, rows.split(counts), counts) if c]
        y = torch.cat(outs) * w.reshape(-1)[order].unsqueeze(-1)
        return torch.zeros_like(x).index_add(0, order // top_k, y)

    return forward, params


def time_it(fn, repeats):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def layer(args):
    import torch

    torch.set_num_threads(1)
    print("| tokens, dim, hidden, experts, top-k | grouped (it.nn.MoE) ms | per-expert loop ms | loop / grouped "
          "| torch sorted ms | grouped / torch |")
    print("| --- | --- | --- | --- | --- | --- |")
    for shape in SHAPES:
        print(layer_shape(*shape, args.repeats), flush=True)


def layer_shape(n, dim, hidden, experts, k, repeats):
    import torch

    import infini_train as it

    it.manual_seed(0)
    moe = it.nn.MoE(dim, hidden, experts, k)
    xa = np.random.default_rng(0).standard_normal((n, dim)).astype(np.float32)
    gy = np.random.default_rng(1).standard_normal((n, dim)).astype(np.float32)

    def run_it(forward):
        def step():
            x = it.tensor(xa, requires_grad=True)
            forward(x).backward(it.tensor(gy))
            moe.zero_grad()
        return step

    # the three give the same output
    x = it.tensor(xa)
    np.testing.assert_allclose(moe(x).numpy(), loop_forward(moe, x).numpy(), rtol=1e-4, atol=1e-5)
    tfwd, tparams = torch_layer(moe, k)
    tx, tgy = torch.tensor(xa), torch.tensor(gy)
    np.testing.assert_allclose(tfwd(tx).detach().numpy(), moe(x).numpy(), rtol=1e-4, atol=1e-5)

    def run_torch():
        x = tx.clone().requires_grad_(True)
        tfwd(x).backward(tgy)
        for p in tparams:
            p.grad = None

    grouped, loop, tor = [], [], []
    for _ in range(repeats):  # alternated, so the machine's drift hits all three
        grouped.append(time_it(run_it(moe), 1))
        loop.append(time_it(run_it(lambda x: loop_forward(moe, x)), 1))
        tor.append(time_it(run_torch, 1))
    g, lo, t = (statistics.median(v) for v in (grouped, loop, tor))
    return (f"| {n}, {dim}, {hidden}, {experts}, {k} | {g:.1f} | {lo:.1f} | {lo / g:.2f} | {t:.1f} | {g / t:.2f} |")


# ----------------------------------------------------------------------------------------------------------- runs
def train(data_dir, out, ranks, *extra, printed=None):
    """The run's step records; ``printed``: a list that gets what the run printed."""
    config, run_keys, _, _ = ARCHS[ARCH[0]]
    records, stdout = train_run(config, out, [f"data.train={data_dir}/train_*.bin", "data.val=null",
                                              "data.tokenizer=byte", "plot=false", "device=cpu", *run_keys, *extra],
                                ranks)
    if printed is not None:
        printed.append(stdout)
    return records


def a2a_bytes(ranks):
    """Bytes one rank sends per step (forward + backward), from this script's ``a2a`` mode under mpiexec."""
    from tests.distributed.mpi_jobs import MPIEXEC, job_env

    proc = subprocess.run([MPIEXEC, "-n", str(ranks), sys.executable, os.path.abspath(__file__), "a2a", "--arch",
                           ARCH[0]],
                          capture_output=True, text=True, cwd=REPO, env=job_env())
    if proc.returncode != 0:
        raise SystemExit(f"a2a at EP{ranks} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    found = [json.loads(m) for m in re.findall(r'\{"rank"[^{}]*\}', proc.stdout)]  # ranks' lines may interleave
    return sorted(found, key=lambda r: r["rank"])


def a2a():
    """Under mpiexec: the run's model at EP = world, one micro-batch per rank for each of the step's
    accumulation steps, forward + backward; prints each rank's bytes sent per step."""
    import infini_train as it
    from infini_train import distributed as dist
    from infini_train.distributed.expert_groups import expert_groups
    from infini_train.models import registry
    from infini_train.nn.parallel import expert_parallel
    from infini_train.training.config import load_config

    dist.init_process_group("mpi", timeout=120)
    rank, world = dist.get_rank(), dist.get_world_size()
    config, run_keys, _, _ = ARCHS[ARCH[0]]
    cfg = load_config(config, run_keys)
    it.manual_seed(cfg.seed)
    cls, _ = registry.model_class(cfg.model.arch)
    model = cls(cfg.model.to_model_config())
    groups = expert_groups(list(range(world)), world)
    for moe in model.moe_layers():
        expert_parallel(moe, groups.expert_group)
    b, t = cfg.train.batch_size, cfg.train.sequence_length
    accum = cfg.train.total_batch_size // (b * t * world)
    rng = np.random.default_rng(rank)
    sent = 0
    for _ in range(accum):
        idx = it.tensor(rng.integers(0, 256, (b, t)).astype(np.int64))
        _, loss = model(idx, idx)
        loss.backward()
        sent += 2 * sum(m.all_to_all_bytes for m in model.moe_layers())  # the backward sends as much again
    print(json.dumps({"rank": rank, "bytes": sent, "layers": len(model.moe_layers())}), flush=True)


def runs(args):
    from tests.training.tiny_run import make_data

    with tempfile.TemporaryDirectory() as tmp:
        data_dir = make_data(os.path.join(tmp, "data"))
        ms = {1: [], 2: [], 4: []}
        for rep in range(args.repeats):  # alternated
            for ranks in ms:
                extra = [f"train.num_iterations={args.steps}"] + ([f"parallel.expert={ranks}"] if ranks > 1 else [])
                recs = train(data_dir, os.path.join(tmp, f"ep{ranks}-{rep}"), ranks, *extra)
                ms[ranks].append(statistics.median(r["ms"] for r in recs[2:]))
                print(f"repeat {rep + 1} EP{ranks}: {ms[ranks][-1]:.1f} ms", flush=True)
        print("| layout | ranks | step ms (median of run medians) | range | all-to-all bytes sent per step, per rank |")
        print("| --- | --- | --- | --- | --- |")
        for ranks, v in ms.items():
            sent = "0" if ranks == 1 else " / ".join(f"{r['bytes']:,}" for r in a2a_bytes(ranks))
            print(f"| EP{ranks} | {ranks} | {statistics.median(v):.1f} | {min(v):.1f}-{max(v):.1f} | {sent} |",
                  flush=True)


# --------------------------------------------------------------------------------------------------------- memory
MEMORY_MODEL = ["model.n_layer=4", "model.n_embd=256", "model.n_head=4", "model.n_kv_head=2", "model.head_dim=64",
                "model.num_experts=32", "model.num_experts_per_tok=2", "model.moe_intermediate_size=256",
                "model.intermediate_size=512", "model.mlp_only_layers=[]", "train.batch_size=4",
                "train.sequence_length=64", "train.total_batch_size=1024", "train.save_every=0"]
MEMORY_LAYOUTS = [("one process", 1, []), ("EP2", 2, ["parallel.expert=2"]), ("EP4", 4, ["parallel.expert=4"]),
                  ("PP2", 2, ["parallel.pipeline=2"]), ("EP2 x PP2", 4, ["parallel.expert=2", "parallel.pipeline=2"]),
                  ("TP2 (sp) x EP2", 4, ["parallel.tensor=2", "parallel.sequence=true", "parallel.expert=2"])]

ZERO_LAYOUTS = [("one process", 1, []),
                ("EP2 x DP2, ZeRO-2", 4, ["parallel.expert=2", "parallel.zero_stage=2"]),
                ("EP2 x DP2, ZeRO-3", 4, ["parallel.expert=2", "parallel.zero_stage=3"]),
                ("TP2 (sp) x DP2, ZeRO-2", 4, ["parallel.tensor=2", "parallel.sequence=true", "parallel.zero_stage=2"]),
                ("TP2 (sp) x DP2, ZeRO-3", 4, ["parallel.tensor=2", "parallel.sequence=true", "parallel.zero_stage=3"])]

# --arch: (config, run keys, the memory runs' keys, the memory runs' layouts)
ARCHS = {"qwen3_moe": (CONFIG, RUN, MEMORY_MODEL, MEMORY_LAYOUTS),
         "deepseek_v3": (os.path.join(REPO, "configs", "deepseek_v3_tiny.yaml"), RUN_DEEPSEEK,
                         ["train.batch_size=4", "train.total_batch_size=1024", "train.save_every=0"], EP_LAYOUTS)}
ARCH = ["qwen3_moe"]


def memory_record(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if "memory" in r][-1]["memory"]["peak_rss_mb"]


def held_mb(stdout):
    """'parameters / gradients / optimizer state' MB of each rank, from the run's memory line."""
    found = re.findall(r"rank \d+: parameters ([\d.]+) MB, gradients ([\d.]+) MB, optimizer state ([\d.]+) MB", stdout)
    return ", ".join(f"{p} / {g} / {o}" for p, g, o in found)


def memory(args):
    """Each layout of a 26M-parameter Qwen3-MoE (4 sparse layers of 32 experts; with --arch deepseek_v3 the tiny
    DeepSeek-V3 at EP1 / EP2 / EP4; with --zero ZERO_LAYOUTS): 2 steps and a save, then a resume for one more step;
    every rank's peak resident memory per phase, from the runs' own records."""
    from tests.training.tiny_run import make_data

    with tempfile.TemporaryDirectory() as tmp:
        data_dir = make_data(os.path.join(tmp, "data"))
        held = " parameters / gradients / optimizer state MB, each rank |" if args.zero else ""
        print(f"| layout | ranks | build | step (first / steady) | save | load (resumed) | largest rank / one process "
              f"|{held}")
        print("| --- " * (8 if args.zero else 7) + "|")
        one = None
        _, _, model_keys, layouts = ARCHS[ARCH[0]]
        for name, ranks, extra in ZERO_LAYOUTS if args.zero else layouts:
            out = os.path.join(tmp, re.sub(r"\W", "", name))
            printed = []
            train(data_dir, out, ranks, *model_keys, *extra, "train.num_iterations=2", printed=printed)
            first = memory_record(out)
            train(data_dir, out, ranks, *model_keys, *extra, "train.num_iterations=3", "resume=auto")
            load = memory_record(out)["load"]
            largest = max(max(v) for v in first.values())
            one = one or largest

            def mb(values):
                return "/".join(f"{v:.0f}" for v in values)

            print(f"| {name} | {ranks} | {mb(first['build'])} | {mb(first['first_step'])} / {mb(first['steady'])} | "
                  f"{mb(first['save'])} | {mb(load)} | {largest / one:.2f} |"
                  + (f" {held_mb(printed[0])} |" if args.zero else ""), flush=True)


# -------------------------------------------------------------------------------------------------------- balance
def balance(args):
    from tests.training.tiny_run import make_data

    with tempfile.TemporaryDirectory() as tmp:
        data_dir = make_data(os.path.join(tmp, "data"))
        print("| router_aux_loss_coef | load max/mean, steps 1-5 | idle experts, steps 1-5 | load max/mean, last 5 "
              "| idle experts, last 5 | aux_loss first / last |")
        print("| --- | --- | --- | --- | --- | --- |")
        for coef in args.coefs:
            recs = train(data_dir, os.path.join(tmp, f"coef{coef}"), 1, f"train.num_iterations={args.steps}",
                         f"model.router_aux_loss_coef={coef}", "train.learning_rate=3e-3")

            def span(rs, key):
                return "[" + ", ".join(f"{r[key]:.2f}" if isinstance(r[key], float) else str(r[key]) for r in rs) + "]"

            print(f"| {coef} | {span(recs[:5], 'expert_load_max')} | {span(recs[:5], 'experts_idle')} "
                  f"| {span(recs[-5:], 'expert_load_max')} | {span(recs[-5:], 'experts_idle')} "
                  f"| {recs[0]['aux_loss']:.3f} / {recs[-1]['aux_loss']:.3f} |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["layer", "runs", "balance", "memory", "a2a"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--coefs", type=float, nargs="+", default=[0.0, 0.01, 0.1])
    parser.add_argument("--arch", choices=sorted(ARCHS), default="qwen3_moe", help="the model of runs, memory and a2a")
    parser.add_argument("--zero", action="store_true", help="memory: ZeRO-2 against ZeRO-3 (ZERO_LAYOUTS)")
    args = parser.parse_args()
    ARCH[0] = args.arch
    if args.what == "layer":
        layer(args)
    elif args.what == "runs":
        args.steps = args.steps or 10
        runs(args)
    elif args.what == "balance":
        args.steps = args.steps or 50
        balance(args)
    elif args.what == "memory":
        memory(args)
    else:
        a2a()


if __name__ == "__main__":
    main()
