"""Range and consistency checks of a run config whose fields passed their type checks: every problem is
collected (key path, what was expected, what was found, a did-you-mean where one fits), none raised."""
from __future__ import annotations

import fnmatch
import os

from ...data.hf_tokenizer import config_problem as hf_config_problem
from ...data.tokenizer import HF_PREFIX, TOKENIZERS
from ...nn.parallel.context_parallel import METHODS as CONTEXT_METHODS
from ...nn.parallel.pipeline_schedules import SCHEDULES, V_SCHEDULES
from .checker import Checker, closest, finite
from .model_checks import check_model

DTYPES = ("float32", "float64")
BACKENDS = ("auto", "mpi", "nccl")
PRECISIONS = ("fp32", "bf16-mixed", "fp16-mixed")
SOURCES = ("stdlib",)
DATA_FORMATS = ("tokens", "text", "chat", "instruction")
SFT_SUFFIXES = (".jsonl", ".sft")  # SFT data: JSONL files, or the shards of prepare_data.py --format chat ...
RECOMPUTE = ("none", "block")
OFFLOAD = ("none", "disk", "host")


def check_ranges(cfg, errors, bad, checker=None):
    """Every range and consistency problem of ``cfg`` appended to ``errors`` (their keys to ``bad``); ``checker``: the
    Checker to use (reference.py passes one that records what each key expects)."""
    c = checker or Checker(cfg, errors, bad)
    for name in ("batch_size", "sequence_length", "num_iterations", "sample_length", "log_every"):
        c.need(f"train.{name}", lambda v: v >= 1, "an integer >= 1")
    for name in ("total_batch_size", "warmup_iters", "val_loss_every", "val_max_steps", "sample_every",
                 "save_every", "keep_last"):
        c.need(f"train.{name}", lambda v: v >= 0, "an integer >= 0 (0 disables)" if name.endswith("every")
               else "an integer >= 0")
    formats = ("auto", "whole", "sharded")
    c.need("train.checkpoint_format", lambda v: v in formats,
           f"one of {formats}{closest(cfg.train.checkpoint_format, formats)}")
    c.need("train.learning_rate", lambda v: finite(v) and v >= 0, "a number >= 0 (0: the weights stay as they are, "
           "as for evaluation-only runs)")
    c.need("train.eps", lambda v: finite(v) and v > 0, "a number > 0")
    c.need("train.weight_decay", lambda v: finite(v) and v >= 0, "a number >= 0")
    c.need("train.grad_clip", lambda v: finite(v) and v >= 0, "a number >= 0 (0 disables clipping)")
    c.need("train.mtp_loss_weight", lambda v: finite(v) and v >= 0, "a number >= 0 (0: MTP modules trained by nothing)")
    c.need("train.peak_flops", lambda v: finite(v) and v >= 0, "a number >= 0 (FLOP/s; 0: the device's known peak)")
    c.need("train.initial_loss_scale", lambda v: finite(v) and v > 0, "a finite number > 0 (e.g. 65536)")
    c.need("train.loss_scale_window", lambda v: v >= 1, "an integer >= 1 (steps without overflow before the scale "
                                                         "doubles)")
    c.need("train.skip_nonfinite", lambda v: v >= 0, "an integer >= 0 (0: stop at the first non-finite step)")
    for name in ("beta1", "beta2"):
        c.need(f"train.{name}", lambda v: 0 <= v < 1, "a number in [0, 1)")
    c.need("train.learning_rate_decay_frac", lambda v: 0 <= v <= 1, "a number in [0, 1]")
    c.need("train.recompute", lambda v: v in RECOMPUTE, f"one of {RECOMPUTE}{closest(cfg.train.recompute, RECOMPUTE)}")
    c.need("train.optimizer_offload", lambda v: v in OFFLOAD,
           f"one of {OFFLOAD}{closest(cfg.train.optimizer_offload, OFFLOAD)}")
    if c.ok("train.optimizer_offload", "device") and cfg.train.optimizer_offload == "host" \
            and cfg.device.startswith("cpu"):
        errors.append(f"train.optimizer_offload: expected 'none' or 'disk' with device {cfg.device!r} (host moves the "
                      "optimizer state from GPU memory to the host's, where a CPU run's already is), got 'host'; HINT: "
                      "set train.optimizer_offload=disk to keep the state in files, or none")
    t = cfg.train
    if c.ok("train.val_loss_every", "train.val_max_steps") and t.val_loss_every and not t.val_max_steps:
        errors.append("train.val_max_steps: expected >= 1 when train.val_loss_every is set, got 0")
    if c.ok("train.batch_size", "train.sequence_length", "train.total_batch_size") and t.total_batch_size:
        per = t.batch_size * t.sequence_length
        if t.total_batch_size % per:
            errors.append(f"train.total_batch_size: expected a multiple of batch_size * sequence_length = "
                          f"{t.batch_size} * {t.sequence_length} = {per} (times grad-accumulation steps and "
                          f"ranks), got {t.total_batch_size}")

    c.need("seed", lambda v: 0 <= v < 2 ** 63, "an integer in [0, 2**63)")
    c.need("out_dir", lambda v: v.strip() != "", "a directory path")
    c.need("dtype", lambda v: v in DTYPES, f"one of {DTYPES}")
    c.need("backend", lambda v: v in BACKENDS, f"one of {BACKENDS}")
    c.need("parallel.zero_stage", lambda v: v in (0, 1, 2, 3),
           "0, 1, 2 or 3 (1: optimizer state sharded, 2: and gradients, 3: and the parameters)")
    c.need("parallel.data_replicate", lambda v: v >= 1, "an integer >= 1 (1: no hybrid sharding)")
    replicate, stage = cfg.parallel.data_replicate, cfg.parallel.zero_stage
    if c.ok("parallel.data_replicate", "parallel.zero_stage") and replicate > 1 and stage != 3:
        errors.append(f"parallel.data_replicate: expected 1 with parallel.zero_stage={stage} (replicas of sharded "
                      f"groups are hybrid sharding, ZeRO-3's), got {replicate}; HINT: set parallel.zero_stage=3, or "
                      "parallel.data_replicate=1")
    _check_parallel(cfg, c, errors)
    c.need("precision", lambda v: v in PRECISIONS, f"one of {PRECISIONS}{closest(cfg.precision, PRECISIONS)}")
    if c.ok("precision", "dtype") and cfg.precision != "fp32" and cfg.dtype != "float32":
        errors.append(f"precision: expected 'fp32' with dtype {cfg.dtype!r} (mixed precision keeps float32 master "
                      f"weights), got {cfg.precision!r}")
    c.need("device", _valid_device, "'auto', 'cpu', 'cpu:N', 'cuda' or 'cuda:N'")
    if c.ok("backend", "device") and cfg.backend == "nccl" and cfg.device.startswith("cpu"):
        errors.append(f"backend: expected 'mpi' or 'auto' with device {cfg.device!r} (NCCL needs GPUs), got 'nccl'")
    _check_lora(cfg, c, errors)
    c.need("numerics.level", lambda v: v in (0, 1, 2),
           "0 (off), 1 (module outputs and gradients) or 2 (every op too)")
    _check_profile(cfg, c, errors)
    _check_data(cfg, c, errors)
    check_model(cfg, c, errors)


