"""Draw the documentation's figures (SVG) with matplotlib, from the package's own code where it has the answer:
the rank layouts from the mesh arithmetic (``distributed.mesh``) and the expert groups (``expert_layout``), the
pipeline timetables from ``nn.parallel.pipeline_schedules``, the context-parallel chunks from ring attention's
``chunks_of``, the autograd graph from the engine (its ``next_functions`` edges, dependency counts and the order
backward ran the nodes in). The benchmark plots draw the tables of docs/benchmarks.md.

    python docs/figures/make_figures.py            # rewrites the figures beside this file
    python docs/figures/make_figures.py --out DIR  # somewhere else (the test does)
    python docs/figures/make_figures.py --list     # the files it draws, one per line
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repository: its infini_train

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Polygon, Rectangle  # noqa: E402

plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "infini_train", "font.size": 9,
                     "font.family": "DejaVu Sans", "axes.spines.top": False, "axes.spines.right": False})

STAGE = ["#4c72b0", "#dd8452", "#55a868", "#c44e52"]  # one colour per pipeline stage / rank
LIGHT = ["#c6d4ea", "#f4d3bd", "#c8e3cf", "#ecc3c4"]
F_COLOUR, B_COLOUR = "#4c72b0", "#dd8452"


# ------------------------------------------------------------------------------------------------ helpers
def _canvas(width, height):
    fig, ax = plt.subplots(figsize=(width, height))
    ax.set_axis_off()
    return fig, ax


def _box(ax, x, y, w, h, text="", face="white", edge="#333333", size=8, weight="normal", style="round,pad=0.02",
         **kw):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle=style, facecolor=face, edgecolor=edge, linewidth=1, **kw))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size, weight=weight)


def _arrow(ax, start, end, text="", colour="#333333", style="-|>", rad=0.0, size=7, offset=(0, 0.08), **kw):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=10, color=colour, linewidth=1,
                                 connectionstyle=f"arc3,rad={rad}", **kw))
    if text:
        ax.text((start[0] + end[0]) / 2 + offset[0], (start[1] + end[1]) / 2 + offset[1], text, ha="center",
                va="center", fontsize=size, color=colour)


PREVIEW = {"png": False}  # --png: draw PNG files beside the SVG names instead (to look at them without a browser)


def _save(fig, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if PREVIEW["png"]:
        fig.savefig(path[:-4] + ".png", format="png", bbox_inches="tight", dpi=110)
    else:
        fig.savefig(path, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)


# ------------------------------------------------------------------------------------------ rank layouts
def rank_layout(path):
    """world 8 = PP2 x DP2 x TP2 of GPT-2 124M (12 layers, 12 heads): what each rank holds, its groups."""
    from infini_train.distributed.mesh import mesh_coordinates, mesh_groups

    TP, DP, PP, layers, heads, width = 2, 2, 2, 12, 12, 3072
    sizes = dict(tensor=TP, data=DP)
    fig, ax = _canvas(9.6, 4.6)
    w, h, gap_x, gap_y, stage_gap = 2.35, 1.15, 0.25, 0.55, 1.9
    where = {}
    for rank in range(TP * DP * PP):
        c = mesh_coordinates(rank, **sizes)
        x = c["pp"] * (TP * (w + gap_x) + stage_gap) + c["tp"] * (w + gap_x)
        y = -c["dp"] * (h + gap_y)
        where[rank] = (x, y)
        per_stage = layers // PP
        first, last = c["pp"] * per_stage, (c["pp"] + 1) * per_stage - 1
        stage = ("wte, wpe, " if c["pp"] == 0 else "") + f"blocks {first}-{last}" + (", ln_f, lm_head"
                                                                                     if c["pp"] == PP - 1 else "")
        hs, cols = heads // TP, width // TP
        text = (f"rank {rank}\npp {c['pp']} · dp {c['dp']} · tp {c['tp']}\n{stage}\n"
                f"heads {c['tp'] * hs}-{(c['tp'] + 1) * hs - 1} · MLP {c['tp'] * cols}-{(c['tp'] + 1) * cols - 1}"
                f"\nbatch rows of dp {c['dp']}")
        _box(ax, x, y, w, h, face=LIGHT[c["pp"]], edge=STAGE[c["pp"]])
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=6.4, linespacing=1.35)
    for kind, ranks in mesh_groups(pipeline=PP, **sizes):
        if kind == "tensor":  # a dashed frame around each tensor group
            x0, y0 = where[ranks[0]]
            x1, _ = where[ranks[-1]]
            ax.add_patch(Rectangle((x0 - 0.08, y0 - 0.08), x1 - x0 + w + 0.16, h + 0.16, fill=False,
                                   linestyle="--", edgecolor="#555555", linewidth=0.8))
        elif kind == "data":
            (x0, y0), (x1, y1) = where[ranks[0]], where[ranks[-1]]
            _arrow(ax, (x0 + w * 0.25, y1 + h + 0.08), (x0 + w * 0.25, y0 - 0.08), style="<|-|>", colour="#2a7d2a")
            ax.text(x0 + w * 0.25 + 0.06, (y0 + y1 + h) / 2, "DP all-reduce", fontsize=6, color="#2a7d2a",
                    va="center")
        elif kind == "pipeline" and ranks[0] == 0:  # every pair (r, r + TP x DP) alike: one arrow between stages
            x0 = where[TP - 1][0] + w + 0.15
            x1 = where[TP * DP][0] - 0.15
            mid = (h - (DP - 1) * (h + gap_y)) / 2
            pairs = ", ".join(f"{a}→{b}" for kind2, (a, b) in mesh_groups(pipeline=PP, **sizes) if kind2 == "pipeline")
            _arrow(ax, (x0, mid + 0.25), (x1, mid + 0.25), "activations", colour=STAGE[0], offset=(0, 0.15))
            _arrow(ax, (x1, mid - 0.25), (x0, mid - 0.25), "gradients", colour=STAGE[1], offset=(0, -0.15))
            ax.text((x0 + x1) / 2, mid, "p2p: " + pairs, ha="center", va="center", fontsize=6)
    for p in range(PP):
        x = p * (TP * (w + gap_x) + stage_gap)
        ax.text(x + (TP * (w + gap_x) - gap_x) / 2, h + 0.35, f"pipeline stage {p} (ranks "
                f"{p * TP * DP}-{(p + 1) * TP * DP - 1})", ha="center", fontsize=9, weight="bold", color=STAGE[p])
    bottom = -(DP - 1) * (h + gap_y) - 0.45
    ax.text(0, bottom, "dashed frame: a tensor group (its layers split by attention heads and MLP columns); green: "
            "a data group (the same weights, other batch rows)\nrank = ((pp·DP + dp)·CP + cp)·TP + tp: tensor "
            "fastest, then context, data, pipeline", fontsize=7, color="#444444", va="top")
    ax.set_xlim(-0.2, PP * (TP * (w + gap_x) + stage_gap) - stage_gap + 0.2)
    ax.set_ylim(bottom - 0.5, h + 0.7)
    ax.set_title("world 8 = PP2 × DP2 × TP2 (GPT-2 124M)", fontsize=11)
    _save(fig, path)


def zero_stages(path):
    """What each of 4 data-parallel ranks keeps of the model state under ZeRO 0-3 (GPT-2 124M, fp32 AdamW)."""
    N, params_mb = 4, 474.7  # GPT-2 124M's float32 parameters
    parts = [("parameters", 1.0), ("gradients", 1.0), ("AdamW moments", 2.0)]
    kept = {0: (1, 1, 1), 1: (1, 1, 0), 2: (1, 0, 0), 3: (0, 0, 0)}  # 1: whole on every rank, 0: a 1/N shard
    fig, axes = plt.subplots(4, 1, figsize=(9, 6.2), sharex=True)
    for stage, ax in enumerate(axes):
        ax.set_axis_off()
        ax.set_xlim(-1.9, N * 4.6 + 2.6)
        ax.set_ylim(-0.2, 3.8)
        for r in range(N):
            x0 = r * 4.6
            for i, ((name, units), whole) in enumerate(zip(parts, kept[stage])):
                y = 2.3 - i * 1.0
                seg = units / N
                for k in range(N):
                    mine = whole or k == r
                    ax.add_patch(Rectangle((x0 + k * seg * 2, y), seg * 2, 0.7, facecolor=LIGHT[i] if mine else
                                           "white", edgecolor=STAGE[i], linewidth=0.8, hatch=None if mine else "///"))
                if r == 0:
                    ax.text(-0.15, y + 0.35, name, ha="right", va="center", fontsize=7)
            ax.text(x0 + 2, 3.15, f"rank {r}", ha="center", fontsize=7.5)
        mb = params_mb * sum(units if whole else units / N for (_, units), whole in zip(parts, kept[stage]))
        ax.text(N * 4.6 + 0.1, 1.6, f"{mb:,.0f} MB\nper rank", fontsize=8, va="center")
        label = ["ZeRO-0 (DDP)", "ZeRO-1: optimizer state", "ZeRO-2: + gradients", "ZeRO-3: + parameters"][stage]
        ax.text(-1.9, 3.55, label, fontsize=8.5, weight="bold")
    fig.suptitle("4 data-parallel ranks: filled = kept on this rank, hatched = another rank's shard\n"
                 "(model state of GPT-2 124M in float32: 474.7 MB of parameters; activations not drawn)", fontsize=9)
    _save(fig, path)


def tensor_parallel(path):
    """An MLP split over TP2, without and with sequence parallelism, and where the mappings sit."""
    fig, axes = plt.subplots(2, 1, figsize=(9.6, 5.2))
    middle = ["h = X·A_{r}\n(B, T, 4C/2)\nc_fc cols of rank {r}", "GELU(h)", "GELU(h)·B_{r}\npartial (B, T, C)\n"
              "c_proj rows of rank {r}"]
    rows = [("tensor parallel (TP2)", ["X  (B, T, C)", "copy_to_tensor_\nparallel_region\nfwd: identity\n"
                                       "bwd: all-reduce", *middle, "reduce_from_tensor_\nparallel_region\n"
                                       "fwd: all-reduce\nbwd: identity", "Y  (B, T, C)"]),
            ("+ sequence parallel", ["X_{r}  (B, T/2, C)\ntokens of rank {r}", "gather_from_sequence_\n"
                                     "parallel_region\nfwd: all-gather T\nbwd: reduce-scatter", *middle,
                                     "reduce_scatter_to_\nsequence_parallel_\nregion\nfwd: reduce-scatter T\n"
                                     "bwd: all-gather", "Y_{r}  (B, T/2, C)\ntokens of rank {r}"])]
    for ax, (title, steps) in zip(axes, rows):
        ax.set_axis_off()
        ax.set_xlim(0, len(steps) * 1.45)
        ax.set_ylim(-0.3, 2.5)
        ax.set_title(title, fontsize=10, loc="left")
        for r in range(2):
            y = 1.35 - r * 1.25
            ax.text(-0.05, y + 0.4, f"rank {r}", ha="right", va="center", fontsize=8, weight="bold",
                    color=STAGE[r])
            for i, step in enumerate(steps):
                comm = "region" in step
                x = i * 1.45
                _box(ax, x + 0.05, y, 1.25, 0.86, step.format(r=r), face="#fff6d5" if comm else LIGHT[r],
                     edge="#b08a00" if comm else STAGE[r], size=5.8)
                if i:
                    _arrow(ax, (x - 0.15, y + 0.4), (x + 0.05, y + 0.4))
        for i, step in enumerate(steps):
            if "region" in step:
                _arrow(ax, (i * 1.45 + 0.68, 1.35), (i * 1.45 + 0.68, 0.9), style="<|-|>", colour="#b08a00")
    fig.text(0.5, 0.0, "A (c_fc) is split by columns, B (c_proj) by rows: rank r's partial Y sums to the whole. "
             "Attention does the same by heads; the vocabulary embedding by rows.", ha="center", fontsize=7.5)
    _save(fig, path)


def pipeline_schedules(path):
    """The timetables of gpipe, 1f1b and interleaved for P = 4 stages and M = 8 micro-batches."""
    from infini_train.nn.parallel.pipeline_schedules import ideal_bubble, stage_order, timetable

    P, M = 4, 8
    cases = [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)]
    fig, axes = plt.subplots(len(cases), 1, figsize=(10, 5.8), sharex=True)
    tables = [timetable([stage_order(schedule, P, V, M, s) for s in range(P)], P, V) for schedule, V in cases]
    end = max(len(table) / V for table, (_, V) in zip(tables, cases))
    for ax, (schedule, V), table in zip(axes, cases, tables):
        tick = 1.0 / V  # a chunk holds 1/V of a stage's layers: its forward takes 1/V of the time
        for t, row in enumerate(table):
            for s, action in enumerate(row):
                if action is None:
                    continue
                local = action.chunk // P
                colour = F_COLOUR if action.kind == "F" else B_COLOUR
                ax.add_patch(Rectangle((t * tick, P - 1 - s), tick, 1, facecolor=colour, edgecolor="white",
                                       linewidth=0.6, alpha=1.0 if local == 0 else 0.55))
                ax.text(t * tick + tick / 2, P - 0.5 - s, str(action.mb), ha="center", va="center", fontsize=6,
                        color="white")
        busy = 2 * M  # unit-time forwards and backwards per stage
        ax.set_xlim(0, end + 0.2)
        ax.set_ylim(0, P)
        ax.set_yticks([P - 0.5 - s for s in range(P)], [f"stage {s}" for s in range(P)], fontsize=7)
        chunks = f", V = {V} chunks per stage (light: the second)" if V > 1 else ""
        ax.set_title(f"{schedule}{chunks}: {len(table) * tick:.1f} time units for {busy} of work per stage; "
                     f"ideal bubble {ideal_bubble(schedule, P, V, M):.3f}", fontsize=8.5, loc="left")
        ax.tick_params(axis="x", labelsize=7)
    axes[-1].set_xlabel("time (one unit = one micro-batch's forward or backward through a stage)", fontsize=8)
    handles = [Rectangle((0, 0), 1, 1, color=F_COLOUR), Rectangle((0, 0), 1, 1, color=B_COLOUR)]
    fig.legend(handles, ["forward (micro-batch number)", "backward"], loc="upper right", fontsize=7, ncol=2)
    fig.suptitle(f"P = {P} stages, M = {M} micro-batches (from pipeline_schedules.timetable)", fontsize=10, x=0.4)
    fig.tight_layout()
    _save(fig, path)


def zero_bubble_schedules(path):
    """1f1b against the split schedules (zb1p, zbv, dualpipev) for P = 4, M = 8, timed by ``start_times`` with F = I =
    W = 1 and B = 2 per stage (a V's chunks are half a stage: half of that)."""
    from infini_train.nn.parallel.pipeline_schedules import COSTS, ideal_bubble, stage_order, start_times

    P, M = 4, 8
    cases = [("1f1b", 1), ("zb1p", 1), ("zbv", 2), ("dualpipev", 2)]
    colours = {"F": F_COLOUR, "B": B_COLOUR, "I": "#e8a87c", "W": "#55a868"}
    fig, axes = plt.subplots(len(cases), 1, figsize=(10, 6.6), sharex=True)
    for ax, (schedule, V) in zip(axes, cases):
        orders = [stage_order(schedule, P, V, M, s) for s in range(P)]
        costs = {kind: cost / V for kind, cost in COSTS.items()}
        starts = start_times(orders, P, V, schedule, costs)
        for s, (order, times) in enumerate(zip(orders, starts)):
            for action, start in zip(order, times):
                second = V > 1 and action.chunk >= P
                ax.add_patch(Rectangle((start, P - 1 - s), costs[action.kind], 1, facecolor=colours[action.kind],
                                       edgecolor="white", linewidth=0.5, alpha=0.55 if second else 1.0))
        end = max(t[-1] + costs[o[-1].kind] for t, o in zip(starts, orders))
        ax.set_xlim(0, 3 * M + 3 * (P - 1) + 0.2)
        ax.set_ylim(0, P)
        ax.set_yticks([P - 0.5 - s for s in range(P)], [f"stage {s}" for s in range(P)], fontsize=7)
        chunks = ", two chunks per stage in a V (light: the way back up)" if V > 1 else ""
        ax.set_title(f"{schedule}{chunks}: {end:g} time units for {3 * M} of work per stage; ideal bubble "
                     f"{ideal_bubble(schedule, P, V, M):.3f}", fontsize=8.5, loc="left")
        ax.tick_params(axis="x", labelsize=7)
    axes[-1].set_xlabel("time (a stage's forward of one micro-batch = 1, input half 1, weight half 1, whole "
                        "backward 2)", fontsize=8)
    handles = [Rectangle((0, 0), 1, 1, color=colours[k]) for k in "FBIW"]
    fig.legend(handles, ["forward", "whole backward", "input half (I)", "weight half (W)"], loc="upper right",
               fontsize=7, ncol=4)
    fig.suptitle(f"P = {P} stages, M = {M} micro-batches (pipeline_schedules.start_times)", fontsize=10, x=0.3)
    fig.tight_layout()
    _save(fig, path)


def context_parallel(path):
    """CP4: the sequence in 2N = 8 chunks, rank r keeping r and 2N-1-r, and its share of the causal triangle."""
    from infini_train.nn.parallel.ring_attention import chunks_of

    N = 4
    owner = {c: r for r in range(N) for c in chunks_of(r, N)}
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.6, 4.0), gridspec_kw={"width_ratios": [1.3, 1]})
    left.set_axis_off()
    left.set_xlim(-0.2, 2 * N + 0.2)
    left.set_ylim(-N - 0.6, 1.6)
    for c in range(2 * N):
        _box(left, c + 0.05, 0.3, 0.9, 0.8, f"chunk {c}", face=LIGHT[owner[c]], edge=STAGE[owner[c]], size=7)
    left.text(N, 1.35, "one sequence of T tokens, cut into 2N = 8 chunks", ha="center", fontsize=8)
    for r in range(N):
        a, b = chunks_of(r, N)
        y = -0.7 - r * 0.9
        at = ["0" if n == 0 else "T" if n == 2 * N else f"{n}T/{2 * N}" for n in (a, a + 1, b, b + 1)]
        _box(left, 0.3, y, 7.4, 0.7, f"rank {r} keeps chunks {a} and {b}: tokens [{at[0]}, {at[1]}) and "
             f"[{at[2]}, {at[3]})", face=LIGHT[r], edge=STAGE[r], size=7)
    right.set_xlim(0, 2 * N)
    right.set_ylim(2 * N, 0)
    right.set_aspect("equal")
    work = [0.0] * N
    for q in range(2 * N):
        r = owner[q]
        for k in range(q + 1):
            if k < q:
                right.add_patch(Rectangle((k, q), 1, 1, facecolor=LIGHT[r], edgecolor=STAGE[r], linewidth=0.6))
                work[r] += 1
            else:  # the diagonal block: causal inside
                right.add_patch(Polygon([(k, q), (k, q + 1), (k + 1, q + 1)], facecolor=LIGHT[r], edgecolor=STAGE[r],
                                        linewidth=0.6))
                work[r] += 0.5
    right.set_xticks([c + 0.5 for c in range(2 * N)], [str(c) for c in range(2 * N)], fontsize=7)
    right.set_yticks([c + 0.5 for c in range(2 * N)], [str(c) for c in range(2 * N)], fontsize=7)
    right.set_xlabel("key chunk", fontsize=8)
    right.set_ylabel("query chunk (coloured by the rank that keeps it)", fontsize=8)
    right.set_title("causal attention: every rank " + ("computes " + f"{work[0]:g} blocks" if len(set(work)) == 1
                                                        else "is unequal"), fontsize=8.5)
    fig.suptitle("context parallelism, CP4 (the load-balanced causal layout, ring_attention.chunks_of)", fontsize=10)
    _save(fig, path)


