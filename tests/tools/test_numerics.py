"""The numerics checker (training/numerics.py, training/tensor_stats.py), its compare tool
(tools/compare_numerics.py), the torch reference (benchmarks/numerics_reference_torch.py) and runs with
numerics.level."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import infini_train as it
from infini_train.autograd import observers
from infini_train.autograd.ops import activations
from infini_train.models.gpt2 import GPT2, GPT2Config
from infini_train.tools.compare_numerics import main as compare
from infini_train.training.config import ConfigError, load_config
from infini_train.training.numerics import NumericsChecker
from infini_train.training.tensor_stats import tensor_stats
from tests.distributed.mpi_jobs import needs_mpiexec
from tests.training.tiny_run import CONFIG, REPO, run, tiny_args

REFERENCE = os.path.join(REPO, "benchmarks", "numerics_reference_torch.py")


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


# ----------------------------------------------------------------------------------------------------- statistics
def test_stats_equal_numpy_with_nan_and_inf():
    a = np.random.default_rng(0).standard_normal((7, 33)).astype(np.float32)
    a[1, 2], a[3, 4], a[5, 6], a[0, 0] = np.nan, np.inf, -np.inf, np.nan
    s = tensor_stats(a)
    finite = a[np.isfinite(a)].astype(np.float64)
    assert (s["nan"], s["inf"]) == (2, 2)
    assert s["min"] == finite.min() and s["max"] == finite.max()
    assert s["absmax"] == np.abs(finite).max()
    np.testing.assert_allclose(s["mean"], finite.mean(), rtol=1e-12)
    none = tensor_stats(np.array([np.nan, np.inf], np.float32))
    assert (none["min"], none["max"], none["mean"], none["absmax"], none["nan"], none["inf"]) == \
        (None, None, None, None, 1, 1)


def python_hash(array):
    """The documented hash, in plain Python integers: splitmix-style mix of each 32-bit word with its position,
    summed mod 2**64, then finalised with the element count."""
    mask = (1 << 64) - 1
    words = np.frombuffer(np.ascontiguousarray(array).tobytes(), "<u4")
    total = 0
    for i, w in enumerate(int(w) for w in words):
        x = w ^ ((i * 0x9E3779B97F4A7C15) & mask)
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
        total = (total + (x ^ (x >> 31))) & mask
    z = total ^ ((array.size * 0x9E3779B97F4A7C15) & mask)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return f"{z ^ (z >> 31):016x}"


def test_hash_is_stable_and_sees_every_bit():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert tensor_stats(np.arange(5, dtype=np.float32))["hash"] == "ee2de8f8eb64b32a"  # pinned: files stay comparable
    r = np.random.default_rng(1).standard_normal(300)
    for x in (a, r.astype(np.float32), r):
        assert tensor_stats(x)["hash"] == python_hash(x)
    assert tensor_stats(a)["hash"] == tensor_stats(a.copy())["hash"]
    strided = np.arange(24, dtype=np.float32)[::2]
    assert tensor_stats(strided)["hash"] == tensor_stats(np.ascontiguousarray(strided))["hash"]
    b = a.copy()
    b[2, 3] = np.nextafter(b[2, 3], np.float32(100))  # one ulp
    assert tensor_stats(b)["hash"] != tensor_stats(a)["hash"]
    assert tensor_stats(a[::-1])["hash"] != tensor_stats(a)["hash"]  # same values, other places
    assert tensor_stats(a.astype(np.float64))["hash"] != tensor_stats(a)["hash"]
    assert tensor_stats(a.astype(np.float16))["hash"] == tensor_stats(a)["hash"]  # widened to float32 exactly


@pytest.mark.cuda
@pytest.mark.skipif(not it.backend.cuda_available(), reason="needs cupy and an NVIDIA GPU")
def test_stats_on_the_gpu_equal_the_host_ones():
    cupy = it.backend.cupy_module()
    a = np.random.default_rng(2).standard_normal((64, 130)).astype(np.float32)
    a[3, 3], a[4, 4] = np.nan, -np.inf
    for x in (a, a.astype(np.float64)):
        gpu, host = tensor_stats(cupy.asarray(x)), tensor_stats(x)
        assert gpu["hash"] == host["hash"] and (gpu["nan"], gpu["inf"]) == (1, 1)
        for k in ("min", "max", "absmax"):
            assert gpu[k] == host[k], k
        np.testing.assert_allclose(gpu["mean"], host["mean"], rtol=1e-12)


# --------------------------------------------------------------------------------------------- names and counts
def tiny_model():
    it.manual_seed(0)
    return GPT2(GPT2Config(block_size=16, vocab_size=50, n_layer=2, n_head=2, n_embd=16))


def one_step(path, level, steps=1, patch=None):
    model = tiny_model()
    idx = it.tensor(np.random.default_rng(0).integers(0, 50, (2, 8)))
    with NumericsChecker(level, str(path), model=model) as check:
        for step in range(steps):
            with check.recording(step):
                logits, loss = model(idx, idx)
                loss.backward()
    assert not observers.ACTIVE  # detached on exit
    return model, logits, read(path)


BLOCK = ["ln_1", "attn.c_attn", "attn.c_proj", "attn.resid_dropout", "attn", "ln_2", "mlp.c_fc", "mlp.gelu",
         "mlp.c_proj", "mlp.dropout", "mlp", ""]
LEVEL1_FORWARD = (["transformer.wte", "transformer.wpe", "transformer.drop"]
                  + [f"transformer.h.{i}{'.' + m if m else ''}" for i in range(2) for m in BLOCK]
                  + ["transformer.ln_f", "lm_head", "model[0]", "model[1]"])


def test_level1_entries_names_and_values(tmp_path):
    model, logits, entries = one_step(tmp_path / "l1.jsonl", 1)
    by_phase = {p: [e for e in entries if e["phase"] == p] for p in ("forward", "backward", "grad")}
    assert len(entries) == sum(map(len, by_phase.values()))
    assert [e["name"] for e in by_phase["forward"]] == LEVEL1_FORWARD
    assert sorted(e["name"] for e in by_phase["backward"]) == sorted(LEVEL1_FORWARD)  # every output has a gradient
    names = [n for n, _ in model.named_parameters()]
    assert sorted(e["name"] for e in by_phase["grad"]) == sorted(names)  # tied lm_head counted once, as wte
    forward = {e["name"]: e for e in by_phase["forward"]}
    assert forward["model[0]"] == {"step": 0, "phase": "forward", "name": "model[0]", "shape": [2, 8, 50],
                                   "dtype": "float32", **tensor_stats(logits.numpy())}
    grads = {e["name"]: e for e in by_phase["grad"]}
    for name, p in model.named_parameters():  # one backward: each parameter's gradient is its .grad
        assert {k: grads[name][k] for k in ("shape", "hash", "absmax")} == \
            {"shape": list(p.shape), **{k: v for k, v in tensor_stats(p.grad.numpy()).items()
                                        if k in ("hash", "absmax")}}, name


def test_level2_adds_every_op_with_stable_names(tmp_path):
    _, _, level1 = one_step(tmp_path / "l1.jsonl", 1)
    _, _, entries = one_step(tmp_path / "l2.jsonl", 2, steps=2)
    step0 = [e for e in entries if e["step"] == 0]
    assert [e["name"] for e in step0 if "/" not in e["name"]] == [e["name"] for e in level1]  # level 1 within
    ops = [e for e in step0 if "/" in e["name"]]
    forward_ops = [e["name"] for e in ops if e["phase"] == "forward"]
    for name in ("transformer.h.1.mlp.gelu/GELU#0", "transformer.h.0.attn.c_attn/Linear#0",
                 "transformer.ln_f/LayerNorm#0"):
        assert name in forward_ops, name
    assert len(forward_ops) == len(set(forward_ops))  # one entry per op and call
    assert "transformer.h.1.mlp.gelu/GELU#0:grad0" in [e["name"] for e in ops if e["phase"] == "backward"]
    op_calls = {name.split("[")[0] for name in forward_ops}  # Split#0[1]: output 1 of a multi-output op
    assert "transformer.h.0.attn/Split#0" in op_calls
    assert all(e["name"].split(":")[0] in op_calls for e in ops if e["phase"] == "backward")
    step1 = [e for e in entries if e["step"] == 1]
    assert [e["name"] for e in step1] == [e["name"] for e in step0]  # counters restart with every module call


# -------------------------------------------------------------------------------------------------------- compare
class PlantedGELU:
    """GELU's forward adds 1e-3 while block 1's GELU module runs."""

    def __init__(self, monkeypatch):
        self.on = False
        original = activations.GELU.forward

        def forward(op, *args):
            out = original(op, *args)
            return out + np.float32(1e-3) if self.on else out

        monkeypatch.setattr(activations.GELU, "forward", forward)

    def run(self, path, level):
        model = tiny_model()
        gelu = model.transformer.h[1].mlp.gelu
        gelu.register_forward_pre_hook(lambda *a: setattr(self, "on", True))
        gelu.register_forward_hook(lambda *a: setattr(self, "on", False))
        idx = it.tensor(np.random.default_rng(0).integers(0, 50, (2, 8)))
        with NumericsChecker(level, str(path), model=model) as check, check.recording(0):
            model(idx, idx)[1].backward()


def test_identical_runs_compare_equal(tmp_path, capsys):
    one_step(tmp_path / "a.jsonl", 2)
    one_step(tmp_path / "b.jsonl", 2)
    assert compare([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]) == 0
    assert "no divergence" in capsys.readouterr().out


@pytest.mark.parametrize("level, where", [(2, "transformer.h.1.mlp.gelu/GELU#0"), (1, "transformer.h.1.mlp.gelu")])
def test_a_planted_divergence_is_found_at_its_op(tmp_path, capsys, monkeypatch, level, where):
    one_step(tmp_path / "a.jsonl", level)
    PlantedGELU(monkeypatch).run(tmp_path / "b.jsonl", level)
    a, b = str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")
    assert compare([a, b]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"first divergence: step 0, forward, {where} (")
    assert "diverged: min, max, mean" in out
    assert compare([a, b, "--atol", "1e-4"]) == 1  # the shift (1e-3) is beyond the tolerance
    assert compare([a, b, "--atol", "2e-3", "--rtol", "1e-6"]) == 0  # within it: no divergence anywhere
    capsys.readouterr()
    assert compare([b, a]) == 1 and f"forward, {where} (" in capsys.readouterr().out


def test_compare_reports_missing_entries_and_bad_input(tmp_path, capsys):
    one_step(tmp_path / "l1.jsonl", 1)
    one_step(tmp_path / "l2.jsonl", 2)
    l1, l2 = str(tmp_path / "l1.jsonl"), str(tmp_path / "l2.jsonl")
    assert compare([l2, l1]) == 1
    assert "transformer.wte/Embedding#0 (line 1 of A) exists only in A" in capsys.readouterr().out
    assert compare([l2, l1, "--skip-missing"]) == 0
    (tmp_path / "bad.jsonl").write_text('{"step": 0}\nnot json\n')
    assert compare([l1, str(tmp_path / "bad.jsonl")]) == 2
    assert "bad.jsonl:1: expected an entry with the keys" in capsys.readouterr().err
    assert compare([l1, str(tmp_path / "nowhere.jsonl")]) == 2
    assert "got a path that does not exist\nHINT:" in capsys.readouterr().err
    assert compare([l1, str(tmp_path)]) == 2  # a file against a directory


# ------------------------------------------------------------------------------------------------ runs and torch
def test_run_file_agrees_with_the_torch_reference(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    args = tiny_args(data_dir, out, "numerics.level=1", "train.num_iterations=2",
                     "train.total_batch_size=256", "train.val_loss_every=1")  # 2 micro-batches; validation left out
    run(args)
    ours = read(out / "numerics" / "rank0.jsonl")
    assert {e["step"] for e in ours} == {0, 1}
    assert len(ours) == 2 * 2 * (2 * len(LEVEL1_FORWARD) + 28)  # steps x micro-batches x entries
    proc = subprocess.run([sys.executable, REFERENCE, "--config", CONFIG, *args, "--steps", "2"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    torch_file = out / "numerics_torch" / "rank0.jsonl"
    theirs = read(torch_file)
    assert sorted((e["step"], e["phase"], e["name"]) for e in theirs) == \
        sorted((e["step"], e["phase"], e["name"]) for e in ours)
    assert compare([str(out / "numerics" / "rank0.jsonl"), str(torch_file), "--rtol", "1e-4"]) == 0
    assert compare([str(out), str(out / "numerics_torch"), "--rtol", "1e-4"]) == 0  # run directories
    assert compare([str(out), str(out / "numerics_torch")]) == 1  # bitwise they differ (other kernels)
    capsys.readouterr()


@needs_mpiexec
def test_a_two_rank_run_writes_a_file_per_rank(data_dir, tmp_path):
    out = tmp_path / "run"
    run(tiny_args(data_dir, out, "numerics.level=1", "train.num_iterations=1",
                  "train.total_batch_size=256"), ranks=2)
    files = sorted(os.listdir(out / "numerics"))
    assert files == ["rank0.jsonl", "rank1.jsonl"]
    rank0, rank1 = (read(out / "numerics" / f) for f in files)
    assert [e["name"] for e in rank0] == [e["name"] for e in rank1] and len(rank0) == 2 * len(LEVEL1_FORWARD) + 28
    first = rank0[0]["name"], rank0[0]["hash"], rank1[0]["hash"]
    assert first[0] == "transformer.wte" and first[1] != first[2]  # each rank embeds its own batch


def test_bad_levels_are_refused_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"numerics\.level: expected 0 \(off\), 1 .* or 2 .*, got 3"):
        load_config(None, ["numerics.level=3"])
    with pytest.raises(ConfigError, match=r"numerics\.level: expected int"):
        load_config(None, ["numerics.level=high"])
    with pytest.raises(ValueError, match=r"NumericsChecker: expected level 0 .* got 5\nHINT"):
        NumericsChecker(5, str(tmp_path / "x.jsonl"), model=tiny_model())
    with pytest.raises(ValueError, match="expected a model"):
        NumericsChecker(1, str(tmp_path / "x.jsonl"))
    assert load_config(None, ["numerics.level=2"]).numerics.level == 2


def test_an_fp32_run_compares_with_a_bf16_mixed_run_across_dtypes(data_dir, tmp_path, capsys):
    runs = {}
    for precision in ("fp32", "bf16-mixed"):
        runs[precision] = str(tmp_path / precision)
        run(tiny_args(data_dir, runs[precision], "numerics.level=1", "train.num_iterations=1",
                      "train.val_loss_every=0", f"precision={precision}"))
    assert compare([runs["fp32"], runs["bf16-mixed"]]) == 1  # the dtypes differ: say so and how to compare
    out = capsys.readouterr().out
    assert "diverged: dtype" in out and '"float32"' in out and '"bfloat16"' in out
    assert "HINT: the runs hold this tensor in float32 and bfloat16: pass --ignore-dtype" in out
    assert compare([runs["fp32"], runs["bf16-mixed"], "--ignore-dtype", "--rtol", "2e-2"]) == 0
    out = capsys.readouterr().out
    agree = re.search(r"no divergence: (\d+) entries agree \(rtol 0.02, atol 0; (\d+) of them float32 in A, bfloat16 "
                      r"in B\)", out)
    assert agree and 0 < int(agree.group(2)) < int(agree.group(1)), out
    # the values still have to agree: bfloat16 rounding is beyond 1e-4 of the magnitudes
    assert compare([runs["fp32"], runs["bf16-mixed"], "--ignore-dtype", "--rtol", "1e-4"]) == 1
    assert "HINT: the runs hold" not in capsys.readouterr().out


def test_an_fp16_mixed_run_records_unscaled_gradients_and_compares_with_fp32(data_dir, tmp_path, capsys):
    runs = {}
    for precision in ("fp32", "fp16-mixed"):
        runs[precision] = str(tmp_path / precision)
        run(tiny_args(data_dir, runs[precision], "numerics.level=1", "train.num_iterations=1",
                      "train.val_loss_every=0", f"precision={precision}"))
    fp32, fp16 = ({(e["phase"], e["name"]): e for e in read(os.path.join(runs[p], "numerics", "rank0.jsonl"))}
                  for p in ("fp32", "fp16-mixed"))
    scaled = [e for e in fp16.values() if e["phase"] in ("backward", "grad")]
    assert scaled and all(e["loss_scale"] == 65536.0 for e in scaled)
    assert not any("loss_scale" in e for e in fp16.values() if e["phase"] == "forward")
    loss_grad = fp16["backward", "model[1]"]  # d(loss)/d(loss), unscaled: 1
    assert (loss_grad["min"], loss_grad["max"], loss_grad["mean"]) == (1.0, 1.0, 1.0)
    head = fp16["grad", "transformer.wte.weight"]
    assert head["absmax"] == pytest.approx(fp32["grad", "transformer.wte.weight"]["absmax"], rel=2e-2)
    assert compare([runs["fp32"], runs["fp16-mixed"], "--ignore-dtype", "--rtol", "2e-2"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"no divergence: \d+ entries agree \(rtol 0.02, atol 0; \d+ of them float32 in A, float16 "
                     r"in B\)", out), out