def _check_parallel(cfg, c, errors):
    p, t = cfg.parallel, cfg.train
    c.need("parallel.tensor", lambda v: v >= 1, "an integer >= 1")
    c.need("parallel.pipeline", lambda v: v >= 1, "an integer >= 1")
    c.need("parallel.context", lambda v: v >= 1, "an integer >= 1")
    if c.ok("parallel.context", "train.sequence_length") and p.context > 1:
        if t.sequence_length % (2 * p.context):
            errors.append(f"train.sequence_length: expected a multiple of 2 x parallel.context = {2 * p.context} "
                          f"(each context rank holds two of 2 x {p.context} equal chunks of every sequence), got "
                          f"{t.sequence_length}")
        if p.sequence:
            errors.append("parallel.sequence: expected false with parallel.context > 1 (context parallelism already "
                          "splits the sequence; sequence parallelism would split it again over the tensor group)")
    _check_context_method(cfg, c, errors)
    c.need("parallel.expert", lambda v: v >= 1, "an integer >= 1 (1: no expert parallelism)")
    c.need("parallel.virtual_pipeline", lambda v: v >= 1, "an integer >= 1")
    c.need("parallel.pipeline_schedule", lambda v: v in SCHEDULES,
           f"one of {SCHEDULES}{closest(p.pipeline_schedule, SCHEDULES)}")
    if c.ok("parallel.virtual_pipeline", "parallel.pipeline_schedule", "parallel.pipeline"):
        schedule = p.pipeline_schedule
        if schedule == "interleaved" and p.virtual_pipeline < 2:
            errors.append(f"parallel.virtual_pipeline: expected >= 2 with parallel.pipeline_schedule=interleaved "
                          f"(model chunks per stage), got {p.virtual_pipeline}")
        elif schedule in V_SCHEDULES and p.virtual_pipeline != 2:
            errors.append(f"parallel.virtual_pipeline: expected 2 with parallel.pipeline_schedule={schedule} (two "
                          f"model chunks per stage, in a V), got {p.virtual_pipeline}")
        elif p.virtual_pipeline > 1 and schedule != "interleaved" and schedule not in V_SCHEDULES:
            errors.append(f"parallel.virtual_pipeline: expected 1 with parallel.pipeline_schedule={schedule!r} (only "
                          f"interleaved, zbv and dualpipev run several chunks per stage), got {p.virtual_pipeline}")
        elif (schedule == "interleaved" or schedule in V_SCHEDULES) and p.pipeline < 2:
            errors.append(f"parallel.pipeline_schedule: expected parallel.pipeline >= 2 with {schedule}, got "
                          f"parallel.pipeline={p.pipeline}")
    if c.ok("parallel.tensor", "parallel.sequence") and p.sequence and p.tensor == 1:
        errors.append("parallel.sequence: expected parallel.tensor > 1 (sequence parallelism splits the sequence "
                      "over the tensor-parallel group), got parallel.sequence=true with parallel.tensor=1")
    if c.ok("parallel.tensor", "parallel.sequence", "train.sequence_length") and p.sequence \
            and t.sequence_length % p.tensor:
        errors.append(f"train.sequence_length: expected a multiple of parallel.tensor ({p.tensor}) with "
                      f"parallel.sequence=true (each rank holds sequence_length / tensor positions), got "
                      f"{t.sequence_length}")


