"""SFTDataLoader: batches of supervised fine-tuning samples (data.format text | chat | instruction) from JSONL files or
from the SFT shards of examples/gpt2/prepare_data.py, packed or padded into (B, T) rows.

    loader = SFTDataLoader("data/chat.jsonl", tokenizer, B=8, T=512, rank=rank, world_size=world,
                           format="chat", packing=True, seed=0, config_key="data.train")
    batch = loader.next_batch()       # SFTBatch of int64 (B, T) arrays: inputs, targets, positions, segments
    state = loader.state_dict()       # {"epoch": 0, "row": 48, ...}, JSON-serialisable; load_state_dict resumes there
    loader.stats()                    # samples, truncated, skipped, the share of non-pad tokens ...
    print(loader.summary())           # one line of those, for the run's log

Samples (infini_train.data.sft) are tokenized once, when the loader is made. A sample longer than T keeps its first
T tokens (counted in ``truncated``); a sample left with no trained target (nothing but prompt, or its answer cut off)
is left out (counted in ``skipped``). Each epoch takes the other samples in the order of a permutation drawn from
``np.random.default_rng([seed, epoch])`` (file order with shuffle=False) and lays them out in rows of T tokens:

- ``packing=True``: greedily, whole samples one after another in a row while they fit; the next sample that does
  not fit starts a new row. A row's unused tail is padding.
- ``packing=False``: one sample per row, padded.

The rows of the epochs follow one another as one stream; a global batch is the next B * world_size rows of it (it
may reach into the next epoch), and rank r gets rows [r*B, (r+1)*B) of it. So world_size ranks with batch B read
exactly what one rank with batch B * world_size reads; the layout is computed alike on every rank.

Batch fields (SFTBatch, each int64 of shape (B, T)):

    inputs     token ids; pad_token_id (else the end-of-sequence id) on padding
    targets    the next token's label: targets[i] = labels[i+1] within a sample; -1 on masked (prompt) tokens,
               on each sample's last position and on padding (-1 is the ignore index of the loss, not HF's -100)
    positions  0, 1, 2, ... restarting at every sample; 0 on padding (position ids of the rotary / learned embedding)
    segments   1, 2, 3, ... numbering the samples of a row; 0 on padding

Attention rule: position i attends to position j iff segments[i] == segments[j] != 0 and j <= i (causal within a
sample, never across samples); a padding position attends to itself only. With one sample per row and no padding
this is plain causal attention.
"""
from __future__ import annotations

import glob
import os
from typing import NamedTuple

import numpy as np

from .loader import check_int, check_rank
from .sft import SampleTable, labels_of, pad_id
from .sft_records import SFTDataError, check_format
from .sft_shards import SFT_SUFFIX, read_sft_shard
from .shards import MAGIC as TOKEN_SHARD_MAGIC

LAYOUTS_KEPT = 4  # the most recently used epochs whose row layout is cached (a small set wraps through many)


class SFTBatch(NamedTuple):
    inputs: np.ndarray
    targets: np.ndarray
    positions: np.ndarray
    segments: np.ndarray


