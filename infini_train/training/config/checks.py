"""Range and consistency checks of a run config whose fields passed their type checks: every problem is
collected (key path, what was expected, what was found, a did-you-mean where one fits), none raised."""
from __future__ import annotations

import difflib
import fnmatch
import math
import os
import re

from ...data.hf_tokenizer import config_problem as hf_config_problem
from ...data.tokenizer import HF_PREFIX
from ...models.registry import ARCHS, model_spec
from .model import MOE_ARCHS

DTYPES = ("float32", "float64")
TOKENIZERS = ("byte", "gpt2", "auto")
TOKENIZER_VOCAB = {"byte": 257, "gpt2": 50257}  # smallest model vocab_size each tokenizer needs
BACKENDS = ("auto", "mpi", "nccl")
PRECISIONS = ("fp32", "bf16-mixed", "fp16-mixed")
SOURCES = ("stdlib",)
DATA_FORMATS = ("tokens", "text", "chat", "instruction")
SFT_SUFFIXES = (".jsonl", ".sft")  # SFT data: JSONL files, or the shards of prepare_data.py --format chat ...
SCHEDULES = ("gpipe", "1f1b", "interleaved")
RECOMPUTE = ("none", "block")


class _Checker:
    """Range checks on fields that passed the type checks."""

    def __init__(self, cfg, errors, bad):
        self.cfg, self.errors, self.bad = cfg, errors, bad

    def value(self, path):
        node = self.cfg
        for part in path.split("."):
            node = getattr(node, part)
        return node

    def ok(self, *paths):
        return not any(p in self.bad or p.split(".")[0] in self.bad for p in paths)

    def need(self, path, predicate, expected):
        if not self.ok(path):
            return
        value = self.value(path)
        if value is None:
            return
        if not predicate(value):
            self.errors.append(f"{path}: expected {expected}, got {value!r}")
            self.bad.add(path)


def _closest(value, choices):
    """ " (did you mean 'bf16-mixed'?)" for a misspelt choice, or ""."""
    close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.4)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _finite(v):
    return math.isfinite(v)