def _check_context_method(cfg, c, errors):
    """parallel.context_method and parallel.context_a2a (the heads a method needs are checked against the model:
    model_checks.py)."""
    p = cfg.parallel
    c.need("parallel.context_method", lambda v: v in CONTEXT_METHODS,
           f"one of {CONTEXT_METHODS}{closest(p.context_method, CONTEXT_METHODS)}")
    c.need("parallel.context_a2a", lambda v: v >= 1, "an integer >= 1")
    if not c.ok("parallel.context", "parallel.context_method", "parallel.context_a2a"):
        return
    if p.context_method == "hybrid":
        sizes = [d for d in range(2, p.context) if p.context % d == 0]
        if p.context_a2a not in sizes:
            hint = (f"use one of {sizes}" if sizes else "hybrid needs parallel.context with a divisor between 1 and "
                    "itself (4, 6, 8, ...); use parallel.context_method=ring or ulysses")
            errors.append(f"parallel.context_a2a: expected a divisor of parallel.context ({p.context}) greater than 1 "
                          f"and less than it with parallel.context_method=hybrid (all-to-all inside groups of "
                          f"context_a2a consecutive context ranks, ring attention across the groups), got "
                          f"{p.context_a2a}; HINT: {hint}")
            c.bad.add("parallel.context_a2a")
    elif p.context_a2a != 1:
        errors.append(f"parallel.context_a2a: expected 1 with parallel.context_method={p.context_method} (the "
                      f"all-to-all group size of hybrid context parallelism), got {p.context_a2a}; HINT: set "
                      "parallel.context_method=hybrid, or drop parallel.context_a2a")
        c.bad.add("parallel.context_a2a")


