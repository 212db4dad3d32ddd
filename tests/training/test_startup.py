"""What a run prints before its first step (infini_train/training/startup.py): the settings that differ from the
defaults, the one-line layout, the parameter counts and the data's, printed by rank 0 alone."""
import json
import re
from types import SimpleNamespace

import pytest

import infini_train as it
from infini_train.models.gpt2 import GPT2
from infini_train.nn.lora import apply_lora
from infini_train.training.config import load_config
from infini_train.training.startup import config_lines, layout_summary, parameter_summary
from tests.distributed.mpi_jobs import needs_mpiexec, output
from tests.training.tiny_run import CONFIG, run, tiny_args


def dims(world, pp=1, dp=1, cp=1, tp=1, ep=1, sp=False, schedule="1f1b", virtual=1, context="ring"):
    return SimpleNamespace(world=world, pp_size=pp, dp_size=dp, cp_size=cp, tp_size=tp, expert_size=ep,
                           sequence_parallel=sp, schedule=schedule, virtual=virtual, context_layout=context)


@pytest.mark.parametrize("layout,settings,device,transport,line", [
    (dims(1), [], "cpu", None, "world 1 (one process), fp32, cpu"),
    (dims(2, dp=2), ["parallel.zero_stage=1"], "cpu", "mpi, MPICH 5.0.2",
     "world 2 = DP2, ZeRO-1, fp32, cpu (mpi, MPICH 5.0.2)"),
    (dims(8, pp=2, dp=2, tp=2), ["parallel.zero_stage=1", "precision=bf16-mixed"], "cuda", "nccl, MPICH 5.0.2",
     "world 8 = PP2 (1f1b) x DP2 x TP2, ZeRO-1, bf16-mixed, cuda (nccl, MPICH 5.0.2)"),
    (dims(16, pp=2, dp=2, cp=2, tp=2, ep=2, sp=True, schedule="interleaved", virtual=2), ["parallel.zero_stage=3"],
     "cpu", None, "world 16 = PP2 (interleaved, 2 virtual stages) x DP2 x CP2 (ring, EP2) x TP2+SP, ZeRO-3, fp32, cpu"),
    (dims(4, cp=4, context="hybrid: all-to-all 2 x ring 2"), [], "cpu", None,
     "world 4 = CP4 (hybrid: all-to-all 2 x ring 2), fp32, cpu"),
    (dims(4, dp=2, cp=2, context="ulysses"), [], "cpu", None, "world 4 = DP2 x CP2 (ulysses), fp32, cpu"),
    (dims(4, dp=4, ep=2), ["dtype=float64"], "cpu", None, "world 4 = DP4 (EP2), fp64, cpu"),
])
def test_the_layout_line_names_every_axis_above_one(layout, settings, device, transport, line):
    assert layout_summary(layout, load_config(None, settings), SimpleNamespace(type=device), transport) == line


def test_only_the_settings_that_differ_from_the_defaults_are_listed():
    cfg = load_config(None, ["train.learning_rate=3e-4", "out_dir=runs/x", "model.n_layer=2", "data.val=null",
                             "train.beta1=0.9"])  # beta1 as the default: not listed
    assert config_lines(cfg, "runs/x/config.yaml") == [
        "config: 4 settings differ from the defaults (all of them in runs/x/config.yaml)",
        "  out_dir: runs/x (default runs/default)",
        "  model.n_layer: 2",  # (the model keys' default is null: the preset's or the arch's value)
        "  data.val: null (default data/stdlib_byte/val_*.bin)",
        "  train.learning_rate: 0.0003 (default 0.001)"]
    assert config_lines(load_config(None), "c.yaml") == ["config: 0 settings differ from the defaults (all of them "
                                                         "in c.yaml)"]


def test_lora_counts_its_adapters_as_the_trainable_parameters():
    model = GPT2(load_config(None, ["model.n_layer=1", "model.n_embd=32", "model.n_head=2"]).model.to_model_config())
    total = sum(p.numel() for p in model.parameters())
    assert parameter_summary(model.num_params(), model.num_params(trainable=True)) == \
        f"parameters: {total:,} (all trainable)"
    apply_lora(model, 2, 16.0, 0.0, "all-linear")
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert trainable < model.num_params() == sum(p.numel() for p in model.parameters())
    assert parameter_summary(model.num_params(), model.num_params(trainable=True), [700, 650]) == \
        f"parameters: {model.num_params():,}, {trainable:,} trainable " \
        f"({100 * trainable / model.num_params():.2f}%); per rank 650 to 700"


