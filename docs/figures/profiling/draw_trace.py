"""Draws docs/figures/profiling/trace.svg, the profiler trace of the profiling guide, from a run's merged Chrome
trace: one band per rank, the events of its main thread nested as the trace viewer nests them (the step, the module
ranges, forward ops, backward ops, collectives, the optimizer step), coloured by kind:

    mpiexec -n 2 python examples/gpt2/train.py --config configs/gpt2_tiny_ddp.yaml train.num_iterations=6 \\
        train.val_loss_every=0 train.sample_every=0 profile.start_step=4 profile.num_steps=1 out_dir=runs/profiled
    python docs/figures/profiling/draw_trace.py runs/profiled/profile/trace.json
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

COLOURS = {"user": "#9e9e9e", "module": "#c5d7ea", "forward": "#4c78a8", "backward": "#f58518",
           "collective": "#e45756", "optimizer": "#54a24b"}
LABELS = {"user": "step", "module": "module range", "forward": "forward op", "backward": "backward op",
          "collective": "collective / wait", "optimizer": "optimizer step"}


def rank_events(trace):
    """{rank name: [(start ms, duration ms, depth, kind, name)]} of each rank's busiest thread, depth by nesting."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    spans = [e for e in events if e["ph"] == "X"]
    t0 = min(e["ts"] for e in spans)
    out = {}
    for pid in sorted(names):
        mine = [e for e in spans if e["pid"] == pid]
        busiest = max({e["tid"] for e in mine}, key=lambda tid: sum(e["tid"] == tid for e in mine))
        stack, rows = [], []
        for e in sorted((e for e in mine if e["tid"] == busiest), key=lambda e: (e["ts"], -e["dur"])):
            while stack and e["ts"] >= stack[-1]:
                stack.pop()
            rows.append(((e["ts"] - t0) / 1e3, e["dur"] / 1e3, len(stack), e["args"].get("kind", "user"), e["name"]))
            stack.append(e["ts"] + e["dur"])
        out[names[pid]] = rows
    return out


def draw(trace_path, out_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    with open(trace_path) as f:
        ranks = rank_events(json.load(f))
    depth = max(d for rows in ranks.values() for _, _, d, _, _ in rows) + 1
    fig, ax = plt.subplots(figsize=(10, 0.32 * depth * len(ranks) + 1.4))
    ticks = []
    for band, (rank, rows) in enumerate(ranks.items()):
        top = band * (depth + 1)
        ticks.append((top + depth / 2, rank))
        for start, dur, d, kind, name in rows:
            ax.barh(top + d, dur, left=start, height=0.9, color=COLOURS.get(kind, "#bbbbbb"), edgecolor="none")
            if kind in ("user", "optimizer") or (kind == "module" and d <= 2 and dur > 40):
                ax.text(start + 1, top + d, name.replace("nn.Module: ", ""), va="center", fontsize=6, clip_on=True)
    ax.set_yticks([y for y, _ in ticks], [r for _, r in ticks])
    ax.invert_yaxis()
    ax.set_xlabel("ms since the step began")
    ax.spines[["top", "right", "left"]].set_visible(False)
    ax.legend(handles=[Patch(color=COLOURS[k], label=LABELS[k]) for k in COLOURS], ncol=6, fontsize=7,
              loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    fig.suptitle(f"One profiled step of the tiny GPT-2 on {len(ranks)} data-parallel ranks (trace.json)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out_path, metadata={"Date": None})
    plt.close(fig)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    trace = argv[0] if argv else "runs/profiled/profile/trace.json"
    out = argv[1] if len(argv) > 1 else os.path.join(HERE, "trace.svg")
    draw(trace, out)
    print(out)


if __name__ == "__main__":
    main()
