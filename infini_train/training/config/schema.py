"""Run configuration: typed dataclasses read from YAML plus dotted command-line overrides, validated before
any work starts. Training keys follow the flags of llm.c's train_gpt2 (batch_size = -b, sequence_length = -t,
total_batch_size = -d, learning_rate = -l, warmup_iters = -u, learning_rate_decay_frac = -q, ...).

    cfg = load_config("configs/gpt2_tiny.yaml", ["train.learning_rate=3e-4", "out_dir=runs/x"])
    cfg = parse_args(sys.argv[1:])           # train.py [--config FILE] [dotted.key=value ...]
    grad_accum = cfg.train.grad_accum_steps(world_size)   # raises ConfigError when it does not divide
    gpt2_config = cfg.model.to_gpt2_config()
    cfg.save_resolved()                      # out_dir/config.yaml, loadable with load_config
    print(cfg.pretty())

Every problem (unknown key, wrong type, out-of-range value, inconsistent values) is reported at once in
one ConfigError, one line each, naming the dotted key, what was expected and what was found, with the
nearest valid key for a misspelt one. In every periodic setting (``*_every``) 0 disables the action.

Command-line values are YAML, except that a text setting (out_dir, data.train, ...) takes the text as written
(``out_dir=0755`` is '0755'; null spellings are null, and ``out_dir="'null'"`` is the word); in YAML files such a
setting keeps its text when YAML would read it as a number or date. A mapping merges into its section key by key,
as in Hydra: ``'model={n_layer: 2, n_head: 2}'`` keeps the config file's other model keys.

This module holds the schema, its validation and the entry points; reading YAML strictly and applying the
command-line overrides to the raw dict is in .yaml_io.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import difflib
import glob
import os
import typing
from dataclasses import dataclass, field
from typing import Optional

import yaml

from ...data.tokenizer import HF_PREFIX, hf_name
from .checks import (BACKENDS, DTYPES, PRECISIONS, SOURCES, TOKENIZER_VOCAB,  # noqa: F401 (re-exported)
                            TOKENIZERS, check_ranges)
from .model import ModelConfig, _key
from .yaml_io import apply_overrides, load_yaml
from .yaml_io import merge as _merge  # noqa: F401  (callers and tests use config._merge)
from .yaml_io import parse_value as parse_value  # re-exported: part of this module's interface

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DEFAULT_CONFIG = "configs/gpt2_tiny.yaml"
class ConfigError(ValueError):
    """An invalid run configuration; ``errors`` holds one line per problem."""

    def __init__(self, message, errors=()):
        super().__init__(message)
        self.errors = list(errors)


@dataclass
class DataConfig:
    """Token shards (llm.c format). With ``source: stdlib`` the default corpus (Python's standard library
    sources) is built into data.train's directory on first use (infini_train.data.corpus.ensure_default_data);
    with ``source: null`` the shards must exist. ``format`` text | chat | instruction reads supervised fine-tuning
    samples instead: .jsonl files, or the .sft shards of prepare_data.py (infini_train.data.sft_loader)."""

    train: str = _key("data/stdlib_byte/train_*.bin", "glob of training shards (.bin; SFT formats: .jsonl or .sft)")
    val: Optional[str] = _key("data/stdlib_byte/val_*.bin", "glob of validation shards (null: no validation)")
    tokenizer: str = _key("byte", "byte | gpt2 | auto (gpt2 when available offline, else byte) | hf:PATH (a Hugging "
                               "Face model directory or its tokenizer.json)")
    source: Optional[str] = _key("stdlib", "build the default corpus when data.train matches nothing (null: never)")
    max_corpus_bytes: int = _key(4_000_000, "size cap of the default corpus")
    format: str = _key("tokens", "tokens (llm.c token shards) | text | chat | instruction (JSONL samples or their "
                                 ".sft shards, for fine-tuning)")
    packing: bool = _key(True, "SFT formats: pack whole samples into each row (false: one sample per row, padded)")
    train_on_prompt: bool = _key(False, "SFT formats: train on every token, not only the assistant turns")

    def __post_init__(self):
        # hf:PATH made absolute: the shards' meta.json, checkpoints and the saved config name one tokenizer wherever
        # a run, a resume or generate.py starts
        if isinstance(self.tokenizer, str) and self.tokenizer.startswith(HF_PREFIX):
            self.tokenizer = hf_name(self.tokenizer[len(HF_PREFIX):])


@dataclass
class TrainConfig:
    """Optimisation and the periodic actions; names follow llm.c's train_gpt2 flags."""

    batch_size: int = _key(8, "B: sequences per micro-batch per rank (-b)")
    sequence_length: int = _key(64, "T (-t), at most model block_size")
    total_batch_size: int = _key(0, "tokens per optimizer step (-d) = B*T*grad_accum*world_size; 0: B*T*world_size")
    num_iterations: int = _key(100, "optimizer steps (-x)")
    learning_rate: float = _key(1e-3, "peak lr (-l)")
    warmup_iters: int = _key(0, "linear warmup steps (-u)")
    learning_rate_decay_frac: float = _key(0.0, "final lr as a fraction of the peak (-q)")
    weight_decay: float = _key(0.0, "AdamW decoupled weight decay on 2-D weights (-c)")
    beta1: float = _key(0.9, "AdamW beta1")
    beta2: float = _key(0.95, "AdamW beta2")
    eps: float = _key(1e-8, "AdamW epsilon")
    grad_clip: float = _key(1.0, "max global grad norm; 0 disables clipping")
    peak_flops: float = _key(0.0, "peak FLOP/s of one device (a GPU, or one host's CPU cores) that MFU divides by; 0: "
                                  "the GPU's datasheet peak for the run's precision, or the CPU's vector peak")
    initial_loss_scale: float = _key(65536.0, "fp16-mixed: the GradScaler's first loss scale (a checkpoint's scale "
                                              "wins on resume)")
    loss_scale_window: int = _key(2000, "fp16-mixed: steps without overflow before the loss scale doubles")
    skip_nonfinite: int = _key(0, "skip up to K consecutive optimizer steps whose loss or gradient norm is not "
                                  "finite (0: stop the run at the first one)")
    val_loss_every: int = _key(0, "steps between validation passes (-v); 0 disables")
    val_max_steps: int = _key(20, "batches of batch_size sequences per validation pass, shared by the data-parallel "
                                  "ranks (-m)")
    sample_every: int = _key(0, "steps between generated samples (-s); 0 disables")
    sample_length: int = _key(64, "tokens per sample (-g)")
    save_every: int = _key(0, "steps between checkpoints (-n); 0: only the final one")
    keep_last: int = _key(3, "checkpoints kept on disk; 0 keeps all")
    checkpoint_format: str = _key("auto", "auto (sharded with several ranks, whole in one process) | whole "
                                          "(one-process files, gathered on rank 0) | sharded (every rank writes its "
                                          "own shard, no gather; loads under any layout)")
    log_every: int = _key(1, "steps between printed lines (metrics.jsonl gets every step)")
    overfit_single_batch: bool = _key(False, "train on the first batch over and over (a debugging aid, -f)")
    recompute: str = _key("none", "none | block: recompute each transformer block's activations in backward (less "
                                  "memory for about one more forward)")

    def grad_accum_steps(self, world_size=1):
        """Micro-batches per optimizer step: total_batch_size / (B * T * world_size); a ConfigError if it
        does not divide. Call at run start, once the world size is known."""
        per_step = self.batch_size * self.sequence_length * world_size
        total = self.total_batch_size or per_step
        if total % per_step:
            lower = max(total // per_step, 1) * per_step
            span = self.sequence_length * world_size
            rows = total // span if total % span == 0 else 0  # sequences per rank and step, when whole
            fits = max((b for b in range(1, min(rows, self.batch_size) + 1) if rows % b == 0), default=None)
            steps = rows // fits if fits else 0
            batch = (f", or train.batch_size={fits} (the same total in {steps} micro-batch{'es' if steps > 1 else ''})"
                     if fits else "")
            raise ConfigError(
                f"train.total_batch_size: expected a multiple of batch_size * sequence_length * world_size = "
                f"{self.batch_size} * {self.sequence_length} * {world_size} = {per_step}, got {total}\n"
                f"HINT: set train.total_batch_size={lower} (or {lower + per_step}){batch}, or change batch_size / "
                "the number of ranks")
        return total // per_step


@dataclass
class ParallelConfig:
    """How the ranks of a job share the work: world = pipeline x data-parallel x tensor ranks, laid out
    tensor-fastest, then data, then pipeline (ranks 0..tensor-1 form the first tensor-parallel group; rank =
    pp_rank * (DP * TP) + dp_rank * TP + tp_rank); the data-parallel size is world / (tensor x pipeline)."""

    tensor: int = _key(1, "tensor-parallel size: attention heads, MLP and vocabulary split over this many ranks")
    context: int = _key(1, "context-parallel size: each sequence split over this many ranks (ring attention; "
                           "load-balanced causal chunks)")
    sequence: bool = _key(False, "sequence parallelism: layer norms and dropout on slices of the sequence "
                                 "(needs tensor > 1)")
    pipeline: int = _key(1, "pipeline stages: the layers split into this many consecutive parts, one per rank")
    virtual_pipeline: int = _key(1, "model chunks per pipeline stage (> 1 with pipeline_schedule=interleaved)")
    pipeline_schedule: str = _key("1f1b", "gpipe | 1f1b | interleaved; micro-batches are the gradient-accumulation "
                                          "steps")
    expert: int = _key(1, "expert-parallel size (qwen3_moe | mixtral): each MoE layer's experts split over groups of "
                          "this many data-parallel ranks (tokens exchanged all-to-all); divides the data-parallel "
                          "size and num_experts")
    zero_stage: int = _key(0, "0: DDP (every rank keeps the whole optimizer state); 1: optimizer state sharded "
                              "across ranks (ZeroRedundancyOptimizer); 2: gradients sharded too; 3: parameters "
                              "sharded too, gathered per block while it runs (fully_shard)")


@dataclass
class LoraConfig:
    """LoRA fine-tuning: low-rank adapters on the target linear layers, every other weight frozen (rank 0: off).
    Checkpoints of such a run hold the adapters and a reference to the base weights; the end of the run also
    writes the adapters in PEFT's format to out_dir/adapter."""

    rank: int = _key(0, "adapter rank r (0: no LoRA, train every weight)")
    alpha: float = _key(16.0, "scaling numerator: adapters add B A x * alpha / rank")
    dropout: float = _key(0.0, "dropout on the adapters' input")
    target_modules: str = _key("all-linear", "all-linear (every linear layer but the output layer), or comma-"
                                             "separated module names (c_attn,c_proj / q_proj,v_proj; or a YAML list "
                                             "[c_attn, c_proj]), or a regex")
    init_from: Optional[str] = _key(None, "base weights: an HF directory (GPT-2 / LLaMA), an llm.c .bin, or a "
                                          "training checkpoint (step dir or out_dir); null: the seeded init")

    LISTS_AS_TEXT = ("target_modules",)  # a YAML list of names, in a file or on the command line: their text

    def targets(self):
        """target_modules as apply_lora takes it: "all-linear", a regex string, or a list of names."""
        text = self.target_modules.strip()
        if text == "all-linear" or any(ch in text for ch in "*()[]|\\^$+?"):
            return text
        return [name.strip() for name in text.split(",") if name.strip()]


@dataclass
class ProfileConfig:
    """Profiling a few steps (it.profiler): from the start of step ``start_step`` for ``num_steps`` steps; writes
    out_dir/profile/trace_rank{R}.json on every rank, and the merged trace.json and the ops table ops.txt on rank 0."""

    start_step: int = _key(-1, "first profiled step (negative: no profiling)")
    num_steps: int = _key(1, "steps profiled from start_step")
    record_shapes: bool = _key(False, "record each op's input shapes (ops.txt gets a table by shape too)")


@dataclass
class NumericsConfig:
    """The numerics checker (infini_train.training.numerics): statistics of the training steps' tensors in
    out_dir/numerics/rank<R>.jsonl, compared with ``python -m infini_train.tools.compare_numerics``."""

    level: int = _key(0, "0: off; 1: every module output, its gradient and every parameter gradient; 2: every op's "
                         "outputs and input gradients too")


@dataclass
class RunConfig:
    """A whole run: the three sections plus where it writes, how it resumes and where it runs."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    numerics: NumericsConfig = field(default_factory=NumericsConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    out_dir: str = _key("runs/default", "config.yaml, metrics.jsonl, loss.png, checkpoints/")
    resume: str = _key("", '"" (fresh), "auto" (newest checkpoint in out_dir, else fresh) or a checkpoint path')
    resume_allow_changes: bool = _key(False, "resume under a config that changes the run (learning rate, batch, seed, "
                                             "data, ...: listed at the start); false: such a resume is refused")
    seed: int = _key(1337, "seeds parameter init, dropout and sampling")
    device: str = _key("auto", "auto (cuda:<local rank> when available, else cpu), cpu, cpu:N, cuda, cuda:N")
    dtype: str = _key("float32", "parameter and activation dtype: float32 | float64")
    backend: str = _key("auto", "process-group backend under mpirun: auto (nccl on GPUs, else mpi), mpi, nccl")
    plot: bool = _key(True, "write out_dir/loss.png at the end")
    tensorboard: bool = _key(False, "write loss, val loss, lr, grad norm, tokens/s and MFU to out_dir/tb/ for "
                                    "TensorBoard (needs tensorboardX: the tensorboard extra)")
    precision: str = _key("fp32", "fp32 | bf16-mixed (forward under bfloat16 autocast, float32 master weights) | "
                                  "fp16-mixed (float16 autocast and a GradScaler)")

    warnings = ()  # (not a setting) what load_config found questionable but valid; the run prints each once

    def grad_accum_steps(self, world_size=1):
        """Same as ``self.train.grad_accum_steps(world_size)``."""
        return self.train.grad_accum_steps(world_size)

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw, source="config"):
        """Build and validate from a nested dict (e.g. a checkpoint's saved config)."""
        raw = copy.deepcopy(raw) if raw is not None else {}
        return _validated(raw, source, [], _rename_sections(raw))

    def to_yaml(self):
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def pretty(self):
        """One ``dotted.key  value`` line per setting, aligned, with the resolved model shape."""
        flat = _flatten(self.to_dict())
        width = max(map(len, flat))
        lines = [f"{k.ljust(width)}  {v!r}" if isinstance(v, str) else f"{k.ljust(width)}  {v}"
                 for k, v in flat.items()]
        try:
            gpt = self.model.to_model_config()
            lines.append(f"{'(resolved model)'.ljust(width)}  {gpt}")
        except ValueError:
            pass
        return "\n".join(lines)

    __str__ = pretty

    def save_resolved(self, out_dir=None, resumed_at=None):
        """Write ``out_dir/config.yaml`` (default self.out_dir) atomically; returns its path. load_config(path) gives
        back an equal RunConfig. A run resumed at step ``resumed_at`` writes ``config.resume-<step>.yaml`` instead,
        keeping the run's first config.yaml (written too when missing: a run resumed from elsewhere)."""
        from ...atomic_file import write_text_atomically

        out_dir = out_dir or self.out_dir
        os.makedirs(out_dir, exist_ok=True)
        def text(what):
            return f"# resolved run configuration{what} (defaults, config file and overrides merged)\n" + self.to_yaml()

        first = os.path.join(out_dir, "config.yaml")
        if resumed_at is None or not os.path.exists(first):
            write_text_atomically(first, text(""))
        if resumed_at is None:
            return first
        return write_text_atomically(os.path.join(out_dir, f"config.resume-{resumed_at:06d}.yaml"),
                                     text(f" of the resume at step {resumed_at}"))


RENAMED_SECTIONS = {"precision_check": "numerics"}  # earlier name -> name now: older configs and checkpoints load
SECTIONS = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig, "parallel": ParallelConfig,
            "lora": LoraConfig, "profile": ProfileConfig, "numerics": NumericsConfig}


def _key_docs():
    """{dotted key: one-line description} for every setting, top-level ones first, then model.*, data.*, train.*."""
    docs = {f.name: f.metadata["doc"] for f in dataclasses.fields(RunConfig) if f.name not in SECTIONS}
    for section, cls in SECTIONS.items():
        docs.update({f"{section}.{f.name}": f.metadata["doc"] for f in dataclasses.fields(cls)})
    return docs


def config_keys():
    """Every valid dotted key: top-level ones first, then model.*, data.*, train.*."""
    return list(_key_docs())


def _flatten(d, prefix=""):
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _suggest(path):
    """ " (did you mean 'train.learning_rate'?)" for a misspelt dotted key, or ""."""
    section, _, leaf = path.rpartition(".")
    keys = config_keys() + ([] if section else list(SECTIONS))  # section names only for top-level keys
    local = [k for k in keys if k.rpartition(".")[0] == section]
    same_leaf = [k for k in keys if k.rpartition(".")[2] == leaf and k != path]
    if same_leaf:  # the right key in the wrong section
        best = same_leaf
    else:
        close = difflib.get_close_matches(leaf, [k.rpartition(".")[2] for k in local], n=1, cutoff=0.6)
        best = [k for k in local if k.rpartition(".")[2] == close[0]] if close else []
        if not best:
            best = difflib.get_close_matches(path, keys, n=1, cutoff=0.6)
        if not best:
            close = difflib.get_close_matches(leaf, [k.rpartition(".")[2] for k in keys], n=1, cutoff=0.7)
            best = [k for k in keys if k.rpartition(".")[2] == close[0]] if close else []
    return f" (did you mean '{best[0]}'?)" if best else ""


def _describe(value):
    return f"{value!r} ({type(value).__name__})"


def _coerce(value, annotation, path, errors):
    """The value converted to the field's type, or _BAD after recording a type error."""
    optional = typing.get_origin(annotation) is typing.Union and type(None) in typing.get_args(annotation)
    if optional:
        if value is None:
            return None
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    kind = annotation.__name__ + (" or null" if optional else "")
    if annotation is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and isinstance(parse_value(value), bool):  # a quoted "false", as "16" is an int
            return parse_value(value)
    elif annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):  # YAML 1.1 reads 1e4 as a string
            try:
                number = float(value)
                if number.is_integer():
                    return int(number)
            except ValueError:
                pass
    elif annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads 3e-4 as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif annotation is list:  # (model.mlp_only_layers: a list of integers)
        kind = "a list of integers" + (" or null" if optional else "")
        if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return value
    elif annotation is str:
        if isinstance(value, str):
            return value
        # files and command lines give a str setting its text as written (see yaml_io._keep_text); any other
        # value (a YAML bool, a number in a dict) would mean guessing at the text, so it is refused
        errors.append(f"{path}: expected {kind}, got {_describe(value)}; HINT: {_text_hint(path, value)}")
        return _BAD
    errors.append(f"{path}: expected {kind}, got {_describe(value)}")
    return _BAD