def expert_parallel(path):
    """world 8 = PP2 x DP4 with EP2 and 8 experts: expert groups, expert-data groups, which experts a rank keeps."""
    from infini_train.distributed.expert_groups import expert_layout
    from infini_train.distributed.mesh import mesh_coordinates, mesh_groups

    TP, DP, PP, E, experts = 1, 4, 2, 2, 8
    data_lists = [ranks for kind, ranks in mesh_groups(tensor=TP, data=DP, pipeline=PP) if kind == "data"]
    layout = expert_layout(data_lists, E)
    fig, ax = _canvas(9.6, 4.0)
    w, h, gap, row_gap = 1.9, 1.0, 0.35, 1.85
    where = {}
    for rank in range(TP * DP * PP):
        c = mesh_coordinates(rank, tensor=TP, data=DP)
        x, y = c["dp"] * (w + gap), -c["pp"] * (h + row_gap)
        where[rank] = (x, y)
    for kind, ranks in layout:
        if kind == "expert":
            x0, y0 = where[ranks[0]]
            x1, _ = where[ranks[-1]]
            ax.add_patch(Rectangle((x0 - 0.1, y0 - 0.1), x1 - x0 + w + 0.2, h + 0.2, fill=False, linestyle="--",
                                   edgecolor="#555555", linewidth=0.9))
            ax.text((x0 + x1 + w) / 2, y0 + h + 0.2, f"expert group {ranks}: all-to-all of tokens", ha="center",
                    fontsize=7)
            for i, rank in enumerate(ranks):
                per = experts // E
                x, y = where[rank]
                c = mesh_coordinates(rank, tensor=TP, data=DP)
                _box(ax, x, y, w, h, f"rank {rank}  (pp {c['pp']}, dp {c['dp']})\nexperts {i * per}-"
                     f"{(i + 1) * per - 1} of stage {c['pp']}'s\nMoE layers; attention whole", face=LIGHT[i],
                     edge=STAGE[i], size=6.8)
        else:
            (x0, y0), (x1, _) = where[ranks[0]], where[ranks[-1]]
            odd = ranks[0] % 2
            _arrow(ax, (x0 + w * (0.4 + 0.2 * odd), y0 - 0.12), (x1 + w * (0.4 + 0.2 * odd), y0 - 0.12),
                   style="<|-|>", colour="#2a7d2a", rad=0.18 + 0.1 * odd)
    for p, data in enumerate(data_lists):
        pairs = " and ".join(str(r) for k, r in layout if k == "expert_data" and r[0] in data)
        ax.text(-0.2, -p * (h + row_gap) - 1.2, f"green: expert-data groups {pairs} (the same experts: "
                f"gradients summed over them); the other weights: DDP over the data group {data}", fontsize=6.8,
                color="#2a7d2a")
    ax.set_xlim(-0.3, DP * (w + gap))
    ax.set_ylim(-(PP - 1) * (h + row_gap) - 1.35, h + 0.5)
    ax.set_title("world 8 = PP2 × DP4, parallel.expert = 2, 8 experts per MoE layer (expert_layout)", fontsize=10)
    _save(fig, path)


