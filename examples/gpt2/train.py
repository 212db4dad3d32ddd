"""Train GPT-2 with infini_train, single process or data-parallel under mpirun.

    python examples/gpt2/train.py --config configs/gpt2_tiny.yaml [dotted.key=value ...]
    mpirun -n 2 python examples/gpt2/train.py --config configs/gpt2_tiny_ddp.yaml

Gradient accumulation, AdamW with llm.c's cosine schedule, grad clipping, periodic validation, samples and
checkpoints; metrics.jsonl and a loss-curve PNG in out_dir. ``resume=auto`` continues bitwise-identically
from the newest checkpoint.
"""
from __future__ import annotations

import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import infini_train as it  # noqa: E402
from infini_train import backend  # noqa: E402
from infini_train import distributed as dist  # noqa: E402
from infini_train.data.corpus import ensure_default_data, read_meta  # noqa: E402
from infini_train.data.loader import DistributedDataLoader  # noqa: E402
from infini_train.data.tokenizer import get_tokenizer  # noqa: E402
from infini_train.models.gpt2 import GPT2  # noqa: E402
from infini_train.nn.parallel import DistributedDataParallel  # noqa: E402
from infini_train.nn.utils import clip_grad_norm_  # noqa: E402
from infini_train.optim.lr_scheduler import cosine_with_warmup  # noqa: E402
from infini_train.utils import checkpoint as ckpt  # noqa: E402
from infini_train.utils.config import ConfigError, parse_args  # noqa: E402
from infini_train.utils.metrics import MetricsLog, measure_sgemm_peak, plot_loss_curve  # noqa: E402


class TrainingDiverged(RuntimeError):
    pass


def print0(*args, **kwargs):
    if dist.get_rank() == 0:
        print(*args, **kwargs, flush=True)


def pick_device(cfg):
    if cfg.device != "auto":
        return backend.Device.parse(cfg.device if cfg.device != "cuda" else f"cuda:{dist.get_local_rank()}")
    if backend.cuda_available():
        return backend.Device.parse(f"cuda:{dist.get_local_rank()}")
    return backend.CPU


def step_seed(seed, rank, step):
    """The seed of one step's randomness (dropout) on one rank: different per rank, and a function of the
    step alone, so a resumed run draws exactly what the uninterrupted run drew."""
    return int(np.random.SeedSequence([seed, rank, step]).generate_state(1)[0])


def to_tensor(array, device):
    return it.Tensor._make(backend.to_device_array(array, device), device)


@it.no_grad()
def evaluate(model, loader, steps, device):
    loader.reset()
    losses = []
    for _ in range(steps):
        x, y = loader.next_batch()
        _, loss = model(to_tensor(x, device), to_tensor(y, device))
        losses.append(loss.item())
    value = np.array([float(np.mean(losses))], np.float64)
    t = it.Tensor._make(backend.to_device_array(value, device), device)
    dist.all_reduce(t, "avg")
    return float(t.numpy()[0])


def sample_text(model, tokenizer, length, seed, device):
    start = it.tensor(np.array([[tokenizer.eot_token]], np.int64), device=device)
    out = model.generate(start, length, temperature=1.0, top_k=40, seed=seed)
    return tokenizer.decode(out.numpy()[0, 1:].tolist())


def build(cfg, rank, world):
    device = pick_device(cfg)
    if rank == 0:
        ensure_default_data(cfg.data)
    dist.barrier()
    meta = read_meta(cfg.data.train)
    tok_name = meta["tokenizer"] if meta else cfg.data.tokenizer
    if meta and cfg.data.tokenizer not in ("auto", meta["tokenizer"]):
        raise ConfigError(f"data.tokenizer: the shards under {os.path.dirname(cfg.data.train)} were made with "
                          f"{meta['tokenizer']!r}, but the config says {cfg.data.tokenizer!r}\nHINT: set "
                          f"data.tokenizer={meta['tokenizer']} or re-run prepare_data.py")
    gpt_cfg = cfg.model.to_gpt2_config()
    vocab_needed = meta["vocab_size"] if meta else 0
    if vocab_needed > gpt_cfg.vocab_size:
        raise ConfigError(f"model.vocab_size: the data's tokenizer has {vocab_needed} tokens, more than the "
                          f"model's vocab_size {gpt_cfg.vocab_size}\nHINT: set model.vocab_size >= {vocab_needed}")
    it.manual_seed(cfg.seed)  # same init on every rank (DDP also broadcasts rank 0's weights)
    model = GPT2(gpt_cfg).to(device=device, dtype=cfg.dtype)
    t = cfg.train
    train_loader = DistributedDataLoader(cfg.data.train, t.batch_size, t.sequence_length, rank, world)
    val_loader = None
    if cfg.data.val and t.val_loss_every:
        val_loader = DistributedDataLoader(cfg.data.val, t.batch_size, t.sequence_length, rank, world)
    return device, model, train_loader, val_loader, get_tokenizer(tok_name), tok_name


