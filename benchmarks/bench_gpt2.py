"""GPT-2 training step (forward, backward, AdamW) in infini_train and in torch eager, side by side.

    python benchmarks/bench_gpt2.py [--configs tiny d12-T64 d12-T256] [--steps 5] [--warmup 2] [--threads 2] [--phases]
    python benchmarks/bench_gpt2.py --device cuda:0 [--configs d12-B8-T1024 d12-B16-T1024] --precision fp32 bf16-mixed
        [--precision fp32 bf16-mixed fp16-mixed]   (one or more; each config runs in each)
        [--recompute none block]   (block: every transformer block recomputed in backward; torch: HF's
                                    gradient checkpointing with use_reentrant=False)

Both frameworks get the same config, the same weights (copied from infini_train's init) and the same
batch. Timed steps alternate between the two so drifting machine load hits both alike. Reports tokens/s,
the ratio infini_train/torch (above 1.0 means infini_train is faster), MFU against the dense-GEMM peak measured
in the same run (float32; on a GPU bfloat16 too, for the mixed-precision rows), and peak memory (measured in a
subprocess per framework so one does not hide the other's allocations): on the CPU the RSS growth, on a GPU the
largest number of bytes allocated at once (cupy's memory pool in use, torch.cuda.max_memory_allocated).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

# as importing infini_train first does (host_threads.py): without it numpy's OpenBLAS workers spin ~0.1 s after
# each product on the cores torch's threads need in this same process (torch's tiny step ran 2x slower)
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "18")

import numpy as np  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

CONFIGS = {
    "tiny": dict(n_layer=4, n_embd=256, n_head=4, vocab_size=512, block_size=64, B=4, T=64),
    "d12-T64": dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, block_size=1024, B=4, T=64),
    "d12-T256": dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, block_size=1024, B=4, T=256),
    "d12-B8-T1024": dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, block_size=1024, B=8, T=1024),
    "d12-B16-T1024": dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, block_size=1024, B=16, T=1024),
}
CPU_CONFIGS = ["tiny", "d12-T64", "d12-T256"]  # the default of each device
GPU_CONFIGS = ["d12-B8-T1024"]


def rss_mb():
    """Peak resident memory of this process in MB: VmHWM (ru_maxrss would include the parent's peak, which a
    child inherits across fork and exec on Linux)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def sgemm_peak(n=2048, repeats=3):
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    a @ a
    best = min(_timed(lambda: a @ a) for _ in range(repeats))
    return 2 * n ** 3 / best


def gpu_gemm_peak(dtype, n=8192, repeats=5):
    """float32 through cupy (the kernels infini_train runs); bfloat16 through torch (cuBLAS, as autocast uses)."""
    if dtype == "float32":
        import cupy
        a = cupy.random.standard_normal((n, n), dtype=cupy.float32)
    else:
        import torch
        a = torch.randn(n, n, device="cuda", dtype=getattr(torch, dtype))
    a @ a
    best = min(_timed(lambda: a @ a) for _ in range(repeats))
    return 2 * n ** 3 / best


def _timed(fn):
    _sync()
    t0 = time.perf_counter()
    fn()
    _sync()
    return time.perf_counter() - t0


def _phase_marks(phases):
    """mark() appends the seconds since the previous mark to ``phases`` (synchronised); a no-op for None."""
    if phases is None:
        return lambda: None
    last = [time.perf_counter()]

    def mark():
        _sync()
        now = time.perf_counter()
        phases.append(now - last[0])
        last[0] = now

    return mark


DEVICE = "cpu"  # --device; "cuda" runs both frameworks on the GPU (infini_train through cupy)
PRECISION = "fp32"  # --precision: bf16-mixed / fp16-mixed run each forward under the framework's autocast
LOW = {"bf16-mixed": "bfloat16", "fp16-mixed": "float16"}
RECOMPUTE = "none"  # --recompute


def _sync():
    if DEVICE != "cpu":
        import cupy
        cupy.cuda.Device().synchronize()
        import torch
        if torch.cuda.is_available():
            torch.cuda.synchronize()