# ----------------------------------------------------------------------------------------------- concepts
def autograd_graph(path):
    """The graph of h = x @ w; loss = (tanh(h) * h).sum(): nodes, next_functions edges, dependency counts and the
    order the engine ran backward in."""
    import infini_train as it
    from infini_train.autograd import observers
    from infini_train.autograd.accumulate import AccumulateGrad

    class Order(observers.OpObserver):
        def __init__(self):
            self.ran = []

        def backward_begin(self, fn, grad_outputs):
            self.ran.append(fn)

    it.manual_seed(0)
    x = it.randn(4, 3, requires_grad=True)
    w = it.randn(3, 2, requires_grad=True)
    h = x @ w
    loss = (h.tanh() * h).sum()
    order = observers.install(Order())
    try:
        loss.backward()
    finally:
        observers.uninstall(order)
    nodes, edges, depth = [loss.grad_fn], [], {id(loss.grad_fn): 0}
    stack = [loss.grad_fn]
    while stack:  # longest distance from the root: a node sits below every node that feeds it
        fn = stack.pop()
        for nxt, _ in fn.next_functions:
            if nxt is None:
                continue
            edges.append((fn, nxt))
            if id(nxt) not in depth:
                nodes.append(nxt)
            if depth.get(id(nxt), -1) < depth[id(fn)] + 1:
                depth[id(nxt)] = depth[id(fn)] + 1
                stack.append(nxt)
    ran = {id(fn): i + 1 for i, fn in enumerate(order.ran)}
    levels = {}
    for fn in nodes:
        levels.setdefault(depth[id(fn)], []).append(fn)
    fig, ax = _canvas(6.4, 6.4)
    pos = {}
    for d, row in levels.items():
        for i, fn in enumerate(row):
            pos[id(fn)] = ((i - (len(row) - 1) / 2) * 2.4, -d * 1.3)
    names = {id(x): "x (4, 3)", id(w): "w (3, 2)"}
    for parent, child in edges:
        (x0, y0), (x1, y1) = pos[id(parent)], pos[id(child)]
        if depth[id(child)] - depth[id(parent)] > 1:  # an edge past a level: around the nodes between, on the left
            _arrow(ax, (x0 - 1.05, y0), (x1 - 1.05, y1), colour=B_COLOUR, rad=0.35)
        else:
            _arrow(ax, (x0, y0 - 0.3), (x1, y1 + 0.3), colour=B_COLOUR)
    for fn in nodes:
        x0, y0 = pos[id(fn)]
        leaf = isinstance(fn, AccumulateGrad)
        label = (f"{fn.name}" + (f"\n→ {names[id(fn.tensor)]}.grad" if leaf else "") +
                 f"\ndependencies {fn.dependencies_number} · ran {ran.get(id(fn), '-')}")
        _box(ax, x0 - 1.05, y0 - 0.3, 2.1, 0.6, label, face="#e8f0fb" if leaf else "#eeeeee", size=7)
    ax.text(pos[id(loss.grad_fn)][0] + 1.2, 0.05, "loss (seed gradient 1: one more dependency)", fontsize=7,
            va="center")
    bottom = min(y for _, y in pos.values())
    ax.set_xlim(-3.6, 4.2)
    ax.set_ylim(bottom - 0.6, 0.6)
    ax.set_title("h = x @ w;  loss = (h.tanh() * h).sum();  loss.backward()\n"
                 "arrows: next_functions, the way gradients flow", fontsize=9)
    _save(fig, path)