_BAD = object()


def _text_hint(path, value):
    if value is None:
        return "this key cannot be null"
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return f"quote the value to pass it as text, e.g. {path.rpartition('.')[2]}: '{text}'"


def _names_as_text(value):
    """A list of names (a YAML list, or its text ``[c_attn,c_fc]`` as a text setting takes it from the command line)
    as comma-separated text; any other value as it is."""
    text = value.strip() if isinstance(value, str) else ""
    listed = parse_value(text) if text.startswith("[") and text.endswith("]") else value
    if isinstance(listed, list) and all(isinstance(v, str) and v.strip() for v in listed):
        return ",".join(v.strip() for v in listed)
    return value


def _build(cls, raw, prefix, errors, bad):
    """Instantiate ``cls`` from a dict; unknown keys and type errors go to ``errors``, their paths to ``bad``
    (those fields keep their defaults, so range checks can still run on the others)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        errors.append(f"{prefix}: expected a section of keys (like {prefix}.{dataclasses.fields(cls)[0].name}), "
                      f"got {_describe(raw)}")
        bad.add(prefix)
        return cls()
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in raw.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if key not in names:
            errors.append(f"{path}: unknown key{_suggest(path)}")
            continue
        if cls is RunConfig and key in SECTIONS:
            kwargs[key] = _build(SECTIONS[key], value, key, errors, bad)
            continue
        if key in getattr(cls, "LISTS_AS_TEXT", ()):
            value = _names_as_text(value)
        coerced = _coerce(value, hints[key], path, errors)
        if coerced is _BAD:
            bad.add(path)
        else:
            kwargs[key] = coerced
    return cls(**kwargs)


def _validated(raw, source, errors, renamed=()):
    bad = set()
    cfg = _build(RunConfig, raw, "", errors, bad)
    check_ranges(cfg, errors, bad)
    if errors:
        raise ConfigError(f"invalid run configuration ({source}), {len(errors)} problem"
                          f"{'s' if len(errors) > 1 else ''}:\n  " + "\n  ".join(errors), errors)
    cfg.warnings = [f"model.{key}={given} overrides model.preset={cfg.model.preset}'s {theirs} (the run's model is "
                    "the preset's with the explicit keys; drop the key, or pass it as null, for the preset's)"
                    for key, theirs, given in cfg.model.preset_overrides()]
    cfg.warnings += [f"{old} is now called {RENAMED_SECTIONS[old]} (e.g. {RENAMED_SECTIONS[old]}.level); the old "
                     "name still works" for old in renamed]
    return cfg


def _shown_dir(path):
    """``path`` relative to the working directory when it lies under it, else absolute."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def _similar_file(path):
    """ (did you mean 'configs/gpt2_tiny.yaml'?) for a missing config file, looking beside it and in configs/."""
    folder, name = os.path.split(path)
    candidates = {}
    for where in (folder or ".", os.path.join(REPO_ROOT, "configs")):
        if os.path.isdir(where):
            for entry in sorted(os.listdir(where)):
                if entry.endswith((".yaml", ".yml")):
                    shown = os.path.join(folder if where == (folder or ".") else _shown_dir(where), entry)
                    candidates.setdefault(entry, shown)
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean '{candidates[close[0]]}'?)" if close else ""