def build_it(spec):
    import infini_train as it
    from infini_train.models.gpt2 import GPT2, GPT2Config
    from infini_train.models.recompute import set_recompute

    cfg = GPT2Config(**{k: v for k, v in spec.items() if k not in ("B", "T")})
    it.manual_seed(0)
    model = set_recompute(GPT2(cfg).to(DEVICE), RECOMPUTE)
    opt = model.configure_optimizers(0.1, 6e-4)
    rng = np.random.default_rng(0)
    x = rng.integers(0, cfg.vocab_size, size=(spec["B"], spec["T"]))
    y = rng.integers(0, cfg.vocab_size, size=(spec["B"], spec["T"]))
    xt, yt = it.tensor(x, device=DEVICE), it.tensor(y, device=DEVICE)
    low = LOW.get(PRECISION)
    scaler = it.amp.GradScaler(device=DEVICE.split(":")[0]) if PRECISION == "fp16-mixed" else None

    def step(phases=None):
        mark = _phase_marks(phases)
        opt.zero_grad()
        with it.autocast(DEVICE.split(":")[0], dtype=getattr(it, low or "bfloat16"), enabled=low is not None):
            _, loss = model(xt, yt)
        mark()
        if scaler is None:
            loss.backward()
            mark()
            opt.step()
        else:
            scaler.scale(loss).backward()
            mark()
            scaler.step(opt)
            scaler.update()
        value = loss.item()
        mark()
        return value

    return model, step


def build_torch(spec, state):
    import torch
    from transformers import GPT2Config as HFConfig
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel(HFConfig(n_embd=spec["n_embd"], n_layer=spec["n_layer"], n_head=spec["n_head"],
                                  vocab_size=spec["vocab_size"], n_positions=spec["block_size"], resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0, activation_function="gelu_new"),
                         ).train().to("cuda" if DEVICE != "cpu" else "cpu")
    if RECOMPUTE == "block":
        hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if state is not None:
        sd = {}
        for k, v in state.items():
            t = torch.tensor(v)
            if k.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")) and ".h." in k:
                t = t.T.contiguous()
            sd[k] = t
        hf.load_state_dict(sd, strict=False)
    decay = [p for p in hf.parameters() if p.dim() >= 2]
    no_decay = [p for p in hf.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8)  # torch's default: foreach on GPUs
    rng = np.random.default_rng(0)
    dev = "cuda" if DEVICE != "cpu" else "cpu"
    x = torch.tensor(rng.integers(0, spec["vocab_size"], size=(spec["B"], spec["T"])), device=dev)
    y = torch.tensor(rng.integers(0, spec["vocab_size"], size=(spec["B"], spec["T"])), device=dev)
    V = spec["vocab_size"]
    low = LOW.get(PRECISION)
    scaler = torch.amp.GradScaler(dev) if PRECISION == "fp16-mixed" else None

    def step(phases=None):
        mark = _phase_marks(phases)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev, dtype=getattr(torch, low or "bfloat16"), enabled=low is not None):
            logits = hf(x).logits
            loss = torch.nn.functional.cross_entropy(logits.view(-1, V), y.view(-1))
        mark()
        if scaler is None:
            loss.backward()
            mark()
            opt.step()
        else:
            scaler.scale(loss).backward()
            mark()
            scaler.step(opt)
            scaler.update()
        value = loss.item()
        mark()
        return value

    return hf, step