def check_ranges(cfg, errors, bad):
    from ...models.gpt2.config import GPT2_PRESETS

    c = _Checker(cfg, errors, bad)
    for name in ("batch_size", "sequence_length", "num_iterations", "sample_length", "log_every"):
        c.need(f"train.{name}", lambda v: v >= 1, "an integer >= 1")
    for name in ("total_batch_size", "warmup_iters", "val_loss_every", "val_max_steps", "sample_every",
                 "save_every", "keep_last"):
        c.need(f"train.{name}", lambda v: v >= 0, "an integer >= 0 (0 disables)" if name.endswith("every")
               else "an integer >= 0")
    formats = ("auto", "whole", "sharded")
    c.need("train.checkpoint_format", lambda v: v in formats,
           f"one of {formats}{_closest(cfg.train.checkpoint_format, formats)}")
    c.need("train.learning_rate", lambda v: _finite(v) and v >= 0, "a number >= 0 (0: the weights stay as they are, "
           "as for evaluation-only runs)")
    c.need("train.eps", lambda v: _finite(v) and v > 0, "a number > 0")
    c.need("train.weight_decay", lambda v: _finite(v) and v >= 0, "a number >= 0")
    c.need("train.grad_clip", lambda v: _finite(v) and v >= 0, "a number >= 0 (0 disables clipping)")
    c.need("train.peak_flops", lambda v: _finite(v) and v >= 0, "a number >= 0 (FLOP/s; 0: the device's known peak)")
    c.need("train.initial_loss_scale", lambda v: _finite(v) and v > 0, "a finite number > 0 (e.g. 65536)")
    c.need("train.loss_scale_window", lambda v: v >= 1, "an integer >= 1 (steps without overflow before the scale "
                                                         "doubles)")
    c.need("train.skip_nonfinite", lambda v: v >= 0, "an integer >= 0 (0: stop at the first non-finite step)")
    for name in ("beta1", "beta2"):
        c.need(f"train.{name}", lambda v: 0 <= v < 1, "a number in [0, 1)")
    c.need("train.learning_rate_decay_frac", lambda v: 0 <= v <= 1, "a number in [0, 1]")
    c.need("train.recompute", lambda v: v in RECOMPUTE, f"one of {RECOMPUTE}{_closest(cfg.train.recompute, RECOMPUTE)}")
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
    _check_parallel(cfg, c, errors)
    c.need("precision", lambda v: v in PRECISIONS, f"one of {PRECISIONS}{_closest(cfg.precision, PRECISIONS)}")
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
    _check_model(cfg, c, errors, GPT2_PRESETS)


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
    c.need("parallel.expert", lambda v: v >= 1, "an integer >= 1 (1: no expert parallelism)")
    c.need("parallel.virtual_pipeline", lambda v: v >= 1, "an integer >= 1")
    c.need("parallel.pipeline_schedule", lambda v: v in SCHEDULES,
           f"one of {SCHEDULES}{_closest(p.pipeline_schedule, SCHEDULES)}")
    if c.ok("parallel.virtual_pipeline", "parallel.pipeline_schedule", "parallel.pipeline"):
        if p.pipeline_schedule == "interleaved" and p.virtual_pipeline < 2:
            errors.append(f"parallel.virtual_pipeline: expected >= 2 with parallel.pipeline_schedule=interleaved "
                          f"(model chunks per stage), got {p.virtual_pipeline}")
        elif p.virtual_pipeline > 1 and p.pipeline_schedule != "interleaved":
            errors.append(f"parallel.virtual_pipeline: expected 1 with parallel.pipeline_schedule="
                          f"{p.pipeline_schedule!r} (only interleaved runs several chunks per stage), got "
                          f"{p.virtual_pipeline}")
        elif p.pipeline_schedule == "interleaved" and p.pipeline < 2:
            errors.append("parallel.pipeline_schedule: expected parallel.pipeline >= 2 with interleaved, got "
                          f"parallel.pipeline={p.pipeline}")
    if c.ok("parallel.tensor", "parallel.sequence") and p.sequence and p.tensor == 1:
        errors.append("parallel.sequence: expected parallel.tensor > 1 (sequence parallelism splits the sequence "
                      "over the tensor-parallel group), got parallel.sequence=true with parallel.tensor=1")
    if c.ok("parallel.tensor", "parallel.sequence", "train.sequence_length") and p.sequence \
            and t.sequence_length % p.tensor:
        errors.append(f"train.sequence_length: expected a multiple of parallel.tensor ({p.tensor}) with "
                      f"parallel.sequence=true (each rank holds sequence_length / tensor positions), got "
                      f"{t.sequence_length}")


def _check_lora(cfg, c, errors):
    lora = cfg.lora
    c.need("lora.rank", lambda v: v >= 0, "an integer >= 0 (0: no LoRA)")
    c.need("lora.alpha", lambda v: _finite(v) and v > 0, "a number > 0")
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
    c.need("data.format", lambda v: v in DATA_FORMATS, f"one of {DATA_FORMATS}{_closest(d.format, DATA_FORMATS)}")
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
                else _closest(name, TOKENIZERS))
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


