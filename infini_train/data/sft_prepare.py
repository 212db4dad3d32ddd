"""JSONL files -> SFT shards (val_NNNNNN.sft, train_NNNNNN.sft) plus meta.json: what
``examples/gpt2/prepare_data.py --format chat|instruction|text`` runs.

    meta = prepare_sft_shards(["data/chat.jsonl"], "data/chat_sft", tokenizer, "chat", val_fraction=0.05)

The samples of the files (in order) are tokenized as SFTDataLoader tokenizes JSONL (infini_train.data.sft). The
validation split is ``val_samples`` samples (default: ``val_fraction`` of them, at least one when the fraction is
above 0) drawn with ``np.random.default_rng(split_seed)``, so a file sorted by topic or source still gives a
validation set like the rest; both splits keep the files' order. Each split is cut into shards of whole samples, at
most ``shard_tokens`` tokens each (a longer sample gets a shard of its own). With no validation split, the
training shards hold the files' samples in order, so SFTDataLoader reads the same batches from the shards as from
the JSONL. meta.json is written last: its presence marks a complete preparation.
"""
from __future__ import annotations

import glob
import json
import os

import numpy as np

from ..atomic_file import write_text_atomically
from .sft import SampleTable, eos_id, pad_id, uses_builtin_template
from .sft_records import check_format
from .sft_shards import SFT_SUFFIX, write_sft_shard

DEFAULT_SFT_SHARD_TOKENS = 100_000_000


def _val_count(n, val_fraction, val_samples):
    if val_samples is not None:
        n_val = int(val_samples)
        what = f"val_samples={val_samples}"
    else:
        if not 0 <= val_fraction < 1:
            raise ValueError(f"prepare_sft_shards: expected val_fraction in [0, 1), got {val_fraction}")
        n_val = max(int(n * val_fraction), 1) if val_fraction > 0 else 0
        what = f"val_fraction={val_fraction}"
    if not 0 <= n_val < n:
        raise ValueError(f"prepare_sft_shards: the validation split ({what}: {n_val} samples) must leave training "
                         f"samples of the {n} there are\nHINT: give more samples, or a smaller --val-samples / "
                         "--val-fraction (0: no validation split)")
    return n_val


def _write_split(out_dir, split, table, fmt, vocab_size, shard_tokens):
    """Write ``table`` as split_000000.sft, ... of whole samples, at most ``shard_tokens`` tokens each (at least one
    sample); remove stale shards of an earlier, larger preparation. Returns the paths."""
    paths, first, n = [], 0, len(table)
    while first < n or not paths:
        last = int(np.searchsorted(table.offsets, table.offsets[first] + shard_tokens, side="right")) - 1
        last = min(max(last, first + 1), n)
        paths.append(os.path.join(out_dir, f"{split}_{len(paths):06d}{SFT_SUFFIX}"))
        write_sft_shard(paths[-1], table.select(np.arange(first, last)), fmt, vocab_size)
        first = last
    for stale in sorted(set(glob.glob(os.path.join(out_dir, f"{split}_[0-9]*{SFT_SUFFIX}"))) - set(paths)):
        os.remove(stale)
    return paths


def prepare_sft_shards(paths, out_dir, tokenizer, fmt, val_fraction=0.05, val_samples=None,
                       shard_tokens=DEFAULT_SFT_SHARD_TOKENS, split_seed=0, extra_meta=None):
    """Tokenize the JSONL files ``paths`` (data.format ``fmt``) into out_dir's SFT shards and meta.json; returns
    the meta dict. See the module's docstring for the split."""
    check_format(fmt, "prepare_sft_shards format")
    if shard_tokens < 1:
        raise ValueError(f"prepare_sft_shards: expected shard_tokens >= 1, got {shard_tokens}")
    table = SampleTable.concatenate([SampleTable.from_jsonl(p, tokenizer, fmt) for p in paths], "inputs")
    n = len(table)
    n_val = _val_count(n, val_fraction, val_samples)
    is_val = np.zeros(n, dtype=bool)
    is_val[np.random.default_rng(split_seed).choice(n, n_val, replace=False)] = True
    val, train = table.select(np.flatnonzero(is_val)), table.select(np.flatnonzero(~is_val))
    os.makedirs(out_dir, exist_ok=True)
    vocab = int(tokenizer.vocab_size)
    val_paths = _write_split(out_dir, "val", val, fmt, vocab, shard_tokens) if n_val else []
    if not n_val:
        for stale in glob.glob(os.path.join(out_dir, f"val_[0-9]*{SFT_SUFFIX}")):
            os.remove(stale)
    train_paths = _write_split(out_dir, "train", train, fmt, vocab, shard_tokens)
    meta = {"format": fmt, "tokenizer": getattr(tokenizer, "name", type(tokenizer).__name__), "vocab_size": vocab,
            "eot_token": eos_id(tokenizer), "pad_token": pad_id(tokenizer),
            "chat_template": None if fmt == "text" else "builtin ChatML" if uses_builtin_template(tokenizer)
            else "tokenizer", "num_samples": n, "train_samples": len(train), "val_samples": len(val),
            "num_tokens": table.num_tokens, "train_tokens": train.num_tokens, "val_tokens": val.num_tokens,
            "trained_tokens": int(np.asarray(table.mask, dtype=np.int64).sum()), "train_shards": len(train_paths),
            "val_shards": len(val_paths), "split_seed": split_seed, **(extra_meta or {})}
    write_text_atomically(os.path.join(out_dir, "meta.json"), json.dumps(meta, indent=1))
    return meta