def memory_probe(framework, name, steps):
    """Run in a child process: RSS growth (MB) of building the model and running ``steps`` training steps."""
    code = (f"import sys; sys.path.insert(0, {REPO!r}); import benchmarks.bench_gpt2 as b; "
            f"b.PRECISION = {PRECISION!r}; b.RECOMPUTE = {RECOMPUTE!r}; b.DEVICE = {DEVICE!r}; "
            f"print(b._memory_child({framework!r}, {name!r}, {steps}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        return float("nan")
    return float(out.stdout.strip().splitlines()[-1])


def _memory_child(framework, name, steps):
    spec = CONFIGS[name]
    import torch
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    base = rss_mb()
    if framework == "it" and DEVICE != "cpu":
        from infini_train.training.memory import DevicePeak
        device_peak = DevicePeak()
    else:
        device_peak = None
    step = build_it(spec)[1] if framework == "it" else build_torch(spec, None)[1]
    for _ in range(steps):
        step()
    if DEVICE == "cpu":
        return rss_mb() - base
    _sync()
    return (device_peak.peak if device_peak else torch.cuda.max_memory_allocated()) / 2 ** 20


def run(name, steps, warmup, threads, memory, phases=False):
    import torch

    torch.set_num_threads(threads)
    spec = CONFIGS[name]
    model, it_step = build_it(spec)
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    _, th_step = build_torch(spec, state)
    for _ in range(warmup):
        it_step()
        th_step()
    t_it, t_th = [], []
    for _ in range(steps):
        t_it.append(_timed(it_step))
        t_th.append(_timed(th_step))
    tokens = spec["B"] * spec["T"]
    flops = model.flops_per_token(spec["T"]) * tokens
    result = {"config": name, "tokens_per_step": tokens,
              "it_tok_s": tokens / min(t_it), "torch_tok_s": tokens / min(t_th),
              "it_ms": 1000 * min(t_it), "torch_ms": 1000 * min(t_th), "flops_per_step": flops}
    result["ratio"] = result["it_tok_s"] / result["torch_tok_s"]
    if phases:  # forward, backward, optimizer step: the median of ``steps`` more steps each, alternated
        marks = {"it": [], "torch": []}
        for _ in range(steps):
            for framework, step in (("it", it_step), ("torch", th_step)):
                times = []
                step(times)
                marks[framework].append(times)
        for framework, rows in marks.items():
            result[f"{framework}_phase_ms"] = [1000 * float(np.median(col)) for col in zip(*rows)]
    if memory:
        os.environ["BENCH_THREADS"] = str(threads)
        result["it_mem_mb"] = memory_probe("it", name, 2)
        result["torch_mem_mb"] = memory_probe("torch", name, 2)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS),
                        help=f"default: {' '.join(CPU_CONFIGS)} on the CPU, {' '.join(GPU_CONFIGS)} on a GPU")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda:N (needs cupy, and a CUDA build of torch)")
    parser.add_argument("--precision", nargs="+", default=["fp32"], choices=["fp32", *LOW],
                        help="bf16-mixed / fp16-mixed: both frameworks' autocast (fp16 also a GradScaler)")
    parser.add_argument("--recompute", nargs="+", default=["none"], choices=["none", "block"],
                        help="block: activation recomputation of every transformer block, in both frameworks")
    parser.add_argument("--phases", action="store_true",
                        help="also time forward, backward and the optimizer step apart (medians of --steps more)")
    args = parser.parse_args()
    global DEVICE, PRECISION, RECOMPUTE
    DEVICE = args.device
    args.configs = args.configs or (CPU_CONFIGS if DEVICE == "cpu" else GPU_CONFIGS)
    if DEVICE == "cpu":
        peaks = {"fp32": sgemm_peak()}
        print(f"sgemm peak (2048^2, numpy): {peaks['fp32'] / 1e9:.1f} GFLOP/s")
    else:
        import cupy
        cupy.cuda.Device(int(DEVICE.partition(":")[2] or 0)).use()
        import torch
        torch.cuda.set_device(int(DEVICE.partition(":")[2] or 0))
        peaks = {p: gpu_gemm_peak(LOW.get(p, "float32")) for p in args.precision}
        print(f"GPU: {torch.cuda.get_device_name()}; dense GEMM peak (8192^3) "
              + ", ".join(f"{LOW.get(p, 'float32')} {v / 1e12:.1f} TFLOP/s" for p, v in peaks.items()))
    header = (f"{'config':10s}{'precision':>11s}{'recompute':>10s}{'it tok/s':>10s}{'torch tok/s':>13s}{'ratio':>7s}"
              f"{'it MFU':>8s}{'torch MFU':>10s}")
    header += "" if args.no_memory else f"{'it MB':>8s}{'torch MB':>10s}"
    print(header)
    results = []
    for name, PRECISION, RECOMPUTE in [(n, p, rc) for n in args.configs for p in args.precision
                                       for rc in args.recompute]:
        r = run(name, args.steps, args.warmup, args.threads, not args.no_memory, args.phases)
        r["precision"], r["recompute"] = PRECISION, RECOMPUTE
        peak = peaks.get(PRECISION, peaks.get("fp32"))  # the CPU's: float32 for every precision
        r["peak_flops"] = peak
        r["it_mfu"] = r["flops_per_step"] / (r["it_ms"] / 1000) / peak
        r["torch_mfu"] = r["flops_per_step"] / (r["torch_ms"] / 1000) / peak
        line = (f"{name:10s}{PRECISION:>11s}{RECOMPUTE:>10s}{r['it_tok_s']:10.0f}{r['torch_tok_s']:13.0f}"
                f"{r['ratio']:7.2f}{100 * r['it_mfu']:7.1f}%{100 * r['torch_mfu']:9.1f}%")
        if not args.no_memory:
            line += f"{r['it_mem_mb']:8.0f}{r['torch_mem_mb']:10.0f}"
        print(line, flush=True)
        if args.phases:
            print("    ms forward / backward / optimizer: it " + " / ".join(f"{v:.1f}" for v in r["it_phase_ms"])
                  + ", torch " + " / ".join(f"{v:.1f}" for v in r["torch_phase_ms"])
                  + ", ratio " + " / ".join(f"{a / b:.2f}" for a, b in zip(r["it_phase_ms"], r["torch_phase_ms"])),
                  flush=True)
        results.append(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": DEVICE, "gemm_peaks": peaks, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