def _check_lora(cfg, c, errors):
    lora = cfg.lora
    c.need("lora.rank", lambda v: v >= 0, "an integer >= 0 (0: no LoRA)")
    c.need("lora.alpha", lambda v: finite(v) and v > 0, "a number > 0")
    c.need("lora.dropout", lambda v: 0 <= v < 1, "a number in [0, 1)")
    c.need("lora.target_modules", lambda v: v.strip() != "", "all-linear, module names or a regex")
    c.need("lora.init_from", lambda v: os.path.exists(v), "an existing HF directory, llm.c .bin or checkpoint path")
    if c.ok("lora.rank", "lora.init_from") and lora.rank == 0 and lora.init_from is not None:
        errors.append(f"lora.init_from: the base weights of a LoRA run, used only with lora.rank > 0; got "
                      f"lora.init_from={lora.init_from!r} with lora.rank=0, which would train from scratch; HINT: set "
                      "lora.rank (e.g. 8) to fine-tune adapters on those weights, or drop lora.init_from")
    if c.ok("lora.rank", "parallel.pipeline") and lora.rank > 0 and cfg.parallel.pipeline > 1:
        errors.append(f"lora.rank: LoRA runs with data and tensor parallelism, not pipeline stages; got lora.rank="
                      f"{lora.rank} with parallel.pipeline={cfg.parallel.pipeline}; HINT: set parallel.pipeline=1 "
                      "(adapters are small: tensor or data parallelism covers a LoRA fine-tune)")


def _check_profile(cfg, c, errors):
    prof, t = cfg.profile, cfg.train
    c.need("profile.num_steps", lambda v: v >= 1, "an integer >= 1 (steps profiled from profile.start_step)")
    if c.ok("profile.start_step", "train.num_iterations") and prof.start_step >= t.num_iterations:
        errors.append(f"profile.start_step: expected a step the run trains (0 to train.num_iterations - 1 = "
                      f"{t.num_iterations - 1}) or a negative number (no profiling), got {prof.start_step}; HINT: "
                      f"set profile.start_step={min(5, t.num_iterations - 1)} (after warm-up) or -1")


def _valid_device(dev):
    kind, sep, idx = dev.partition(":")
    return dev == "auto" or (kind in ("cpu", "cuda") and (not sep or idx.isdigit()))


def _check_data_format(cfg, c, errors):
    """data.format against the files data.train / data.val name: token shards for tokens, .jsonl files or .sft
    shards for the SFT formats; False when the format is not tokens (the default corpus's checks then do not apply)."""
    d = cfg.data
    c.need("data.format", lambda v: v in DATA_FORMATS, f"one of {DATA_FORMATS}{closest(d.format, DATA_FORMATS)}")
    if not c.ok("data.format"):
        return False
    for key in ("data.train", "data.val"):
        pattern = c.value(key)
        if not c.ok(key) or not pattern or not pattern.strip():
            continue
        sft_files = pattern.rstrip().endswith(SFT_SUFFIXES)
        if d.format == "tokens" and (sft_files or pattern.rstrip().endswith(".json")):
            errors.append(f"{key}: expected llm.c token shards (.bin) with data.format=tokens, got {pattern!r}; HINT: "
                          "for JSONL samples set data.format=chat | instruction | text (their fields decide which)")
            c.bad.add(key)
        elif d.format != "tokens" and not sft_files:
            errors.append(f"{key}: expected .jsonl file(s) or .sft shards (examples/gpt2/prepare_data.py --format "
                          f"{d.format}) with data.format={d.format}, got {pattern!r}; HINT: token shards (.bin) are "
                          "data.format=tokens")
            c.bad.add(key)
    if d.format == "tokens":
        return True
    if c.ok("data.source") and d.source is not None:
        errors.append(f"data.source: expected null with data.format={d.format} (the default corpus is token shards, "
                      f"built only for data.format=tokens), got {d.source!r}; HINT: add data.source=null")
    if c.ok("parallel.context") and cfg.parallel.context > 1:
        errors.append(f"parallel.context: expected 1 with data.format={d.format} (a row of samples attends within "
                      "each sample; ring attention splits whole causal sequences only), got "
                      f"{cfg.parallel.context}; HINT: use data, tensor or pipeline parallelism for fine-tuning")
    return False