def _check_model(cfg, c, errors, gpt2_presets):
    m = cfg.model
    c.need("model.arch", lambda v: v in ARCHS, f"one of {ARCHS}{_closest(m.arch, ARCHS)}")
    if not c.ok("model.arch"):
        return
    if m.pretrained is not None:
        model = _pretrained_model(m, c, errors)
        if model is None:
            return
        _check_model_run(cfg, c, errors, model)
        return
    llama = m.arch != "gpt2"  # LLaMA or a model on its blocks
    for name, value, archs in m.foreign_keys():
        errors.append(f"model.{name}: only for model.arch={' | '.join(archs)}, got {value!r} with model.arch="
                      f"{m.arch}; HINT: set model.arch={archs[0]}, or drop the key")
    if m.arch not in ("gpt2", "llama3") and c.ok("model.bias") and m.bias:
        errors.append(f"model.bias: expected false or null for model.arch={m.arch} (its linear layers have no "
                      "biases, as the released models), got True; HINT: drop the key")
        c.bad.add("model.bias")
    for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd", "n_kv_head", "intermediate_size",
                 "rope_original_context", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                 "decoder_sparse_step"):
        c.need(f"model.{name}", lambda v: v >= 1, "an integer >= 1")
    c.need("model.head_dim", lambda v: v >= 2 and v % 2 == 0, "an even integer >= 2 (rotary embeddings rotate pairs)")
    c.need("model.mlp_only_layers", lambda v: all(i >= 0 for i in v), "a list of layer indices >= 0")
    c.need("model.router_aux_loss_coef", lambda v: _finite(v) and v >= 0, "a number >= 0 (0: no load-balancing loss)")
    for name in ("rope_theta", "rms_norm_eps", "rope_low_freq_factor", "rope_high_freq_factor"):
        c.need(f"model.{name}", lambda v: _finite(v) and v > 0, "a number > 0")
    c.need("model.rope_scaling_factor", lambda v: _finite(v) and v >= 0, "a number >= 0 (0: no scaling)")
    c.need("model.dropout", lambda v: 0 <= v < 1, "a number in [0, 1)")
    presets = m.presets() if llama else gpt2_presets
    if c.ok("model.preset") and m.preset is not None and m.preset not in presets:
        close = difflib.get_close_matches(m.preset, presets, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        errors.append(f"model.preset: expected one of {sorted(presets)} (model.arch={m.arch}) or null, got "
                      f"{m.preset!r}{hint}")
        return
    if llama and m.foreign_keys():  # (GPT-2 ignores LLaMA's keys when it builds)
        return
    names = ["model.preset"] + [f"model.{f}" for f in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd",
                                                       "dropout", "bias") + m.LLAMA_ONLY]
    if not c.ok(*names):
        return
    if not llama:
        shape = {**(presets[m.preset] if m.preset else {}), **m.overrides()}
        n_embd, n_head = shape.get("n_embd", 768), shape.get("n_head", 12)
        if n_embd % n_head:
            key = "model.n_head" if m.n_head is not None or m.n_embd is None else "model.n_embd"
            errors.append(f"{key}: expected n_embd ({n_embd}) divisible by n_head ({n_head}), got n_embd % n_head "
                          f"= {n_embd % n_head}")
            return
    try:
        model = m.to_model_config()
    except (ValueError, TypeError) as exc:
        errors.append(_model_error(m, exc))
        return
    scaling = model.rope_scaling if llama else None
    if scaling and scaling["original_max_position_embeddings"] >= model.max_seq_len:
        key = "model.rope_original_context" if m.rope_original_context is not None else "model.block_size"
        errors.append(f"{key}: expected rope_original_context ({scaling['original_max_position_embeddings']}) < "
                      f"block_size ({model.max_seq_len}) with llama3 rope scaling (it rescales the frequencies "
                      "beyond the original context, and Hugging Face transformers rejects such a config), got both; "
                      "HINT: set model.rope_original_context below block_size, model.rope_scaling_factor=0 for no "
                      "scaling, or keep the preset's block_size and shorten train.sequence_length instead")
    _check_model_run(cfg, c, errors, model)


def _pretrained_model(m, c, errors):
    """The config of ``model.pretrained`` (None after an error): it exists and is readable, its arch is model.arch,
    and no other model key but dropout is given (its own config decides them)."""
    from ...models.pretrained import pretrained_config

    try:
        arch, _ = pretrained_config(m.pretrained)
        model = m.to_model_config()
    except (OSError, ValueError, KeyError, TypeError) as exc:
        reason = " ".join(str(exc).split("\nHINT: ", 1)[0].split())
        errors.append(f"model.pretrained: expected an HF model directory or an llm.c .bin file, got "
                      f"{m.pretrained!r} ({reason})")
        c.bad.add("model.pretrained")
        return None
    if m.arch != arch:
        errors.append(f"model.arch: expected {arch!r} (the arch of model.pretrained {m.pretrained!r}), got "
                      f"{m.arch!r}; HINT: drop model.arch, it comes from the pretrained model")
        return None
    given = m.shape_keys_given()
    if given:
        errors.append(f"model.{given[0]}: expected no value with model.pretrained (the pretrained model's config "
                      f"decides {', '.join(given)}), got {getattr(m, given[0])!r}; HINT: drop the key, or drop "
                      "model.pretrained to build a model of your own shape")
        return None
    return model


