"""it.profiler: events of a known graph, self times adding up to the profiled wall time, torch's table layout, the
Chrome trace (valid JSON, proper nesting per thread, every backward after its forward, a track per thread and per
rank), CUDA device time (GPU only), and the profile config section of runs (files written, bad values refused)."""
import json
import os
import re
import time

import numpy as np
import pytest

import infini_train as it
from infini_train.autograd import observers
from infini_train.models.gpt2 import GPT2, GPT2Config
from infini_train.nn.parallel import DataParallel
from infini_train.profiler import (FunctionEventAvg, ProfilerActivity, merge_chrome_traces, module_ranges, profile,
                                   record_function)
from infini_train.training.config import ConfigError, load_config
from tests.distributed.mpi_jobs import needs_mpiexec
from tests.training.tiny_run import CONFIG, run, tiny_args

GPT_TINY = GPT2Config(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32)


def gpt2_step(model, opt, rng, batch=4):
    x = it.tensor(rng.integers(0, 64, (batch, 16)))
    y = it.tensor(rng.integers(0, 64, (batch, 16)))
    _, loss = model(x, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def small_graph(repeats):
    x = it.randn(4, 8, requires_grad=True)
    w = it.randn(8, 3, requires_grad=True)
    with profile(record_shapes=True) as prof:
        for _ in range(repeats):
            (x @ w).tanh().sum().backward()
    return prof


def complete_events(trace):
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def ns(value):
    return round(value * 1000)  # trace times are microseconds with three decimals: exact nanoseconds


def assert_nested_per_thread(events):
    """On each (pid, tid) track, two events are either disjoint or one holds the other."""
    tracks = {}
    for e in events:
        tracks.setdefault((e["pid"], e["tid"]), []).append((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), e["name"]))
    for track in tracks.values():
        open_ = []
        for start, end, name in sorted(track, key=lambda t: (t[0], -t[1])):
            while open_ and open_[-1][1] <= start:
                open_.pop()
            if open_:
                assert end <= open_[-1][1], f"{name} [{start}, {end}] overlaps {open_[-1]} partially"
            open_.append((start, end, name))
    return tracks


# ------------------------------------------------------------------------------------------ events and table
def test_key_averages_count_every_op_call_of_a_known_graph():
    prof = small_graph(repeats=3)
    counts = {avg.key: avg.count for avg in prof.key_averages()}
    assert counts == {"Matmul": 3, "Tanh": 3, "Sum": 3, "SumBackward": 3, "TanhBackward": 3, "MatmulBackward": 3,
                      "AccumulateGrad": 6}
    by_shape = {(avg.key, str(avg.input_shapes)): avg.count for avg in prof.key_averages(group_by_input_shape=True)}
    assert by_shape[("Matmul", "[[4, 8], [8, 3]]")] == 3
    assert by_shape[("AccumulateGrad", "[[4, 8]]")] == 3 and by_shape[("AccumulateGrad", "[[8, 3]]")] == 3
    assert all(isinstance(a, FunctionEventAvg) for a in prof.key_averages())
    assert not observers.ACTIVE  # nothing stays installed after the with-block


def test_backward_events_share_their_forward_sequence_number():
    events = small_graph(repeats=1).events()
    fwd = {e.name: e.sequence_nr for e in events if e.kind == "forward"}
    bwd = {e.name: e.sequence_nr for e in events if e.kind == "backward" and e.name != "AccumulateGrad"}
    assert bwd == {f"{name}Backward": nr for name, nr in fwd.items()}
    assert len(set(fwd.values())) == 3


def test_self_times_sum_to_the_profiled_wall_time_of_a_gpt2_step():
    it.manual_seed(0)
    model = GPT2(GPT_TINY)
    opt = model.configure_optimizers(0.1, 1e-3)
    rng = np.random.default_rng(0)
    gpt2_step(model, opt, rng)  # warm-up
    inside_ops = []
    for _ in range(3):  # a step of a few ms: a pause of the scheduler on a loaded machine may land between two ops
        with profile() as prof:
            t0 = time.perf_counter()
            with record_function("train_step"):
                gpt2_step(model, opt, rng)
            wall_us = (time.perf_counter() - t0) * 1e6
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20)
        total = re.search(r"Self CPU time total: ([\d.]+)(s|ms|us)\n$", table)
        total_us = float(total.group(1)) * {"s": 1e6, "ms": 1e3, "us": 1.0}[total.group(2)]
        assert abs(total_us - wall_us) <= 0.1 * wall_us, (total_us, wall_us)
        assert abs(total_us - prof.wall_time_us) <= 0.1 * prof.wall_time_us
        step = next(e for e in prof.events() if e.name == "train_step")
        np.testing.assert_allclose(prof.events().self_cpu_time_total, step.cpu_time_total, rtol=1e-9)
        names = {e.name for e in prof.events()}
        assert {"Embedding", "EmbeddingBackward", "Optimizer.step#AdamW.step"} <= names
        ops = sum(e.self_cpu_time_total for e in prof.events() if e.kind in ("forward", "backward", "optimizer"))
        inside_ops.append(ops / step.cpu_time_total)
        if inside_ops[-1] > 0.5:
            break
    assert max(inside_ops) > 0.5, inside_ops  # most of a step is inside ops, not between them