def data_parallel_comm(path):
    """DataParallel on two devices: each comm Function and the dual that runs in backward."""
    fig, ax = _canvas(9.6, 3.6)
    cols = [("batch (8, ...)\non cpu:0", None), ("Scatter(dim 0)", "backward: Gather"),
            ("rows 0-3 on cpu:0\nrows 4-7 on cpu:1", None), ("replica forward\n(threads)", None),
            ("Gather(cpu:0)", "backward: Scatter"), ("outputs (8, ...)\non cpu:0", None)]
    for i, (text, dual) in enumerate(cols):
        comm = dual is not None
        _box(ax, i * 1.6, 1.2, 1.35, 0.8, text, face="#fff6d5" if comm else "#eeeeee",
             edge="#b08a00" if comm else "#333333", size=7)
        if dual:
            ax.text(i * 1.6 + 0.675, 1.05, dual, ha="center", va="top", fontsize=6.5, color=B_COLOUR)
        if i:
            _arrow(ax, (i * 1.6 - 0.25, 1.6), (i * 1.6, 1.6))
    _box(ax, 1.6, -0.2, 1.35, 0.8, "parameters\non cpu:0", face="#eeeeee", size=7)
    _box(ax, 3.2, -0.2, 1.35, 0.8, "Broadcast\n(cpu:0, cpu:1)", face="#fff6d5", edge="#b08a00", size=7)
    ax.text(3.875, -0.35, "backward: ReduceAddCoalesced\n(replicas' gradients summed onto cpu:0)", ha="center",
            va="top", fontsize=6.5, color=B_COLOUR)
    _arrow(ax, (2.95, 0.2), (3.2, 0.2))
    _arrow(ax, (4.55, 0.2), (4.9, 1.2), "a copy per device", rad=0.2, offset=(0.85, -0.1))
    ax.set_xlim(-0.1, len(cols) * 1.6)
    ax.set_ylim(-1.0, 2.2)
    ax.set_title("it.nn.parallel.DataParallel: forward is comm Functions, backward their duals", fontsize=9.5)
    _save(fig, path)