def _check_model_run(cfg, c, errors, model):
    """What the run's layout and settings ask of the resolved model config ``model``."""
    m, t = cfg.model, cfg.train
    if m.arch in MOE_ARCHS:
        _check_moe_run(cfg, c, errors, model)
        _check_expert_parallel(cfg, c, errors, model)
    elif c.ok("parallel.expert") and cfg.parallel.expert > 1:
        errors.append(f"parallel.expert: expected 1 for model.arch={m.arch} (expert parallelism splits the experts of "
                      f"a mixture-of-experts model; this model has none), got {cfg.parallel.expert}; HINT: set "
                      f"parallel.expert=1, or model.arch={' | '.join(MOE_ARCHS)}")
    _check_model_parallel(cfg, c, errors, model)
    if c.ok("train.sequence_length") and t.sequence_length > model.context_length:
        errors.append(f"train.sequence_length: expected <= model block_size ({model.context_length}), "
                      f"got {t.sequence_length}")
    need = _tokenizer_vocab(cfg.data.tokenizer, c, errors) if c.ok("data.tokenizer") else None
    if need and model.vocab_size < need:
        hint = "" if cfg.data.tokenizer in TOKENIZER_VOCAB else (
            f"; HINT: set model.vocab_size={-(-need // 64) * 64} (>= {need}; a multiple of 64 runs faster), or use "
            "the tokenizer the model was made for")
        errors.append(f"model.vocab_size: expected >= {need} for data.tokenizer {cfg.data.tokenizer!r}, "
                      f"got {model.vocab_size}{hint}")


def _tokenizer_vocab(name, c, errors):
    """The number of token ids ``name`` produces (byte, gpt2, or an hf:PATH tokenizer read here, so that a tokenizer
    larger than the model's vocabulary stops the run before it starts, not at the first sample holding a large id);
    None when it is not known before the run (auto)."""
    if not name.startswith(HF_PREFIX):
        return TOKENIZER_VOCAB.get(name)
    from ...data.hf_tokenizer import HFTokenizerError
    from ...data.tokenizer import get_tokenizer

    try:
        return get_tokenizer(name).vocab_size
    except HFTokenizerError as exc:
        errors.append(f"data.tokenizer: {str(exc).partition(chr(10))[0]}; HINT: {exc.hint or 'check its files'}")
        c.bad.add("data.tokenizer")
        return None


def _model_error(m, exc):
    """A model config class's ValueError as a config error on the key it is about: 'Qwen3MoeConfig.num_experts_per_tok:
    ...' -> 'model.num_experts_per_tok: ...'."""
    text = " ".join(str(exc).split())
    match = re.match(r"\w+Config\.(\w+): (.*)", text)
    if match:
        ours = {v: k for k, v in m.LLAMA_NAMES.items() if isinstance(v, str)}.get(match[1], match[1])
        return f"model.{ours}: {match[2]}"
    if re.match(r"\w+MoeConfig: no layer is sparse", text):
        return f"model.decoder_sparse_step: {text.partition(': ')[2]}"
    return f"model: {text}"


def _check_moe_run(cfg, c, errors, model):
    """What a run of a mixture-of-experts model cannot do yet, refused before anything is built (tensor and pipeline
    parallelism are the model spec's layout problems)."""
    arch = cfg.model.arch
    layers = cfg.model.mlp_only_layers or []
    if c.ok("model.mlp_only_layers") and any(i >= model.n_layers for i in layers):
        errors.append(f"model.mlp_only_layers: expected layer indices below n_layer ({model.n_layers}), got "
                      f"{layers}")
    if c.ok("train.recompute") and cfg.train.recompute != "none":
        errors.append(f"train.recompute: expected 'none' for model.arch={arch} (the auxiliary loss reads every MoE "
                      f"layer's router logits from the forward; recomputing blocks is not supported for MoE models "
                      f"yet), got {cfg.train.recompute!r}; HINT: set train.recompute=none")
    if c.ok("parallel.context") and cfg.parallel.context > 1:
        errors.append(f"parallel.context: expected 1 for model.arch={arch} (each context rank would route only its "
                      f"chunks of the sequence, so the load-balancing loss would not be the one-process run's; not "
                      f"supported for MoE models yet), got {cfg.parallel.context}; HINT: use data parallelism")
    p = cfg.parallel
    if c.ok("parallel.zero_stage", "parallel.expert") and p.zero_stage == 3 and p.expert > 1:
        errors.append(f"parallel.zero_stage: expected 0, 1 or 2 with parallel.expert={p.expert} (ZeRO-3 shards each "
                      "block's parameters over the data-parallel group, whose ranks hold different experts; sharding "
                      "the experts over their expert-data group instead is not supported yet), got 3; HINT: use "
                      "parallel.zero_stage=2 (the experts' optimizer state is sharded over the expert-data group)")
    if c.ok("parallel.zero_stage", "parallel.tensor") and p.zero_stage == 3 and p.tensor > 1:
        errors.append(f"parallel.zero_stage: expected 0, 1 or 2 with parallel.tensor={p.tensor} for model.arch={arch} "
                      "(fully_shard's shards of the experts would have to agree over the tensor group on the experts "
                      "no token reached; not supported yet), got 3; HINT: use parallel.zero_stage=2")
    lora = cfg.lora
    if c.ok("lora.rank", "lora.target_modules") and lora.rank > 0:
        targets = lora.targets()
        expert_names = ["model.layers.0.mlp.experts.0.gate_proj", "model.layers.0.mlp.experts.0.up_proj",
                        "model.layers.0.mlp.experts.0.down_proj", "model.layers.0.mlp.gate"]
        from ...nn.lora import matches_target

        if targets == "all-linear" or any(matches_target(n, targets) for n in expert_names):
            errors.append(f"lora.target_modules: expected modules outside the experts and routers for model.arch="
                          f"{arch} (LoRA on experts is not supported yet), got {lora.target_modules!r}; HINT: set "
                          "lora.target_modules=q_proj,k_proj,v_proj,o_proj (the attention layers)")