def _read_config_file(path):
    """The top-level mapping of the YAML file at ``path``; otherwise one ConfigError naming the path, what was
    expected, what was found and a hint."""
    where = f"config file {path!r}"
    shipped = os.path.join(REPO_ROOT, "configs")
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "*.yaml")) + glob.glob(os.path.join(path, "*.yml")))
        raise ConfigError(f"{where}: expected a YAML file, got a directory\nHINT: name a file in it, e.g. --config "
                          f"{files[0] if files else os.path.join(path, 'run.yaml')}")
    try:
        with open(path, "rb") as f:  # bytes: YAML detects the encoding and reports bad bytes as a YAML error
            raw = load_yaml(f, RunConfig)
    except FileNotFoundError:
        raise ConfigError(f"{where}: expected a YAML file, got a path that does not exist{_similar_file(path)}\n"
                          f"HINT: the shipped runs are in {shipped}: "
                          f"{', '.join(sorted(n for n in os.listdir(shipped) if n.endswith('.yaml')))}") from None
    except OSError as exc:
        raise ConfigError(f"{where}: expected a readable YAML file, got {exc.strerror or exc}\nHINT: check that it "
                          f"is a file you may read (ls -l {path})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where} is not valid YAML: {' '.join(str(exc).split())}") from None
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a YAML mapping of keys at the top level, got {_describe(raw)[:200]}\n"
                          f"HINT: write one 'key: value' per line and sections as 'train:' followed by indented "
                          f"keys, as in {os.path.join(shipped, 'gpt2_tiny.yaml')}")
    return raw or {}