def collectives(path):
    """What the collectives do on 4 ranks: all-reduce, all-gather, reduce-scatter, all-to-all."""
    N = 4
    fig, axes = plt.subplots(1, 4, figsize=(10, 3.0))

    def cell(ax, x, y, text, colour, w=0.9):
        ax.add_patch(Rectangle((x, y), w, 0.8, facecolor=colour, edgecolor="white"))
        ax.text(x + w / 2, y + 0.4, text, ha="center", va="center", fontsize=6.5)

    titles = ["all-reduce (sum)", "all-gather", "reduce-scatter (sum)", "all-to-all"]
    for ax, title in zip(axes, titles):
        ax.set_axis_off()
        ax.set_xlim(-0.8, 2 * N + 1.2)
        ax.set_ylim(-0.2, N + 0.6)
        ax.set_title(title, fontsize=9)
        ax.text(N / 2, N + 0.1, "before", ha="center", fontsize=7)
        ax.text(N + 1 + N / 2, N + 0.1, "after", ha="center", fontsize=7)
        _arrow(ax, (N + 0.1, N / 2), (N + 0.9, N / 2))
        for r in range(N):
            y = N - 1 - r
            ax.text(-0.15, y + 0.4, f"r{r}", ha="right", va="center", fontsize=7)
            if title.startswith("all-reduce"):
                cell(ax, 0, y, "abcd"[r], LIGHT[r], w=N - 0.1)
                cell(ax, N + 1, y, "a+b+c+d", "#dddddd", w=N - 0.1)
            elif title == "all-gather":
                cell(ax, r, y, "abcd"[r], LIGHT[r])
                for k in range(N):
                    cell(ax, N + 1 + k, y, "abcd"[k], LIGHT[k])
            elif title.startswith("reduce-scatter"):
                for k in range(N):
                    cell(ax, k, y, f"{'abcd'[r]}{k}", LIGHT[r])
                cell(ax, N + 1 + r, y, f"Σ{r}", "#dddddd")
            else:
                for k in range(N):
                    cell(ax, k, y, f"{'abcd'[r]}{k}", LIGHT[r])
                    cell(ax, N + 1 + k, y, f"{'abcd'[k]}{r}", LIGHT[k])
    fig.text(0.5, 0.02, "a, b, c, d: the arrays of ranks 0-3 (a0 ... a3: a's 4 blocks). reduce-scatter: rank k "
             "gets Σk = ak + bk + ck + dk;\nall-to-all: block k of every rank goes to rank k (blocks may differ in "
             "size: all_to_all_single's split sizes)", ha="center", fontsize=7)
    _save(fig, path)


