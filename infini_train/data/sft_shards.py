"""SFT shards: tokenized samples with their trained-token masks, written ahead of time by
``examples/gpt2/prepare_data.py --format chat|instruction|text`` and read by SFTDataLoader like the JSONL itself.

A shard (``train_000000.sft``) is little-endian:

    header   128 x int64 (1024 bytes): magic 20250611, version 1, samples n, tokens N, format (1 text, 2 chat,
             3 instruction), the tokenizer's vocab_size; the rest 0
    offsets  (n + 1) x int64: sample i is tokens offsets[i] .. offsets[i+1]; offsets[0] = 0, offsets[n] = N
    ids      N x uint32: token ids (Hugging Face vocabularies pass 65535: LLaMA-3 has 128256 tokens)
    mask     N x uint8: 1 on the tokens the loss is trained on (the assistant turns; every token of a text)

Samples are stored whole (truncation to train.sequence_length happens when they are read), and the mask is kept
apart from data.train_on_prompt, so one preparation serves any T and either setting.

    write_sft_shard("data/x/train_000000.sft", table, "chat", tokenizer.vocab_size)   # atomic
    table = read_sft_shard("data/x/train_000000.sft")    # a SampleTable of read-only memory maps, header validated
"""
from __future__ import annotations

import os

import numpy as np

from ..atomic_file import write_atomically
from .sft import SampleTable
from .shards import MAGIC as TOKEN_SHARD_MAGIC
from .shards import ShardError

SFT_MAGIC = 20250611
SFT_VERSION = 1
HEADER_INTS = 128
HEADER_BYTES = HEADER_INTS * 8
SFT_SUFFIX = ".sft"
FORMAT_CODES = {"text": 1, "chat": 2, "instruction": 3}
FORMAT_NAMES = {code: name for name, code in FORMAT_CODES.items()}


def shard_size(samples, tokens):
    """Bytes of a shard of ``samples`` samples and ``tokens`` tokens."""
    return HEADER_BYTES + 8 * (samples + 1) + 5 * tokens


def write_sft_shard(path, table, fmt, vocab_size):
    """Write a SampleTable as an SFT shard, atomically; ``fmt`` (text | chat | instruction) and ``vocab_size`` are
    recorded in the header and checked when it is read."""
    if fmt not in FORMAT_CODES:
        raise ShardError(f"write_sft_shard {path}: expected a format in {tuple(FORMAT_CODES)}, got {fmt!r}\n"
                         "HINT: token shards of data.format=tokens are written by write_shard")
    ids = np.asarray(table.ids)
    if ids.size and int(ids.max()) >= 2 ** 32:
        raise ShardError(f"write_sft_shard {path}: expected token ids below 2**32, got {int(ids.max())}")
    header = np.zeros(HEADER_INTS, dtype="<i8")
    header[:6] = [SFT_MAGIC, SFT_VERSION, len(table), table.num_tokens, FORMAT_CODES[fmt], int(vocab_size)]

    def write(tmp):
        with open(tmp, "wb") as f:
            f.write(header.tobytes())
            f.write(np.asarray(table.offsets, dtype="<i8").tobytes())
            f.write(np.asarray(table.ids, dtype="<u4").tobytes())
            f.write(np.asarray(table.mask, dtype=np.uint8).tobytes())

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_atomically(path, write)
    return path


def _bad(path, what, hint="the file is damaged or was cut off while copying; re-create it with "
                          "examples/gpt2/prepare_data.py"):
    raise ShardError(f"{path}: {what}\nHINT: {hint}")


def read_sft_header(path):
    """The validated header of an SFT shard: {"samples", "tokens", "format", "vocab_size"}."""
    try:
        size = os.path.getsize(path)
    except OSError as exc:
        _bad(path, f"cannot read the SFT shard ({exc.strerror or exc})",
             "check data.train / data.val, or run examples/gpt2/prepare_data.py --format chat ...")
    if size < HEADER_BYTES:
        _bad(path, f"{size} bytes, shorter than the {HEADER_BYTES}-byte SFT shard header")
    head = np.fromfile(path, dtype="<i8", count=HEADER_INTS)
    magic = int(head[0])
    if magic != SFT_MAGIC:
        int32_magic = int(np.frombuffer(head[:1].tobytes(), dtype="<i4")[0])
        if int32_magic == TOKEN_SHARD_MAGIC:
            _bad(path, f"an llm.c token shard (magic {TOKEN_SHARD_MAGIC}), expected an SFT shard (magic {SFT_MAGIC})",
                 "token shards are data.format=tokens; SFT shards (.sft) come from prepare_data.py --format chat | "
                 "instruction | text")
        _bad(path, f"bad magic number {magic}, expected {SFT_MAGIC} (SFT shard)",
             "point data.train / data.val at shards made by examples/gpt2/prepare_data.py --format chat ...")
    version, samples, tokens, code, vocab = (int(v) for v in head[1:6])
    if version != SFT_VERSION:
        _bad(path, f"unsupported SFT shard version {version}, expected {SFT_VERSION}",
             "re-create the shards with this version's examples/gpt2/prepare_data.py")
    if code not in FORMAT_NAMES:
        _bad(path, f"unknown format code {code} in the header, expected one of {FORMAT_NAMES}")
    expected = shard_size(samples, tokens) if samples >= 0 and tokens >= 0 else -1
    if size != expected:
        _bad(path, f"header says {samples} samples and {tokens} tokens ({expected} bytes) but the file has {size} "
                   "bytes")
    return {"samples": samples, "tokens": tokens, "format": FORMAT_NAMES[code], "vocab_size": vocab}


def read_sft_shard(path):
    """(SampleTable of read-only memory maps, header dict); the header and the offsets are validated."""
    header = read_sft_header(path)
    n, tokens = header["samples"], header["tokens"]
    offsets = np.fromfile(path, dtype="<i8", count=n + 1, offset=HEADER_BYTES)
    if offsets[0] != 0 or offsets[-1] != tokens or (n and np.any(np.diff(offsets) < 0)):
        _bad(path, f"sample offsets are not increasing from 0 to the {tokens} tokens of the header")
    start = HEADER_BYTES + 8 * (n + 1)
    if tokens:
        ids = np.memmap(path, dtype="<u4", mode="r", offset=start, shape=(tokens,))
        mask = np.memmap(path, dtype=np.uint8, mode="r", offset=start + 4 * tokens, shape=(tokens,))
    else:  # mmap cannot map zero bytes
        ids, mask = np.zeros(0, dtype=np.uint32), np.zeros(0, dtype=np.uint8)
    return SampleTable(ids, mask, offsets, path), header