def _check_tokenizer(name, c, errors):
    """byte | gpt2 | auto, or hf:PATH naming a Hugging Face tokenizer that is there (its files are read later)."""
    if not c.ok("data.tokenizer"):
        return
    if name.startswith(HF_PREFIX):
        problem = hf_config_problem(name[len(HF_PREFIX):])
        if problem:
            errors.append(f"data.tokenizer: {problem[0]}; HINT: {problem[1]}")
            c.bad.add("data.tokenizer")
        return
    if name not in TOKENIZERS:
        near = (f" (did you mean 'hf:{name}'?)" if name and os.path.exists(os.path.expanduser(name))
                else closest(name, TOKENIZERS))
        errors.append(f"data.tokenizer: expected one of {TOKENIZERS} or hf:PATH (a Hugging Face model directory or its "
                      f"tokenizer.json), got {name!r}{near}")
        c.bad.add("data.tokenizer")


def _check_data(cfg, c, errors):
    d = cfg.data
    _check_tokenizer(d.tokenizer, c, errors)
    c.need("data.source", lambda v: v in SOURCES, f"one of {SOURCES} or null")
    c.need("data.max_corpus_bytes", lambda v: v >= 1, "an integer >= 1")
    c.need("data.train", lambda v: v.strip() != "", "a glob of token shards")
    if not _check_data_format(cfg, c, errors):
        return
    if not c.ok("data.source", "data.train", "data.val") or d.source != "stdlib":
        return
    # the default corpus is written as <dir>/train_000000.bin ... and <dir>/val_000000.bin
    train_name = os.path.basename(d.train)
    if not fnmatch.fnmatch("train_000000.bin", train_name) or fnmatch.fnmatch("val_000000.bin", train_name):
        errors.append(f"data.train: expected a pattern matching the default corpus's train_NNNNNN.bin (and not "
                      f"val_NNNNNN.bin) with data.source=stdlib, got {d.train!r}; use <dir>/train_*.bin, or "
                      "data.source=null for shards of your own")
    elif d.val:
        val_name = os.path.basename(d.val)
        if os.path.dirname(d.val) != os.path.dirname(d.train):
            errors.append(f"data.val: expected the directory of data.train ({os.path.dirname(d.train) or '.'!r}) "
                          f"with data.source=stdlib, got {d.val!r}")
        elif not fnmatch.fnmatch("val_000000.bin", val_name) or fnmatch.fnmatch("train_000000.bin", val_name):
            errors.append(f"data.val: expected a pattern matching the default corpus's val_NNNNNN.bin (and not "
                          f"train_NNNNNN.bin) with data.source=stdlib, got {d.val!r}; use <dir>/val_*.bin")


def backend_problem(cfg):
    """The config error of ``backend: nccl`` on a rank that has no GPU (or no CuPy), or None. Checked where the ranks
    agree on their configs, before the world starts, so that it is printed once and no rank starts a process group
    that cannot form."""
    if cfg.backend != "nccl" or cfg.device.startswith("cpu"):  # (nccl with device cpu is check_ranges' error)
        return None
    from ...backend import cuda_available

    if cuda_available():
        return None
    return ("invalid run configuration, 1 problem:\n  backend: expected 'auto' or 'mpi' on ranks without a GPU "
            f"(NCCL runs between GPUs; this rank has no GPU CuPy can use), got 'nccl' with device {cfg.device!r}; "
            "HINT: set backend=auto (NCCL where every rank has a GPU, else MPI) or backend=mpi")
