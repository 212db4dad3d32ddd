"""The run config's sections other than the model's (data, train, parallel, lora, profile, numerics) and ConfigError;
the model section is in .model, the whole run's config in .schema."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ...data.tokenizer import HF_PREFIX, hf_name
from ...models import registry
from .model import _key


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
    mtp_loss_weight: float = _key(0.3, "weight of the multi-token prediction loss (model.num_nextn_predict_layers > "
                                       "0; DeepSeek-V3's 0.3, then 0.1); without MTP modules it changes nothing")
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
    checkpoint_async: bool = _key(False, "write checkpoints in the background: each rank stages its state in host "
                                         "memory at the step boundary and training goes on while a writer thread "
                                         "writes it (one save in flight; the last save waits)")
    log_every: int = _key(1, "steps between printed lines (metrics.jsonl gets every step)")
    log_communication: bool = _key(False, "each step's metrics.jsonl record gets comm_bytes: the bytes this rank's "
                                          "collectives and sends handed over, by collective and group")
    straggler_report: bool = _key(True, "runs of several ranks: every log_every steps rank 0 names the slowest rank "
                                         "(its step less communication wait, against the median; compute, data "
                                         "wait, communication wait) when 1.2x the median or more, and metrics.jsonl "
                                         "gets a straggler record")
    overfit_single_batch: bool = _key(False, "train on the first batch over and over (a debugging aid, -f)")
    optimizer_offload: str = _key("none", "none | disk (each rank's optimizer state in a file under out_dir/offload, "
                                          "updated chunk by chunk: ZeRO-Infinity's NVMe offload) | host (GPU runs: "
                                          "the state in pinned host memory, updated there: ZeRO-Offload); the same "
                                          "values as none, bit for bit")
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


def _expert_parallel_archs():
    return [s.arch for s in registry.sections() if s.experts and s.expert_parallel]


@dataclass
class ParallelConfig:
    """How the ranks of a job share the work: world = pipeline x data-parallel x context x tensor ranks, laid out
    tensor-fastest, then context, then data, then pipeline (ranks 0..tensor-1 form the first tensor-parallel group;
    rank = ((pp_rank * DP + dp_rank) * CP + cp_rank) * TP + tp_rank); the data-parallel size is world / (tensor x
    context x pipeline). Expert parallelism splits the data-parallel ranks into groups of ``expert``."""

    tensor: int = _key(1, "tensor-parallel size: attention heads, MLP and vocabulary split over this many ranks")
    context: int = _key(1, "context-parallel size: each sequence split over this many ranks (load-balanced causal "
                           "chunks; attention by context_method)")
    context_method: str = _key("ring", "ring | ulysses | hybrid: how attention runs over the context ranks (ring: "
                                       "keys and values passed around the ring; ulysses: all-to-all from the sequence "
                                       "split to a head split, heads and key/value heads divisible by context; hybrid: "
                                       "all-to-all inside groups of context_a2a ranks, ring across the groups)")
    context_a2a: int = _key(1, "the all-to-all group size of context_method=hybrid: consecutive context ranks, "
                               "dividing context, > 1 and < context (1 otherwise)")
    sequence: bool = _key(False, "sequence parallelism: layer norms and dropout on slices of the sequence "
                                 "(needs tensor > 1)")
    pipeline: int = _key(1, "pipeline stages: the layers split into this many consecutive parts, one per rank")
    virtual_pipeline: int = _key(1, "model chunks per pipeline stage (> 1 with pipeline_schedule=interleaved; 2 "
                                    "with zbv and dualpipev)")
    pipeline_schedule: str = _key("1f1b", "gpipe | 1f1b | interleaved | zb1p | zbv | dualpipev (the last three "
                                          "split backwards into input and weight halves to fill the bubble); "
                                          "micro-batches are the gradient-accumulation steps")
    expert: int = _key(1, f"expert-parallel size ({' | '.join(_expert_parallel_archs())}): "
                          "each MoE layer's experts split over groups of this many data-parallel ranks (tokens "
                          "exchanged all-to-all); divides the data-parallel size and num_experts")
    zero_stage: int = _key(0, "0: DDP (every rank keeps the whole optimizer state); 1: optimizer state sharded "
                              "across ranks (ZeroRedundancyOptimizer); 2: gradients sharded too; 3: parameters "
                              "sharded too, gathered per block while it runs (fully_shard)")
    data_replicate: int = _key(1, "hybrid sharded data parallelism (HSDP, with zero_stage 3): the data-parallel "
                                  "ranks as this many replicas of consecutive ranks, each sharding parameters, "
                                  "gradients and optimizer state over its own (data parallel = data_replicate x "
                                  "shard); only the reduced gradient shards cross replicas. 1: ZeRO-3 over all")


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