def _check_expert_parallel(cfg, c, errors, model):
    """``parallel.expert`` of a mixture-of-experts run: a divisor of num_experts (that it divides the data-parallel
    size is checked when the run knows its world). What MoE runs refuse whatever the expert size (and ZeRO-3 with
    experts split) is _check_moe_run's and the model spec's."""
    e = cfg.parallel.expert
    if not c.ok("parallel.expert") or e == 1:
        return
    if model.num_experts % e:
        divisors = [d for d in range(1, model.num_experts + 1) if model.num_experts % d == 0]
        errors.append(f"parallel.expert: expected a divisor of model.num_experts ({model.num_experts}: each rank of "
                      f"an expert group keeps num_experts / expert of them), got {e}; HINT: choose parallel.expert "
                      f"among {divisors}")
    if c.ok("lora.rank") and cfg.lora.rank > 0:
        errors.append(f"lora.rank: expected 0 with parallel.expert={e} (LoRA runs with expert parallelism are not "
                      f"supported yet), got {cfg.lora.rank}; HINT: set parallel.expert=1 for a LoRA fine-tune")
    split = [f"parallel.{key}={getattr(cfg.parallel, key)}" for key in ("pipeline", "tensor")
             if c.ok(f"parallel.{key}") and getattr(cfg.parallel, key) > 1]
    if c.ok("train.checkpoint_format") and cfg.train.checkpoint_format == "whole" and split:
        errors.append(f"train.checkpoint_format: expected 'sharded' or 'auto' with parallel.expert={e} and "
                      f"{' and '.join(split)} (each rank writes its experts and its part of the rest; the whole format "
                      "gathers experts over data-parallel ranks only), got 'whole'; HINT: set "
                      "train.checkpoint_format=auto -- a sharded checkpoint resumes under any layout, one process "
                      "included")


def _check_model_parallel(cfg, c, errors, model):
    """The model's own shape-vs-layout checks (its ModelSpec's validate), on the settings that are valid."""
    p = cfg.parallel
    pipeline_ok, tensor_ok = c.ok("parallel.pipeline", "parallel.virtual_pipeline"), c.ok("parallel.tensor")
    errors.extend(model_spec(cfg.model.arch).validate(model, p.tensor if tensor_ok else 1,
                                                      p.pipeline if pipeline_ok else 1,
                                                      p.virtual_pipeline if pipeline_ok else 1))
    arch = cfg.model.arch
    if arch in ("qwen3", "qwen3_moe") and tensor_ok and c.ok("parallel.sequence") and p.tensor > 1 and not p.sequence:
        errors.append(f"parallel.sequence: expected true for model.arch={arch} with parallel.tensor={p.tensor} (the "
                      "gradients of the per-head q_norm / k_norm weights are partial sums over the tensor group, which "
                      "the sequence-parallel gradient sum completes), got false; HINT: add parallel.sequence=true")


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
