"""A training run from a RunConfig: build, resume, the step loop, validation, samples, checkpoints, stop
signals, and the final evaluation (llm.c's order: the last iteration only evaluates, so the reported final
validation loss is the saved model's).

Rank 0 alone writes checkpoints, samples, metrics and plots. The other ranks wait for that I/O in an untimed
barrier, so a slow disk or a long sample never trips the collective timeout and aborts a healthy job.
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
import time

import numpy as np

from .. import backend
from .. import distributed as dist
from ..data.corpus import ensure_default_data
from ..data.loader import DistributedDataLoader
from ..data.sft_loader import SFTDataError, SFTDataLoader
from ..data.tokenizer import get_tokenizer
from ..models.parallelize import gathered
from ..models.tensor_parallel_lm import without_sequence_parallel
from ..nn.lora import save_adapter
from ..tensor import Tensor
from ..run_state import read_state, step_dir
from ..run_state.async_save import AsyncSaver
from .comm_log import comm_record, counting
from .config import ConfigError
from .metrics import MetricsLog, plot_loss_curve
from .peak_flops import run_peak
from .evaluation import evaluate, sample_text
from .parallel_dims import ParallelDims
from .out_dir import check_writable
from .memory import PhasePeaks, peak_rss_bytes
from .model_build import build_model
from .moe_metrics import moe_metrics_for
from .mtp_metrics import mtp_metrics_for
from .lora_run import check_same_lora, checkpoint_reference
from .precision import autocast_for, scaler_for
from .numerics_run import numerics_checker_for
from .profiling import RunProfiler
from .resume import check_config_changes, check_same_model, choose_checkpoint, run_id_of
from .signals import EXIT_STOPPED, StopSignals, signal_name
from .startup import config_lines, data_summary, layout_summary, parameter_summary, parameters_per_rank, transport
from .step import StepPlan, train_step
from .stragglers import step_watch
from .tensorboard_log import RunLog


PER_STEP_SEEDS = ("SeedSequence([seed, data-parallel rank, step]); tensor-parallel shards: SeedSequence([seed, "
                  "data-parallel rank, step, 1 + tensor-parallel rank])")


class TrainingDiverged(RuntimeError):
    """The loss or gradient norm stayed non-finite for more steps than train.skip_nonfinite allows."""


def print0(*args, **kwargs):
    if dist.get_rank() == 0:
        print(*args, **kwargs, flush=True)


def wait_for_rank0():
    """Every rank waits here, without the collective timeout, while rank 0 finishes its I/O."""
    if dist.get_world_size() > 1:
        dist.barrier(async_op=True).wait(timeout=math.inf)


def pick_device(cfg):
    if cfg.device != "auto":
        return backend.Device.parse(cfg.device if cfg.device != "cuda" else f"cuda:{dist.get_local_rank()}")
    if backend.cuda_available():
        return backend.Device.parse(f"cuda:{dist.get_local_rank()}")
    return backend.CPU


def make_loader(cfg, split, tokenizer, dims):
    """The loader of ``data.train`` or ``data.val`` (``split``): llm.c token windows, or for the SFT formats
    (data.format text | chat | instruction) packed or padded samples (the validation ones in file order)."""
    d, t = cfg.data, cfg.train
    pattern, key = getattr(d, split), f"data.{split}"
    if d.format == "tokens":
        return DistributedDataLoader(pattern, t.batch_size, t.sequence_length, dims.dp_rank, dims.dp_size,
                                     config_key=key)
    try:
        loader = SFTDataLoader(pattern, tokenizer, t.batch_size, t.sequence_length, dims.dp_rank, dims.dp_size,
                               format=d.format, packing=d.packing, train_on_prompt=d.train_on_prompt, seed=cfg.seed,
                               shuffle=split == "train", config_key=key)
    except SFTDataError as exc:
        raise ConfigError(f"{key}: {exc}") from None
    print0(loader.summary())
    return loader


class Run:
    """One run: ``Run(cfg).train()`` returns the process exit status (0, or EXIT_STOPPED after a stop signal)."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        if self.rank == 0 or cfg.profile.start_step >= 0 or cfg.numerics.level > 0:  # the ranks that write
            check_writable(cfg.out_dir)
        t = cfg.train
        p = cfg.parallel
        self.dims = dims = ParallelDims(p.tensor, p.sequence, p.pipeline, p.virtual_pipeline, p.pipeline_schedule,
                                        p.context, p.expert, p.context_method, p.context_a2a, p.data_replicate)
        self.grad_accum = cfg.grad_accum_steps(dims.dp_size)
        dims.check_schedule(self.grad_accum)
        self.device = pick_device(cfg)
        if self.rank == 0:
            ensure_default_data(cfg.data)
        wait_for_rank0()
        self.resumed_from = choose_checkpoint(cfg)
        resume_state = None
        if self.resumed_from:  # refuse another model or other LoRA settings before building anything
            resume_state = read_state(self.resumed_from)
            check_same_model(resume_state, cfg.model.arch, cfg.model.to_model_config().to_dict(), self.resumed_from)
            check_same_lora(resume_state.get("lora"), cfg.lora, self.resumed_from)
            check_config_changes(resume_state, cfg, self.resumed_from)  # lists them; refuses what alters the run
        self.memory = PhasePeaks(self.device)
        self.memory.start("build")
        self.plan, self.tok_name, self.lora_base = build_model(
            cfg, self.device, dims, lora_reference=(resume_state or {}).get("lora"), resuming=bool(self.resumed_from))
        self.zero_stage = cfg.parallel.zero_stage
        self.moe = moe_metrics_for(self.plan.model, dims, p.expert)  # router statistics of a MoE, else None
        self.mtp = mtp_metrics_for(self.plan.model, dims)  # DeepSeek-V3's multi-token prediction loss, else None
        self.layout = self.plan.train(t, offload_dir=os.path.join(cfg.out_dir, "offload"))
        self.raw_model, self.model, self.optimizer = self.layout.raw_model, self.layout.model, self.layout.optimizer
        self.tokenizer = get_tokenizer(self.tok_name)
        self.train_loader = make_loader(cfg, "train", self.tokenizer, dims)
        self.val_loader = make_loader(cfg, "val", self.tokenizer, dims) if cfg.data.val and t.val_loss_every else None
        self.amp = lambda: autocast_for(cfg.precision, self.device)
        self.scaler = scaler_for(cfg.precision, self.device, cfg.train)
        self.step_plan = StepPlan(self.layout, self.grad_accum, self.device, self.amp, self.scaler)
        self.state = self.layout.state
        self.checkpoint_format = cfg.train.checkpoint_format
        if self.checkpoint_format == "auto":
            self.checkpoint_format = "sharded" if self.world > 1 else "whole"
        self.saver = AsyncSaver() if cfg.train.checkpoint_async else None  # train.checkpoint_async's writer
        self.start_step = 0
        self.skipped_total = 0  # updates skipped: a non-finite loss or gradient norm, or an overflow the scaler caught
        self.skipped_in_a_row = 0
        self.memory.stop()
        state = None
        if self.resumed_from:
            with self.memory.phase("load"):
                state = self._resume(self.resumed_from)
        self.run_id = run_id_of(state)

    def _resume(self, path):
        state = self.state.load(path)  # (verified by rank 0) each rank reads the parts it holds, from either format; a
        # LoRA run's pinned base was restored at build
        self.state.load_data_position(self.train_loader, state["data"])
        self.start_step = state["step"]
        self.skipped_total = state.get("skipped_steps", 0)
        self.skipped_in_a_row = state.get("skipped_in_a_row", 0)
        if self.scaler is not None and state.get("grad_scaler"):
            self.scaler.load_state_dict(state["grad_scaler"])
        print0(f"resumed from {path} at step {self.start_step}")
        return state

    # ------------------------------------------------------------------------------------------ checkpoints
    def save(self, step, final=True):
        """Checkpoint ``step``; with train.checkpoint_async a save that is not ``final`` (the run's last, or a stop's)
        is staged and written in the background, a final one waits for the writer and writes in the foreground."""
        cfg = self.cfg
        data_states = self.state.data_positions(self.train_loader)
        run_state = {
            "config": cfg.to_dict(), "arch": cfg.model.arch, "model_config": self.raw_model.config.to_dict(),
            "tokenizer": self.tok_name, "rng": {"seed": cfg.seed, "per_step": PER_STEP_SEEDS}, "data": data_states,
            "skipped_steps": self.skipped_total, "skipped_in_a_row": self.skipped_in_a_row,
            "grad_scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "lora": checkpoint_reference(cfg.lora, cfg.seed, self.lora_base) if cfg.lora.rank else None}
        background = self.saver is not None and not final
        if self.saver is not None:
            self._finish_background_save(block=True)  # one save in flight: the next (and the last) waits for it
        started = time.perf_counter()
        self.memory.start("save")
        # sharded: every rank writes its own shard, nothing is gathered; whole: gathered on rank 0, which writes
        path = self.state.save(cfg.out_dir, step, self.checkpoint_format, run_state, keep_last=cfg.train.keep_last,
                               run_id=self.run_id, saver=self.saver if background else None)
        self.memory.stop()
        if background:
            print0(f"checkpoint {path}: staged {self.saver.staged / 2 ** 20:.1f} MB on rank 0 in "
                   f"{time.perf_counter() - started:.2f} s, writing in the background")
            return path
        print0(f"saved checkpoint {path}")
        wait_for_rank0()
        return path

    def _finish_background_save(self, block=False):
        """At each step boundary (and, blocking, before a save): a background writer's error ends the run here; a
        finished save is announced."""
        if self.saver.thread is None or (not block and self.saver.busy()):
            self.saver.check()
            return
        step = self.saver.step
        self.saver.wait()
        print0(f"saved checkpoint {step_dir(self.cfg.out_dir, step)} (in the background)")

    # --------------------------------------------------------------------------------------------- the loop
    def train(self, stops=None):
        """Train to ``train.num_iterations``; returns 0, or EXIT_STOPPED after a stop signal (recorded by ``stops``,
        a StopSignals already installed, or one installed for the loop)."""
        cfg, t = self.cfg, self.cfg.train
        self._print_startup()
        tokens_per_step = t.batch_size * t.sequence_length * self.grad_accum * self.dims.dp_size
        peak, peak_source = run_peak(self.device, cfg.precision, np.dtype(cfg.dtype).itemsize, t.peak_flops)
        print0(f"MFU against {peak_source}" if peak else f"MFU not reported: {peak_source}")
        flops_per_token = self.raw_model.flops_per_token(t.sequence_length)
        resume_step = self.start_step if self.resumed_from else None
        log = RunLog(MetricsLog(cfg.out_dir, resume_step, enabled=self.rank == 0), cfg.out_dir, cfg.tensorboard,
                     resume_step, enabled=self.rank == 0)
        bar = self._progress_bar()
        profiler = RunProfiler(cfg, self.raw_model)  # the profile section's steps
        check = numerics_checker_for(cfg, self.raw_model, self.rank, resume_step, self.scaler)  # detached at the end
        recording = contextlib.nullcontext(stops) if stops is not None else StopSignals()
        watch = step_watch(cfg, self.rank, self.world)  # straggler timers and report; out_dir/hang (several ranks)
        with recording as stops, log, check:  # (log: closes the TensorBoard writer however the loop ends)
            for step in range(self.start_step, t.num_iterations + 1):
                if self.saver is not None:
                    self._finish_background_save()
                stop = stops.agreed()
                if stop:
                    return self._stop(step, stop, bar)
                last = step == t.num_iterations
                record = {"step": step}
                self._evaluate_and_sample(step, last, record)
                if last:
                    if "val_loss" in record:
                        log.write(record)
                    break
                t0 = time.perf_counter()
                profiler.begin(step)
                with check.recording(step), self.memory.phase("first_step" if step == self.start_step else "steady"), \
                        counting(t.log_communication) as counts, watch.timing(step):
                    result = train_step(self.step_plan, self.train_loader, t, step, cfg.seed)
                self._count_nonfinite(step, result)
                dt = time.perf_counter() - t0
                profiler.end(step)
                if step == self.start_step:
                    self._report_memory()
                tokens_per_s = tokens_per_step / dt
                record.update(loss=result.loss, lr=result.lr, grad_norm=result.grad_norm, ms=dt * 1000,
                              tokens_per_s=tokens_per_s, mfu=flops_per_token * tokens_per_s / peak if peak else None,
                              skipped=not result.updated, skipped_steps=self.skipped_total)
                if result.loss_scale is not None:
                    record["loss_scale"] = result.loss_scale
                if counts is not None:
                    record["comm_bytes"] = comm_record(counts, self.dims)
                if self.moe is not None:
                    record.update(self.moe.collect())
                if self.mtp is not None:
                    record.update(self.mtp.collect())
                record.update(watch.end_step(step, result))  # every log_every steps: {"straggler": ...}
                log.write(record)
                self._log_line(step, result, dt, tokens_per_s, record["mfu"], bar,
                               (self.moe.describe(record) if self.moe is not None else "")
                               + (self.mtp.describe(record) if self.mtp is not None else "") + watch.describe(record))
                if t.save_every and (step + 1) % t.save_every == 0 and step + 1 < t.num_iterations:
                    self.save(step + 1, final=False)
        if bar is not None:
            bar.close()
        if t.num_iterations > self.start_step:
            self.save(t.num_iterations)
        self._report_phases(log)
        self._export_adapter()  # also when a resume found nothing left to train: the run ends with its final model
        self._plot()
        return 0

    def _print_startup(self):
        """Rank 0 prints the settings that differ from the defaults (writing the whole resolved config to out_dir),
        the layout, the parameter counts and the data's (training/startup.py shows the lines)."""
        cfg, dims = self.cfg, self.dims
        per_rank = parameters_per_rank(self.layout)  # (where the layout splits them, a collective: every rank)
        if self.rank != 0:
            return
        for warning in cfg.warnings:
            print(f"warning: {warning}", file=sys.stderr, flush=True)
        path = cfg.save_resolved(resumed_at=self.start_step if self.resumed_from else None)  # keeps config.yaml
        lines = config_lines(cfg, path)
        lines.append(layout_summary(dims, cfg, self.device, transport(self.world)))
        lines.append(parameter_summary(self.raw_model.num_params(), self.raw_model.num_params(trainable=True),
                                       per_rank))
        lines += data_summary(cfg, dims.dp_size, self.grad_accum, self.tok_name, self.train_loader, self.val_loader)
        print("\n".join(lines), flush=True)

    def _export_adapter(self):
        """A LoRA run's adapters in PEFT's format (adapter_config.json + adapter_model.safetensors) in
        out_dir/adapter, for PEFT to load onto the base model."""
        if not self.cfg.lora.rank:
            return
        with gathered(self.raw_model, trainable_only=True):
            self._write_adapter()

    def _write_adapter(self):
        if self.dims.dp_rank == 0:  # rank 0's tensor group gathers the adapters; rank 0 writes
            path = save_adapter(self.raw_model, os.path.join(self.cfg.out_dir, "adapter"),
                                base_model_name_or_path=self.lora_base.source)
            if path is not None and self.rank == 0:
                print(f"adapter (PEFT format): {path}", flush=True)
        wait_for_rank0()

    def _report_memory(self):
        """Once, after the first step: each rank's parameter, gradient and optimizer-state bytes (from the
        tensors it holds) and its peak resident memory."""
        mine = Tensor(np.array([self.layout.parameter_bytes(), self.optimizer.grad_bytes(),
                                self.optimizer.state_bytes(), peak_rss_bytes(), self.optimizer.offloaded_bytes()],
                               np.int64))
        parts = [Tensor(np.zeros(5, np.int64)) for _ in range(self.world)]
        dist.all_gather(parts, mine)
        mb = [[int(v) / 2 ** 20 for v in p.numpy()] for p in parts]
        offloaded = f" + {{:.2f}} MB offloaded ({self.cfg.train.optimizer_offload})"
        rows = ", ".join(f"rank {r}: parameters {m[0]:.2f} MB, gradients {m[1]:.2f} MB, optimizer state "
                         f"{m[2]:.2f} MB{offloaded.format(m[4]) if m[4] else ''}, peak RSS {m[3]:.0f} MB"
                         for r, m in enumerate(mb))
        print0(f"memory (ZeRO stage {self.zero_stage}, {self.dims.describe()}): {rows}")

    def _report_phases(self, log):
        """Each rank's peak resident memory per phase, in the log and as metrics.jsonl's last record."""
        gathered = self.memory.gather()
        print0(self.memory.describe(gathered))
        log.write({"step": self.cfg.train.num_iterations, "memory": gathered})

    def _evaluate_and_sample(self, step, last, record):
        t = self.cfg.train
        if self.val_loader is not None and (step % t.val_loss_every == 0 or last):
            record["val_loss"] = evaluate(self.model, self.val_loader, t.val_max_steps, self.device, self.amp,
                                          self.dims.dp_group)
            print0(f"step {step}: val loss {record['val_loss']:.4f}")
        if t.sample_every and step > 0 and (step % t.sample_every == 0 or last):
            # rank 0's tensor group (or expert group) generates together: its layers are split; under ZeRO-3 every
            # data-parallel rank does (each forward all-gathers the parameters over them), with the same seed
            if self.layout.generates_here():
                with without_sequence_parallel(self.raw_model):
                    text = sample_text(self.raw_model, self.tokenizer, t.sample_length, self.cfg.seed + step,
                                       self.device, self.amp)
                print0(f"--- sample at step {step} ---\n{text}\n---")
            wait_for_rank0()

    def _count_nonfinite(self, step, result):
        """Count a skipped update (``skipped_steps``) and stop the run after more non-finite steps in a row than
        train.skip_nonfinite allows. Messages number steps as the step lines do (1-based: step N/total)."""
        if result.updated:
            self.skipped_in_a_row = 0
            return
        self.skipped_total += 1
        if result.finite:  # the GradScaler caught an overflow: not divergence, it backed off and goes on
            print0(f"step {step + 1}: skipped the update (gradients overflowed float16 at loss scale "
                   f"{result.loss_scale:g}; the GradScaler backs off)")
            return
        self.skipped_in_a_row += 1
        allowed = self.cfg.train.skip_nonfinite
        what = f"loss {result.loss}, grad norm {result.grad_norm}"
        if self.skipped_in_a_row > allowed:
            bad = (f"loss became {result.loss}" if not math.isfinite(result.loss)
                   else f"gradient norm became {result.grad_norm}")
            raise TrainingDiverged(
                f"{bad} at step {step + 1} ({self.skipped_in_a_row} non-finite step(s) in a row, "
                f"train.skip_nonfinite={allowed})\nHINT: lower train.learning_rate or raise warmup_iters, or let "
                "train.skip_nonfinite skip a few such steps; the last good checkpoint in out_dir is kept")
        print0(f"step {step + 1}: skipped the update ({what}); {self.skipped_in_a_row} in a row, "
               f"{allowed} allowed by train.skip_nonfinite")

    def _stop(self, step, number, bar):
        if bar is not None:
            bar.close()
        if step == self.start_step and self.resumed_from:  # stopped before a step: the checkpoint it resumed holds
            path = self.resumed_from
        else:
            path = self.save(step)
        if step == self.cfg.train.num_iterations:  # stopped at the last step boundary: the model is final
            self._export_adapter()
        total = self.cfg.train.num_iterations  # (after N steps: the last step line was N/total, metrics' step N-1)
        print0(f"stopped by {signal_name(number)} after {step} of {total} steps, checkpoint {path}\nHINT: resume=auto "
               f"continues the run{f' with step {step + 1}/{total}' if step < total else ''} (exit status "
               f"{EXIT_STOPPED})")
        return EXIT_STOPPED

    def _progress_bar(self):
        if self.rank != 0:
            return None
        from tqdm import tqdm

        return tqdm(total=self.cfg.train.num_iterations, initial=self.start_step, desc="train", dynamic_ncols=True,
                    disable=not sys.stderr.isatty())

    def _log_line(self, step, result, dt, tokens_per_s, mfu, bar, extra=""):
        t = self.cfg.train
        if step % t.log_every == 0 or step == t.num_iterations - 1:
            line = (f"step {step + 1:5d}/{t.num_iterations} | loss {result.loss:.6f} | lr {result.lr:.2e} | norm "
                    f"{result.grad_norm:.4f} | {dt * 1000:.1f} ms | {tokens_per_s:.0f} tok/s"
                    + (f" | MFU {100 * mfu:.1f}%" if mfu is not None else "") + extra)
            if bar is not None and not bar.disable:
                bar.write(line)
            else:
                print0(line)
        if bar is not None:
            bar.update(1)

    def _plot(self):
        cfg = self.cfg
        log_path = os.path.join(cfg.out_dir, "metrics.jsonl")
        if self.rank != 0 or not cfg.plot or not os.path.exists(log_path):
            return
        png = os.path.join(cfg.out_dir, "loss.png")
        if plot_loss_curve(log_path, png):
            print(f"loss curve: {png}")
        else:
            print("plot: matplotlib is not installed, so no loss.png was written\n"
                  "HINT: pip install -e '.[plot]' (or set plot=false)", flush=True)