def pack_rows(lengths, T, packing):
    """Where each row starts in a sequence of samples of ``lengths`` (each <= T): int64 (rows + 1,) indices; row k
    holds samples starts[k] .. starts[k+1]-1. One sample per row unless ``packing``."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if not packing:
        return np.arange(len(lengths) + 1, dtype=np.int64)
    starts, used = [0], 0
    for k, length in enumerate(lengths.tolist()):
        if used + length > T:
            starts.append(k)
            used = 0
        used += length
    if len(lengths):
        starts.append(len(lengths))
    return np.asarray(starts, dtype=np.int64)


def find_sft_files(pattern, config_key=None):
    """(sorted paths matching ``pattern``, "jsonl" | "shards"); an SFTDataError naming the setting when none match,
    when token shards (.bin) are named, or when JSONL files and SFT shards are mixed."""
    where = f"{config_key}: " if config_key else ""
    paths = sorted(p for p in glob.glob(os.path.expanduser(pattern)) if os.path.isfile(p))
    if not paths:
        raise SFTDataError(f"{where}no files match {pattern!r} (relative paths start at {os.getcwd()})\nHINT: point "
                           f"{config_key or 'data.train / data.val'} at .jsonl files or at the .sft shards of "
                           "examples/gpt2/prepare_data.py --format chat | instruction | text")
    shards = [p.endswith(SFT_SUFFIX) for p in paths]
    tokens = [p for p in paths if p.endswith(".bin") or _is_token_shard(p)]
    if tokens:
        raise SFTDataError(f"{where}{tokens[0]} is an llm.c token shard (.bin), expected JSONL or SFT shards (.sft) "
                           f"for SFT data\nHINT: token shards are read with data.format=tokens")
    if any(shards) and not all(shards):
        raise SFTDataError(f"{where}{pattern!r} matches both SFT shards ({paths[shards.index(True)]}) and other files "
                           f"({paths[shards.index(False)]})\nHINT: name either the .jsonl files or the .sft shards")
    return paths, "shards" if shards[0] else "jsonl"


def _is_token_shard(path):
    with open(path, "rb") as f:
        head = f.read(4)
    return len(head) == 4 and int(np.frombuffer(head, dtype="<i4")[0]) == TOKEN_SHARD_MAGIC


_NAME = "SFTDataLoader"


class SFTDataLoader:
    """Batches of (B, T) rows of SFT samples; rank ``rank`` of ``world_size`` reads its B rows of each global batch.

    ``format``: text | chat | instruction (for shards, the format they were prepared with). ``train_on_prompt``:
    train on every token, not only the assistant turns. ``config_key`` names the setting the pattern came from in
    errors. See the module's docstring for the layout, the batch fields and the attention rule."""

    global_position = True  # state_dict() is the same on every rank (a checkpoint keeps one)

    def __init__(self, path_or_pattern, tokenizer, B, T, rank=0, world_size=1, *, format, packing=True,
                 train_on_prompt=False, seed=0, shuffle=True, config_key=None):
        self.pattern = path_or_pattern
        self.B, self.T = check_int(_NAME, "B", B, 1), check_int(_NAME, "T", T, 2)
        self.rank, self.world_size = check_rank(_NAME, rank, world_size)
        self.seed = check_int(_NAME, "seed", seed, 0)
        self.format = check_format(format, config_key.rpartition(".")[0] + ".format" if config_key else "format")
        self.packing, self.train_on_prompt, self.shuffle = bool(packing), bool(train_on_prompt), bool(shuffle)
        self.files, self.kind = find_sft_files(path_or_pattern, config_key)
        self.tables = [self._read(path, tokenizer) for path in self.files]
        self.pad = pad_id(tokenizer)
        self._index_samples()
        self._layouts = {}
        self.reset()

    def _read(self, path, tokenizer):
        if self.kind == "jsonl":
            return SampleTable.from_jsonl(path, tokenizer, self.format)
        table, header = read_sft_shard(path)
        if header["format"] != self.format:
            raise SFTDataError(f"{path}: an SFT shard prepared with --format {header['format']}, but the loader reads "
                               f"format {self.format!r}\nHINT: set data.format={header['format']} for these shards",
                               path)
        vocab = getattr(tokenizer, "vocab_size", None)
        if vocab is not None and header["vocab_size"] != int(vocab):
            raise SFTDataError(f"{path}: an SFT shard prepared with a tokenizer of vocab_size {header['vocab_size']}, "
                               f"but the loader's tokenizer has {vocab}\nHINT: use the tokenizer the shards were "
                               "prepared with (their meta.json names it), or prepare them again", path)
        return table

    def _index_samples(self):
        counts = [len(t) for t in self.tables]
        self.table_starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        lengths = np.concatenate([t.lengths for t in self.tables]).astype(np.int64)
        trained = np.concatenate([t.trained_within(self.T, self.train_on_prompt) for t in self.tables])
        self.kept = np.minimum(lengths, self.T)
        self.num_samples = int(len(lengths))
        self.num_truncated = int((lengths > self.T).sum())
        self.used = np.flatnonzero(trained > 0)
        self.num_trained = int(trained.sum())  # the targets an epoch trains (the samples left out have none)
        self.num_skipped = self.num_samples - len(self.used)
        if not len(self.used):
            raise SFTDataError(f"{self.pattern}: none of the {self.num_samples} samples has a trained token within "
                               f"T={self.T} tokens (all {self.num_skipped} skipped)\nHINT: check that the "
                               "conversations have assistant messages, raise train.sequence_length, or set "
                               "data.train_on_prompt=true", self.files[0])

    def _layout(self, epoch):
        """(order of the samples, row starts into it) of ``epoch``, computed alike on every rank."""
        layout = self._layouts.pop(epoch, None)
        if layout is None:
            order = self.used
            if self.shuffle:
                order = order[np.random.default_rng([self.seed, epoch]).permutation(len(order))]
            layout = (order, pack_rows(self.kept[order], self.T, self.packing))
        self._layouts[epoch] = layout  # the most recently used last (dicts keep insertion order)
        while len(self._layouts) > LAYOUTS_KEPT:
            del self._layouts[next(iter(self._layouts))]
        return layout

    def rows_in_epoch(self, epoch=None):
        """Rows of T tokens that ``epoch`` (default: the current one) is laid out in."""
        return len(self._layout(self.epoch if epoch is None else epoch)[1]) - 1

    def _locate(self, epoch, row):
        """(epoch, row) of the row ``row`` rows after the start of ``epoch`` in the stream of epochs."""
        while row >= self.rows_in_epoch(epoch):
            row -= self.rows_in_epoch(epoch)
            epoch += 1
        return epoch, row

    def reset(self):
        """Go back to the first batch of the first epoch."""
        self.epoch, self.row = 0, 0

    def _sample(self, index):
        t = int(np.searchsorted(self.table_starts, index, side="right")) - 1
        ids, mask = self.tables[t][index - int(self.table_starts[t])]
        kept = int(self.kept[index])
        return ids[:kept], mask[:kept]

    def next_batch(self):
        """The next SFTBatch: this rank's B rows of the next global batch."""
        B, T = self.B, self.T
        inputs = np.full((B, T), self.pad, dtype=np.int64)
        targets = np.full((B, T), -1, dtype=np.int64)
        positions = np.zeros((B, T), dtype=np.int64)
        segments = np.zeros((B, T), dtype=np.int64)
        for b in range(B):
            epoch, row = self._locate(self.epoch, self.row + self.rank * B + b)
            order, starts = self._layout(epoch)
            at = 0
            for segment, index in enumerate(order[starts[row]:starts[row + 1]].tolist(), 1):
                ids, mask = self._sample(index)
                n = len(ids)
                inputs[b, at:at + n] = ids
                targets[b, at:at + n - 1] = labels_of(ids, mask, self.train_on_prompt)[1:]
                positions[b, at:at + n] = np.arange(n)
                segments[b, at:at + n] = segment
                at += n
        self.epoch, self.row = self._locate(self.epoch, self.row + B * self.world_size)
        return SFTBatch(inputs, targets, positions, segments)

    def state_dict(self):
        """Where the next global batch starts, the same on every rank and JSON-serialisable: {"epoch", "row"} plus
        what the row index depends on (samples, T, packing, seed, train_on_prompt, shuffle), checked on load."""
        return {"epoch": int(self.epoch), "row": int(self.row), **self._layout_key()}

    def _layout_key(self):
        return {"samples": self.num_samples, "sequence_length": self.T, "packing": self.packing, "seed": self.seed,
                "train_on_prompt": self.train_on_prompt, "shuffle": self.shuffle}

    def load_state_dict(self, state):
        """Continue from a state_dict(): the following batches equal those the saving loader would have read (with
        any B and world size: the position counts rows of the stream, not batches)."""
        try:
            epoch, row = int(state["epoch"]), int(state["row"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"SFTDataLoader.load_state_dict: expected {{'epoch': int, 'row': int, ...}}, got "
                             f"{state!r}\nHINT: a state of DistributedDataLoader ({{'shard', 'position'}}) comes from "
                             "a run of data.format=tokens") from None
        changed = [f"{key} {state[key]!r} -> {value!r}" for key, value in self._layout_key().items()
                   if key in state and state[key] != value]
        if changed:
            raise ValueError(f"SFTDataLoader.load_state_dict: the saved position is a row of another layout of the "
                             f"samples ({', '.join(changed)})\nHINT: resume with the same data, "
                             "train.sequence_length, data.packing, data.train_on_prompt and seed")
        if epoch < 0 or not 0 <= row < self.rows_in_epoch(epoch):
            raise ValueError(f"SFTDataLoader.load_state_dict: row {row} of epoch {epoch} is outside the epoch's "
                             f"{self.rows_in_epoch(max(epoch, 0))} rows\nHINT: the run was saved with other data; "
                             f"point the loader at the same files ({self.pattern!r} now)")
        self.epoch, self.row = epoch, row

    def stats(self):
        """{"samples", "used", "truncated", "skipped", "tokens" (of the used samples, after truncation), "trained"
        (their targets the loss trains), "epoch", "rows" (of the current epoch), "fill" (the share of non-pad tokens in
        those rows)}."""
        tokens = int(self.kept[self.used].sum())
        rows = self.rows_in_epoch()
        return {"samples": self.num_samples, "used": len(self.used), "truncated": self.num_truncated,
                "skipped": self.num_skipped, "tokens": tokens, "trained": self.num_trained, "epoch": self.epoch,
                "rows": rows, "fill": tokens / (rows * self.T)}

    def summary(self):
        """One line for the run's log: the counts and how full the rows are."""
        s = self.stats()
        return (f"{self.format} data {self.pattern}: {s['samples']:,} samples, {s['truncated']:,} truncated to "
                f"T={self.T}, {s['skipped']:,} skipped (no trained token); {s['tokens']:,} tokens in {s['rows']:,} "
                f"{'packed' if self.packing else 'padded'} rows per epoch, {100 * s['fill']:.1f}% not padding")

    def __repr__(self):
        return (f"SFTDataLoader({self.pattern!r}, B={self.B}, T={self.T}, rank={self.rank}, world_size="
                f"{self.world_size}, format={self.format!r}, packing={self.packing}, samples={self.num_samples})")