def ring_exchange(path):
    """Ring attention over CP4: which rank's keys and values each rank holds at each step."""
    from infini_train.nn.parallel.ring_attention import chunks_of

    N = 4
    fig, (ring, table) = plt.subplots(1, 2, figsize=(9.6, 3.4), gridspec_kw={"width_ratios": [1, 2]})
    ring.set_axis_off()
    ring.set_aspect("equal")
    import math
    pts = [(math.cos(math.pi / 2 - 2 * math.pi * r / N), math.sin(math.pi / 2 - 2 * math.pi * r / N))
           for r in range(N)]
    for r, (x, y) in enumerate(pts):
        nx, ny = pts[(r + 1) % N]
        _arrow(ring, (x * 0.8 + nx * 0.2, y * 0.8 + ny * 0.2), (x * 0.2 + nx * 0.8, y * 0.2 + ny * 0.8),
               colour="#555555", rad=-0.2)
        ring.add_patch(plt.Circle((x, y), 0.28, facecolor=LIGHT[r], edgecolor=STAGE[r]))
        ring.text(x, y, f"rank {r}", ha="center", va="center", fontsize=7)
    ring.set_xlim(-1.5, 1.5)
    ring.set_ylim(-1.5, 1.5)
    ring.set_title("K, V go to rank + 1 each step\n(the next transfer overlaps the compute)", fontsize=8)
    table.set_axis_off()
    table.set_xlim(-1.2, N * 1.6)
    table.set_ylim(-0.4, N + 0.6)
    for s in range(N):
        table.text(s * 1.6 + 0.75, N + 0.2, f"step {s}", ha="center", fontsize=8)
        for r in range(N):
            src = (r - s) % N
            a, b = chunks_of(src, N)
            _box(table, s * 1.6, N - 1 - r, 1.5, 0.8, f"K, V of rank {src}\n(chunks {a}, {b})", face=LIGHT[src],
                 edge=STAGE[src], size=6.5)
    for r in range(N):
        q = chunks_of(r, N)
        table.text(-0.1, N - 0.6 - r, f"rank {r}\nQ chunks {q[0]}, {q[1]}", ha="right", va="center", fontsize=7)
    table.set_title("the keys and values each rank holds at each step", fontsize=8.5)
    fig.text(0.5, 0.0, "Each rank's queries stay; after N steps they have met every key chunk (blocks above the "
             "causal diagonal skipped).\nBackward passes K, V around again, their gradients travelling with them back "
             "home.", ha="center", fontsize=7.5)
    _save(fig, path)