def load_config(path=None, overrides=()):
    """Read the YAML file at ``path`` (None or an empty file: all defaults), apply ``overrides``
    (["train.learning_rate=3e-4", "out_dir=runs/x", "model={n_layer: 2, n_head: 2}", ...]; a mapping merges into
    its section key by key) and validate everything -> RunConfig.

    Raises one ConfigError listing every problem."""
    raw = _read_config_file(path) if path else {}
    errors = []
    renamed = _rename_sections(raw)
    overrides = [_renamed_override(text, renamed) for text in overrides]
    apply_overrides(raw, overrides, errors, RunConfig)
    _preset_replaces_file_shape(raw, overrides)
    _arch_of_pretrained(raw)
    cfg = _validated(raw, path or "defaults", errors, renamed)
    if cfg.lora.rank and cfg.lora.init_from is None and cfg.model.pretrained:
        cfg.lora.init_from = cfg.model.pretrained  # the adapters' base is the pretrained model
    return cfg


def _arch_of_pretrained(raw):
    """With ``model.pretrained`` and no ``model.arch``, the arch is the pretrained model's (a path that cannot be
    read is left to the checks, which say why)."""
    model = raw.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("pretrained"), str) or "arch" in model:
        return
    from ...models.pretrained import pretrained_config

    try:
        model["arch"] = pretrained_config(model["pretrained"])[0]
    except (OSError, ValueError, KeyError, TypeError):
        pass