def test_table_has_torchs_columns_order_row_limit_and_footer():
    torch = pytest.importorskip("torch")
    x = torch.randn(4, 8, requires_grad=True)
    with torch.profiler.profile() as tprof:
        (x @ x.T).tanh().sum().backward()
    torch_header = tprof.key_averages().table(row_limit=3).splitlines()[1].split("  ")
    prof = small_graph(repeats=2)
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=3)
    lines = table.splitlines()
    assert [h.strip() for h in lines[1].split("  ") if h.strip()] == [h.strip() for h in torch_header if h.strip()]
    assert lines[0] == lines[2] == lines[-2] and set(lines[0]) == {"-", " "}
    assert len(lines) == 3 + 3 + 2  # header block, row_limit rows, separator and footer
    rows = [re.split(r"\s{2,}", line.strip()) for line in lines[3:6]]
    self_cpu = [float(re.match(r"([\d.]+)", r[2]).group(1)) * (1000 if r[2].endswith("ms") else 1) for r in rows]
    assert self_cpu == sorted(self_cpu, reverse=True)
    best = max(prof.key_averages(), key=lambda a: a.self_cpu_time_total)
    assert rows[0][0] == best.key and rows[0][-1] == str(best.count)
    assert re.fullmatch(r"\d+\.\d\d%", rows[0][1]) and re.fullmatch(r"[\d.]+(us|ms|s)", rows[0][2])
    by_calls = prof.key_averages().table(sort_by="count", row_limit=1).splitlines()
    assert by_calls[3].split()[0] == "AccumulateGrad" and by_calls[3].split()[-1] == "4"
    shaped = prof.key_averages(group_by_input_shape=True).table(row_limit=-1).splitlines()
    assert shaped[1].split("  ")[-2].strip() == "Input Shapes" and len(shaped) == 3 + 8 + 2
    with pytest.raises(ValueError, match="unknown sort_by 'self_gpu'"):
        prof.key_averages().table(sort_by="self_gpu")


def test_record_function_ranges_as_context_and_decorator():
    @record_function("decorated")
    def work(t):
        return (t * 2).sum()

    t = it.randn(3)
    with profile() as prof:
        with record_function("outer"):
            work(t)
    by_name = {e.name: e for e in prof.events()}
    assert by_name["decorated"].cpu_parent is by_name["outer"]
    assert by_name["Mul"].cpu_parent is by_name["decorated"] and by_name["Sum"].cpu_parent is by_name["decorated"]
    outer = by_name["outer"]
    inner = sum(e.cpu_time_total for e in prof.events() if e.cpu_parent is outer)
    np.testing.assert_allclose(outer.self_cpu_time_total, outer.cpu_time_total - inner, rtol=1e-9)
    with record_function("unprofiled"):  # no profiler: no observer, nothing recorded
        work(t)
    assert not observers.ACTIVE and work(t).item() == pytest.approx(2 * t.sum().item())


def test_collectives_and_optimizer_steps_are_named_ranges():
    p = it.nn.Parameter(it.randn(5))
    opt = it.optim.SGD([p], lr=0.1)
    (p * p).sum().backward()
    with profile() as prof:
        it.distributed.all_reduce(p)
        it.distributed.barrier()
        opt.step()
    names = [e.name for e in prof.events()]
    backend = it.distributed.get_backend()
    assert f"{backend}:all_reduce" in names and f"{backend}:barrier" in names
    assert "Optimizer.step#SGD.step" in names
    assert {e.kind for e in prof.events() if e.name.startswith(backend)} == {"collective"}


def test_profile_misuse_errors_name_the_call():
    prof = profile()
    with pytest.raises(RuntimeError, match="profile.stop: the profiler is not running"):
        prof.stop()
    with prof:
        with pytest.raises(RuntimeError, match="profile.key_averages: no finished profile"):
            prof.key_averages()
        with pytest.raises(RuntimeError, match="already running"):
            prof.start()
    with pytest.raises(ValueError, match="expected activities from it.profiler.ProfilerActivity"):
        profile(activities=["cpu"])
    assert it.profiler.profile is profile