def _model_parameters(args, lora_rank=0):
    """(total, trainable) of the run's model, built here."""
    cfg = load_config(CONFIG, args)
    it.manual_seed(0)
    model = GPT2(cfg.model.to_model_config())
    if lora_rank:
        apply_lora(model, lora_rank, 16.0, 0.0, "all-linear")
    params = list(model.parameters())
    return sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad)


def _startup(stdout):
    """The start-up block: from the config header to the MFU line."""
    lines = stdout.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("config: "))
    return lines[first:next(i for i, line in enumerate(lines) if line.startswith("MFU "))]


def test_a_one_process_run_prints_its_changes_layout_parameters_and_data(data_dir, tmp_path):
    args = tiny_args(data_dir, tmp_path / "run", "train.num_iterations=2")
    proc = run(args)
    lines = _startup(proc.stdout)
    changes = [line for line in lines if line.startswith("  ")]
    assert lines[0] == f"config: {len(changes)} settings differ from the defaults (all of them in " \
                       f"{tmp_path / 'run' / 'config.yaml'})"
    assert "  train.num_iterations: 2 (default 100)" in changes and "  model.n_layer: 2" in changes
    assert not [line for line in changes if re.match(r"  (train\.beta1|parallel\.|lora\.|precision|seed|model\.bias)",
                                                     line)], changes  # the defaults
    assert "run config:" not in proc.stdout and "  bias: null" not in proc.stdout  # not the whole resolved config
    assert load_config(str(tmp_path / "run" / "config.yaml")).train.num_iterations == 2  # written whole, as before
    total, _ = _model_parameters(args)
    meta = json.loads((data_dir / "meta.json").read_text())
    epochs = 2 * 128 / meta["train_tokens"]
    assert lines[len(changes) + 1:] == [
        "world 1 (one process), fp32, cpu",
        f"parameters: {total:,} (all trainable)",
        f"data: {meta['train_tokens']:,} train tokens, {meta['val_tokens']:,} val tokens (tokenizer byte)",
        f"batch: 128 tokens/step = B4 x T32 x grad_accum 1 x DP1; 2 steps = {epochs:.3g} epochs"]


def test_a_lora_run_counts_fewer_trainable_parameters_than_it_has(data_dir, tmp_path):
    args = tiny_args(data_dir, tmp_path / "run", "train.num_iterations=1", "lora.rank=2")
    total, trainable = _model_parameters(args, lora_rank=2)
    assert trainable < total
    line = next(line for line in run(args).stdout.splitlines() if line.startswith("parameters: "))
    assert line == f"parameters: {total:,}, {trainable:,} trainable ({100 * trainable / total:.2f}%)"


@needs_mpiexec
def test_two_ranks_print_the_layout_once(data_dir, tmp_path):
    args = tiny_args(data_dir, tmp_path / "run", "train.num_iterations=1", "parallel.tensor=2",
                     "parallel.sequence=true")
    proc = run(args, ranks=2)
    assert proc.stdout.count("config: ") == 1 and proc.stdout.count("world 2") == 1, output(proc)
    lines = _startup(proc.stdout)
    changes = [line for line in lines if line.startswith("  ")]
    assert "  parallel.tensor: 2 (default 1)" in changes and "  parallel.sequence: true (default false)" in changes
    assert not [line for line in changes if line.startswith(("  parallel.pipeline", "  parallel.zero_stage",
                                                             "  precision"))], changes
    layout, parameters, data, batch = lines[len(changes) + 1:]
    assert re.fullmatch(r"world 2 = TP2\+SP, fp32, cpu \(mpi, (MPICH|Open MPI) [\d.]+\)", layout), layout
    total, _ = _model_parameters(args)
    held = [int(n.replace(",", "")) for n in re.fullmatch(
        rf"parameters: {total:,} \(all trainable\); per rank ([\d,]+)(?: to ([\d,]+))?", parameters).groups() if n]
    assert all(total / 2 <= n < total for n in held), parameters  # each rank holds its half, and the replicated norms
    assert data.startswith("data: ") and batch.startswith("batch: 128 tokens/step = B4 x T32 x grad_accum 1 x DP1; ")