# --------------------------------------------------------------------------------------------- benchmarks
def memory_by_layout(path):
    """bench_memory.py: the largest rank's whole-run peak against one process (GPT-2 124M shapes, 4 ranks)."""
    rows = [("one process", 2041), ("ZeRO-3 × DP4", 706), ("ZeRO-3 × DP2 × TP2", 584), ("PP2 × ZeRO-3 × DP2", 724),
            ("ZeRO-2 × DP4, sharded checkpoint", 1214), ("ZeRO-2 × DP4, whole checkpoint", 2099),
            ("TP2 × PP2, sharded checkpoint", 528)]
    fig, ax = plt.subplots(figsize=(7.5, 3.2))
    labels, mb = [r[0] for r in rows][::-1], [r[1] for r in rows][::-1]
    bars = ax.barh(labels, mb, color=["#999999" if lab == "one process" else STAGE[0] for lab in labels])
    for bar, value in zip(bars, mb):
        ax.text(value + 20, bar.get_y() + bar.get_height() / 2, f"{value} MB ({value / 2041:.2f})", va="center",
                fontsize=7.5)
    ax.set_xlim(0, 2600)
    ax.set_xlabel("peak resident memory of the largest rank over the whole run (MB)", fontsize=8)
    ax.tick_params(labelsize=7.5)
    ax.set_title("GPT-2 124M shapes, B4 T64, 4 ranks (bench_memory.py, 2-core CPU machine)", fontsize=9)
    fig.tight_layout()
    _save(fig, path)


