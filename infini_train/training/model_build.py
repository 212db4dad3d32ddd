"""Building a run's model on this rank: constructed on the meta device (shapes only, its init calls recorded), laid
out by its spec's plan (``spec.parallelize``: every split, stage, shard and wrapper of the layout, in one declared
order: models/parallelize.py), then given storage for just this rank's part and filled with the values the
one-process build would hold there -- the seeded init replayed (keeping this rank's elements), the pretrained
weights' boxes it keeps, or nothing when a checkpoint fills it (resuming). So no rank ever holds the whole model.

A LoRA run's base weights are read from their source the same way, each rank reading only the boxes it keeps; a
seeded base, without ``lora.init_from``, is built whole (its pin hashes every value in name order).
"""
from __future__ import annotations

import contextlib
import os

from .. import backend
from ..data.corpus import read_meta
from ..data.tokenizer import hf_name
from ..models import registry
from ..nn.lora import LoRAError
from ..nn.parallel.sharded_init import recording_inits, replay_inits
from ..models.parallelize import LayoutError
from .config import ConfigError
from .parallel_dims import ParallelDims
from .lora_run import (BaseWeights, base_source, checked_base, load_base_pieces, load_pretrained_pieces, prepare_base,
                       restore_base)


def tokenizer_name(cfg):
    """(tokenizer name, vocabulary the data needs or 0) of the run's data."""
    meta = read_meta(cfg.data.train)
    if meta and cfg.data.tokenizer not in ("auto", meta["tokenizer"]):
        raise ConfigError(f"data.tokenizer: the shards under {os.path.dirname(cfg.data.train)} were made with "
                          f"{meta['tokenizer']!r}, but the config says {cfg.data.tokenizer!r}\nHINT: set "
                          f"data.tokenizer={meta['tokenizer']} or re-run prepare_data.py")
    if meta:
        return meta["tokenizer"], meta["vocab_size"]
    pretrained = cfg.model.pretrained
    if cfg.data.tokenizer == "auto" and pretrained and os.path.isfile(os.path.join(pretrained, "tokenizer.json")):
        return hf_name(pretrained), 0  # the pretrained model's own tokenizer
    return cfg.data.tokenizer, 0


def build_model(cfg, device, dims=None, lora_reference=None, resuming=False):
    """(ParallelPlan whose ``model`` is this rank's part, filled; tokenizer name; BaseWeights of a LoRA run or None).
    ``dims``: the run's ParallelDims (default: a world of one's); ``lora_reference``: a resumed LoRA checkpoint's
    record, whose pinned base is restored instead of reading ``lora.init_from`` afresh; ``resuming``: a checkpoint
    fills the model."""
    dims = dims if dims is not None else ParallelDims()
    model_cfg = cfg.model.to_model_config()
    tok_name, vocab_needed = tokenizer_name(cfg)
    if vocab_needed > model_cfg.vocab_size:
        raise ConfigError(f"model.vocab_size: the data's tokenizer has {vocab_needed} tokens, more than the "
                          f"model's vocab_size {model_cfg.vocab_size}\nHINT: set model.vocab_size >= {vocab_needed}")
    backend.manual_seed(cfg.seed)  # the same init on every rank (DDP also broadcasts rank 0's weights)
    spec = registry.model_spec(cfg.model.arch)
    lora = bool(cfg.lora.rank)
    source = base_source(cfg.lora, lora_reference) if lora else None
    on_meta = not lora or source is not None
    base = None
    with backend.META if on_meta else contextlib.nullcontext(), recording_inits() as init_calls:
        model = like = spec.model_class(model_cfg)
        if "mtp" in model._modules:  # DeepSeek-V3's multi-token prediction: its loss weight (chunks share it)
            model.mtp_loss_weight = cfg.train.mtp_loss_weight
        if not on_meta:
            model.to(device=device, dtype=cfg.dtype)
        shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        if lora and not on_meta:
            base = restore_base(model, lora_reference) if lora_reference else prepare_base(model, None)
        try:
            plan = spec.parallelize(model, dims, cfg)
        except LayoutError as exc:
            raise ConfigError(str(exc)) from None
        except LoRAError as exc:
            raise ConfigError(f"lora.target_modules: {exc}") from None
    if on_meta:
        _fill(plan, cfg, device, init_calls, like, shapes, resuming)
        if lora:  # the base's boxes this rank keeps, read from its source
            digest = load_base_pieces(plan.model, source, like, shapes, *plan.tensor_rank)
            base = (checked_base(lora_reference, source, lambda: digest) if lora_reference
                    else BaseWeights(os.path.abspath(cfg.lora.init_from), source, digest))
    return plan, tok_name, base


def _fill(plan, cfg, device, init_calls, like, shapes, resuming):
    """Give this rank's part of the meta-built model storage on ``device`` and its values."""
    model = plan.model
    model.to_empty(device=device).to(dtype=cfg.dtype)
    if resuming:  # the checkpoint fills every element but a split vocabulary's padding, which stays zero
        for p in model.parameters():
            if p.placement.flat_shard is None:  # shards start zero-filled
                p.array[...] = 0
    elif cfg.model.pretrained and not cfg.lora.rank:  # full fine-tuning: this rank's boxes of the weights
        load_pretrained_pieces(model, cfg.model.pretrained, like, shapes, *plan.tensor_rank)
    else:
        replay_inits(init_calls, model, *plan.tensor_rank)


__all__ = ["build_model", "tokenizer_name"]