def _rename_sections(raw):
    """Move sections given under an earlier name (RENAMED_SECTIONS) to their name now, in place; returns the old
    names found, for one warning each."""
    found = []
    for old, new in RENAMED_SECTIONS.items():
        if isinstance(raw, dict) and old in raw:
            section = raw.pop(old)
            if isinstance(section, dict) and isinstance(raw.get(new), dict):
                section = {**section, **raw[new]}
            raw[new] = section
            found.append(old)
    return found


def _renamed_override(text, renamed):
    key, sep, value = str(text).partition("=")
    head, dot, rest = key.strip().partition(".")
    if head in RENAMED_SECTIONS:
        if head not in renamed:
            renamed.append(head)
        return f"{RENAMED_SECTIONS[head]}{dot}{rest}{sep}{value}"
    return text


def _preset_replaces_file_shape(raw, overrides):
    """A model.preset set on the command line takes the architecture from the preset: the config file's keys that a
    preset defines (ModelConfig.PRESET_KEYS: the shape, LLaMA's rope, norm and tying) give way unless the command line
    sets them too."""
    given = {}
    apply_overrides(given, list(overrides), [], RunConfig)  # what the command line alone sets
    model, cli_model = raw.get("model"), given.get("model")
    if not isinstance(model, dict) or not isinstance(cli_model, dict) or cli_model.get("preset") is None:
        return
    for key in ModelConfig.PRESET_KEYS:
        if key not in cli_model:
            model[key] = None