# ------------------------------------------------------------------------------------------------ traces
def test_chrome_trace_is_valid_nested_and_backward_follows_forward(tmp_path):
    it.manual_seed(0)
    model = GPT2(GPT_TINY)
    opt = model.configure_optimizers(0.1, 1e-3)
    rng = np.random.default_rng(0)
    with profile(record_shapes=True) as prof, module_ranges(model):
        with record_function("ProfilerStep#0"):
            gpt2_step(model, opt, rng)
    path = prof.export_chrome_trace(str(tmp_path / "trace.json"))
    with open(path) as f:
        trace = json.load(f)
    events = complete_events(trace)
    assert len(events) == len(prof.events()) > 100
    for e in events:
        assert {"ts", "dur", "pid", "tid", "name", "cat"} <= set(e) and e["dur"] >= 0
    assert_nested_per_thread(events)
    forward_end = {}
    for e in events:
        if e["args"]["kind"] == "forward":
            forward_end[e["args"]["Sequence number"]] = ns(e["ts"]) + ns(e["dur"])
    backwards = [e for e in events if e["args"]["kind"] == "backward" and "Sequence number" in e["args"]]
    assert len(backwards) > 30
    for e in backwards:
        assert ns(e["ts"]) >= forward_end[e["args"]["Sequence number"]], e["name"]
    modules = [e for e in events if e["name"].startswith("nn.Module: ")]
    attn = next(e for e in modules if e["name"] == "nn.Module: CausalSelfAttention transformer.h.0.attn")
    inside = [e for e in events if e["args"]["kind"] == "forward" and ns(attn["ts"]) <= ns(e["ts"])
              and ns(e["ts"]) + ns(e["dur"]) <= ns(attn["ts"]) + ns(attn["dur"])]
    assert {"Linear", "Softmax"} & {e["name"] for e in inside}
    names = {m["args"]["name"] for m in trace["traceEvents"] if m["ph"] == "M" and m["name"] == "process_name"}
    assert names == {"rank 0"}
    assert not any(e["name"].startswith("nn.Module") for e in complete_events(_trace_of_plain_forward(model)))


def _trace_of_plain_forward(model):
    with profile() as prof:
        model(it.tensor(np.zeros((1, 4), np.int64)))
    from infini_train.profiler.chrome_trace import trace_dict
    return trace_dict(prof.events(), prof.thread_names, 0, prof.wall_anchor_ns)


def test_data_parallel_replicas_get_a_track_each(tmp_path):
    it.manual_seed(0)
    net = it.nn.Sequential(it.nn.Linear(5, 16), it.nn.GELU("tanh"), it.nn.Linear(16, 3))
    dp = DataParallel(net, ["cpu:0", "cpu:1"])
    x = it.randn(6, 5)
    with profile() as prof:
        dp(x).sum().backward()
    with open(prof.export_chrome_trace(str(tmp_path / "dp.json"))) as f:
        trace = json.load(f)
    tracks = assert_nested_per_thread(complete_events(trace))
    named = {m["tid"]: m["args"]["name"] for m in trace["traceEvents"] if m["ph"] == "M"
             and m["name"] == "thread_name"}
    replica_tracks = [tid for (_, tid), evs in tracks.items()
                      if any(n == "Linear" for *_, n in evs) and named[tid] != "MainThread"]
    assert len(replica_tracks) == 2, named
    for tid in replica_tracks:
        assert sum(n == "Linear" for *_, n in tracks[(0, tid)]) == 2  # each replica ran both layers


def test_merge_puts_each_rank_in_its_own_process(tmp_path):
    paths = []
    for rank in range(2):
        with profile() as prof:
            (it.randn(3) * 2).sum()
        paths.append(prof.export_chrome_trace(str(tmp_path / f"r{rank}.json"), pid=0))
        time.sleep(0.01)
    out = merge_chrome_traces(paths, str(tmp_path / "merged.json"), ranks=[0, 1])
    with open(out) as f:
        merged = json.load(f)
    with open(paths[1]) as f:
        second = json.load(f)
    assert {e["pid"] for e in merged["traceEvents"]} == {0, 1}
    labels = {e["pid"]: e["args"]["name"] for e in merged["traceEvents"] if e.get("name") == "process_name"}
    assert labels == {0: "rank 0", 1: "rank 1"}
    shift = (second["baseTimeNanoseconds"] - merged["baseTimeNanoseconds"]) / 1000
    assert shift >= 10_000  # the second profile started at least 10 ms later
    mul = [e for e in merged["traceEvents"] if e.get("name") == "Mul" and e["pid"] == 1][0]
    assert mul["ts"] == pytest.approx(complete_events(second)[0]["ts"] + shift, abs=1e-3)
    assert sorted(os.listdir(tmp_path)) == ["merged.json", "r0.json", "r1.json"]  # no temporary file left