def attention_memory(path):
    """bench_attention.py: time and memory of causal attention against the sequence length."""
    T = [512, 1024, 2048, 4096, 8192, 16384]
    series = {"materialised": ([8, 24, 100, 348, 1276, None], [22, 54, 141, 430, 1481, None]),
              "blocked (memory-efficient)": ([10, 31, 104, 358, 1320, 5394], [18, 31, 56, 104, 201, 399]),
              "torch SDPA": ([5, 13, 41, 136, 504, 1969], [53, 60, 80, 124, 194, 346])}
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2))
    for (name, (ms, mb)), colour in zip(series.items(), ["#999999", STAGE[0], STAGE[1]]):
        keep = [i for i, v in enumerate(ms) if v is not None]
        left.plot([T[i] for i in keep], [ms[i] for i in keep], "o-", color=colour, label=name, markersize=3)
        right.plot([T[i] for i in keep], [mb[i] for i in keep], "o-", color=colour, label=name, markersize=3)
    for ax, label in ((left, "forward + backward (ms)"), (right, "peak memory growth (MB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T", fontsize=8)
        ax.set_ylabel(label, fontsize=8)
        ax.tick_params(labelsize=7)
    right.legend(fontsize=7)
    fig.suptitle("causal attention, B1, 4 heads, D 64, float32 (bench_attention.py; materialised at 16384 would "
                 "need 4 GB)", fontsize=9)
    fig.tight_layout()
    _save(fig, path)


def pipeline_bubble(path):
    """bench_pipeline.py: measured bubble against theory, and the first stage's peak activations."""
    rows = [("P2 gpipe", 0.086, 0.111, 361), ("P2 1f1b", 0.088, 0.111, 105), ("P2 interleaved", 0.054, 0.059, 135),
            ("P2 zb1p", 0.063, 0.040, 105), ("P2 zbv", 0.018, 0.020, 114), ("P2 dualpipev", 0.031, 0.020, 135),
            ("P4 gpipe", 0.238, 0.273, 184), ("P4 1f1b", 0.235, 0.273, 100), ("P4 interleaved", 0.181, 0.158, 141),
            ("P4 zb1p", 0.159, 0.111, 100), ("P4 zbv", 0.055, 0.059, 109), ("P4 dualpipev", 0.083, 0.059, 116)]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.2))
    xs = range(len(rows))
    left.bar([x - 0.2 for x in xs], [r[1] for r in rows], 0.4, color=STAGE[0], label="measured")
    left.bar([x + 0.2 for x in xs], [r[2] for r in rows], 0.4, color="#bbbbbb", label="ideal")
    left.set_ylabel("bubble (idle share of a step)", fontsize=8)
    left.legend(fontsize=7)
    right.bar(list(xs), [r[3] for r in rows], 0.6, color=STAGE[1])
    right.set_ylabel("stage 0 peak activations (MB)", fontsize=8)
    for ax in (left, right):
        ax.set_xticks(list(xs), [r[0] for r in rows], rotation=30, ha="right", fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
    fig.suptitle("GPT-2 8 layers × 256, B4 T128, M = 8 (bench_pipeline.py, 2-core CPU machine)", fontsize=9)
    fig.tight_layout()
    _save(fig, path)


FIGURES = {
    "parallelism/rank-layout.svg": rank_layout,
    "parallelism/zero-stages.svg": zero_stages,
    "parallelism/tensor-parallel.svg": tensor_parallel,
    "parallelism/pipeline-schedules.svg": pipeline_schedules,
    "parallelism/zero-bubble-schedules.svg": zero_bubble_schedules,
    "parallelism/context-parallel.svg": context_parallel,
    "parallelism/expert-parallel.svg": expert_parallel,
    "concepts/autograd-graph.svg": autograd_graph,
    "concepts/data-parallel-comm.svg": data_parallel_comm,
    "concepts/collectives.svg": collectives,
    "concepts/ring-exchange.svg": ring_exchange,
    "benchmarks/memory-by-layout.svg": memory_by_layout,
    "benchmarks/attention-memory.svg": attention_memory,
    "benchmarks/pipeline-bubble.svg": pipeline_bubble,
}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=HERE, help="directory to write into (default: beside this script)")
    parser.add_argument("--list", action="store_true", help="print the files it draws and stop")
    parser.add_argument("--png", action="store_true", help="draw PNG previews instead of the SVG files")
    parser.add_argument("names", nargs="*", help="draw only these (as --list names them)")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(FIGURES))
        return 0
    unknown = [n for n in args.names if n not in FIGURES]
    if unknown:
        parser.error(f"unknown figure(s) {unknown}; --list names them")
    PREVIEW["png"] = args.png
    for name in args.names or FIGURES:
        FIGURES[name](os.path.join(args.out, name))
        print(os.path.join(args.out, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