def default_config_path():
    """configs/gpt2_tiny.yaml relative to the working directory, else inside the repository."""
    if os.path.exists(DEFAULT_CONFIG):
        return DEFAULT_CONFIG
    return os.path.join(REPO_ROOT, DEFAULT_CONFIG)


def _key_listing():
    """The valid keys by section, each with its description."""
    docs = _key_docs()
    width = max(map(len, docs))
    lines, current = [], None
    for key, doc in docs.items():
        section = key.split(".")[0] if "." in key else ""
        if section != current:
            lines.append(f"  {section + '.*' if section else 'top level'}:")
            current = section
        lines.append(f"    {key.ljust(width)}  {doc}")
    return "\n".join(lines)


def parse_args(argv=None):
    """``train.py [--config FILE] [--print-config] [dotted.key=value ...]`` -> RunConfig (ConfigError when
    invalid). --config defaults to configs/gpt2_tiny.yaml; --print-config prints the resolved config (the model's
    shape keys filled from its preset or defaults) and exits."""
    parser = argparse.ArgumentParser(
        description="Train GPT-2 with infini_train.", formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="overrides are dotted.key=value, values in YAML syntax (text settings take the text as written),\n"
               "and a mapping merges into its section, e.g.\n"
               "  train.learning_rate=3e-4 out_dir=runs/x model.preset=d12 data.val=null 'model={n_layer: 2}'\n\n"
               "valid keys:\n" + _key_listing())
    parser.add_argument("--config", default=None, help=f"YAML run config (default {DEFAULT_CONFIG})")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value overrides")
    args = parser.parse_intermixed_args(argv)
    cfg = load_config(args.config or default_config_path(), args.overrides)
    if args.print_config:  # a preset's (or the arch's default) shape shown, not left null
        print(dataclasses.replace(cfg, model=cfg.model.resolved()).to_yaml(), end="")
        raise SystemExit(0)
    return cfg