@pytest.mark.cuda
def test_cuda_ops_get_device_time_a_gpu_track_and_cuda_columns(tmp_path):
    pytest.importorskip("cupy")
    if not it.backend.cuda_available():
        pytest.skip("no GPU")
    x = it.randn(256, 256, device="cuda:0", requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        (x @ x).tanh().sum().backward()
    matmul = next(e for e in prof.events() if e.name == "Matmul")
    assert matmul.device == "cuda:0" and matmul.device_time_total > 0
    table = prof.key_averages().table(sort_by="self_cuda_time_total")
    assert "Self CUDA" in table.splitlines()[1] and "Self CUDA time total:" in table
    with open(prof.export_chrome_trace(str(tmp_path / "gpu.json"))) as f:
        gpu = [e for e in json.load(f)["traceEvents"] if e.get("cat") == "gpu_op"]
    assert {e["name"] for e in gpu} >= {"Matmul", "MatmulBackward"}


# --------------------------------------------------------------------------------------------------- runs
def _read(path):
    with open(path) as f:
        return f.read()


def test_run_profiles_the_configured_steps(data_dir, tmp_path):
    out = tmp_path / "run"
    proc = run(tiny_args(data_dir, out, "train.num_iterations=4", "train.val_loss_every=0", "profile.start_step=1",
                         "profile.num_steps=2", "profile.record_shapes=true"))
    assert "profile of steps 1-2" in proc.stdout
    folder = out / "profile"
    assert sorted(os.listdir(folder)) == ["ops.txt", "trace.json", "trace_rank0.json"]
    trace = json.loads(_read(folder / "trace_rank0.json"))
    steps = [e["name"] for e in complete_events(trace) if e["name"].startswith("ProfilerStep#")]
    assert steps == ["ProfilerStep#1", "ProfilerStep#2"]
    assert_nested_per_thread(complete_events(trace))
    ops = _read(folder / "ops.txt")
    assert ops.startswith("profile of steps 1-2 on rank 0") and "Self CPU time total:" in ops
    assert "ProfilerStep#1" in ops and "Optimizer.step#AdamW.step" in ops and "by input shape:" in ops
    merged = json.loads(_read(folder / "trace.json"))
    assert {e["pid"] for e in merged["traceEvents"]} == {0}


@needs_mpiexec
def test_two_rank_run_writes_each_rank_and_a_merged_trace(data_dir, tmp_path):
    out = tmp_path / "run"
    run(tiny_args(data_dir, out, "train.num_iterations=2", "train.val_loss_every=0", "train.batch_size=2",
                  "profile.start_step=1"), ranks=2)
    folder = out / "profile"
    assert sorted(os.listdir(folder)) == ["ops.txt", "trace.json", "trace_rank0.json", "trace_rank1.json"]
    merged = json.loads(_read(folder / "trace.json"))
    events = complete_events(merged)
    assert {e["pid"] for e in events} == {0, 1}
    assert_nested_per_thread(events)
    for rank in (0, 1):
        mine = {e["name"] for e in events if e["pid"] == rank}
        assert {"ProfilerStep#1", "mpi:all_reduce", "Optimizer.step#AdamW.step"} <= mine, rank


@pytest.mark.parametrize("override, message", [
    ("profile.num_steps=0", "profile.num_steps: expected an integer >= 1"),
    ("profile.start_step=7", "profile.start_step: expected a step the run trains (0 to train.num_iterations - 1 = "
                             "4) or a negative number (no profiling), got 7"),
    ("profile.record_shapes=sometimes", "profile.record_shapes: expected bool"),
    ("profile.start=1", "profile.start: unknown key (did you mean 'profile.start_step'?)"),
])
def test_bad_profile_config_is_refused_naming_the_key(override, message):
    with pytest.raises(ConfigError) as info:
        load_config(CONFIG, ["train.num_iterations=5", override])
    assert message in str(info.value)
    assert load_config(CONFIG, ["train.num_iterations=5", "profile.start_step=-3"]).profile.start_step == -3