def main(argv=None):
    cfg = parse_args(argv)
    dist.init_process_group(None if cfg.backend == "auto" else cfg.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    t = cfg.train
    grad_accum = cfg.grad_accum_steps(world)
    device, model, train_loader, val_loader, tokenizer, tok_name = build(cfg, rank, world)
    raw_model = model
    if world > 1:
        model = DistributedDataParallel(model)
    optimizer = raw_model.configure_optimizers(t.weight_decay, t.learning_rate, (t.beta1, t.beta2), t.eps)

    start_step = 0
    resume_path = None
    if cfg.resume == "auto":
        resume_path = ckpt.latest_checkpoint(cfg.out_dir)
    elif cfg.resume:
        resume_path = ckpt.resolve_checkpoint(cfg.resume)
    if resume_path:
        model_state, opt_state, state = ckpt.load_checkpoint(resume_path)
        raw_model.load_state_dict(model_state)
        optimizer.load_state_dict(opt_state)
        train_loader.load_state_dict(state["data"][rank] if world == len(state["data"]) else state["data"][0])
        start_step = state["step"]
        print0(f"resumed from {resume_path} at step {start_step}")

    if rank == 0:
        print(f"run config:\n{cfg.to_yaml()}")
        cfg.save_resolved()
    tokens_per_step = t.batch_size * t.sequence_length * grad_accum * world
    print0(f"world {world} ({dist.get_backend()}), device {device}, grad_accum {grad_accum}, "
           f"{tokens_per_step} tokens/step, {raw_model.num_params():,} parameters, tokenizer {tok_name}")
    peak = measure_sgemm_peak() * world
    flops_per_token = raw_model.flops_per_token(t.sequence_length)
    log = MetricsLog(cfg.out_dir, start_step if resume_path else None, enabled=rank == 0)

    def save(step):
        data_states = [train_loader.state_dict()]
        if world > 1:  # every rank's loader position, gathered as small int tensors
            mine = it.tensor(np.array([data_states[0]["shard"], data_states[0]["position"]], np.int64))
            parts = [it.zeros(2, dtype=it.int64) for _ in range(world)]
            dist.all_gather(parts, mine)
            data_states = [{"shard": int(p.numpy()[0]), "position": int(p.numpy()[1])} for p in parts]
        if rank == 0:
            path = ckpt.save_checkpoint(cfg.out_dir, step, raw_model.state_dict(), optimizer.state_dict(), {
                "config": cfg.to_dict(), "model_config": raw_model.config.to_dict(), "tokenizer": tok_name,
                "rng": {"seed": cfg.seed, "per_step": "SeedSequence([seed, rank, step])"},
                "data": data_states}, keep_last=t.keep_last)
            print0(f"saved checkpoint {path}")
        dist.barrier()

    bar = None
    if rank == 0:
        from tqdm import tqdm
        bar = tqdm(total=t.num_iterations, initial=start_step, desc="train", dynamic_ncols=True,
                   disable=not sys.stderr.isatty())
    step = start_step
    for step in range(start_step, t.num_iterations):
        last = step == t.num_iterations - 1
        record = {"step": step}
        if val_loader is not None and (step % t.val_loss_every == 0 or last):
            record["val_loss"] = evaluate(model, val_loader, t.val_max_steps, device)
            print0(f"step {step}: val loss {record['val_loss']:.4f}")
        if rank == 0 and t.sample_every and step > 0 and (step % t.sample_every == 0 or last):
            text = sample_text(raw_model, tokenizer, t.sample_length, cfg.seed + step, device)
            print(f"--- sample at step {step} ---\n{text}\n---", flush=True)

        t0 = time.perf_counter()
        it.manual_seed(step_seed(cfg.seed, rank, step))
        optimizer.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for micro in range(grad_accum):
            if t.overfit_single_batch:
                train_loader.reset()
            x, y = train_loader.next_batch()
            sync = micro == grad_accum - 1
            ctx = model.no_sync() if (world > 1 and not sync) else _null()
            with ctx:
                _, loss = model(to_tensor(x, device), to_tensor(y, device))
                loss = loss / grad_accum
                loss.backward()
            loss_sum += loss.item()
        if world > 1:
            lt = it.tensor(np.array([loss_sum], np.float64))
            dist.all_reduce(lt, "avg")
            loss_sum = float(lt.numpy()[0])
        if not math.isfinite(loss_sum):
            raise TrainingDiverged(f"loss became {loss_sum} at step {step}\nHINT: lower train.learning_rate or "
                                   "raise warmup_iters; the last good checkpoint in out_dir is kept")
        norm = clip_grad_norm_(raw_model.parameters(), t.grad_clip if t.grad_clip > 0 else float("inf")).item()
        lr = cosine_with_warmup(step, t.learning_rate, t.warmup_iters, t.num_iterations, t.learning_rate_decay_frac)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()
        dt = time.perf_counter() - t0
        tokens_per_s = tokens_per_step / dt
        mfu = flops_per_token * tokens_per_s / peak
        record.update(loss=loss_sum, lr=lr, grad_norm=norm, ms=dt * 1000, tokens_per_s=tokens_per_s, mfu=mfu)
        log.write(record)
        if step % t.log_every == 0 or last:
            line = (f"step {step + 1:5d}/{t.num_iterations} | loss {loss_sum:.6f} | lr {lr:.2e} | norm {norm:.4f} | "
                    f"{dt * 1000:.1f} ms | {tokens_per_s:.0f} tok/s | MFU {100 * mfu:.1f}%")
            if bar is not None and not bar.disable:
                bar.write(line)
            else:
                print0(line)
        if bar is not None:
            bar.update(1)
        if t.save_every and (step + 1) % t.save_every == 0 and not last:
            save(step + 1)
    if bar is not None:
        bar.close()
    if t.num_iterations > start_step:
        save(t.num_iterations)
    if rank == 0 and cfg.plot and os.path.exists(log.path):
        if plot_loss_curve(log.path, os.path.join(cfg.out_dir, "loss.png")):
            print(f"loss curve: {os.path.join(cfg.out_dir, 'loss.png')}")
    dist.destroy_process_group()
    return 0


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ConfigError, TrainingDiverged) as exc:
        print(f"error: {exc}", file=sys.stderr)
        if dist.is_initialized() and dist.get_world_size() > 1:
            from mpi4py import MPI
            MPI.COMM_WORLD.Abort(1)
        sys.exit(1)
