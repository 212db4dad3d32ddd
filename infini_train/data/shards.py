"""llm.c token shards: a 256 x int32 header (magic 20240520, version 1, token count) then uint16 tokens."""
from __future__ import annotations

import glob
import os

import numpy as np

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4


class ShardError(ValueError):
    pass


def write_shard(path, tokens):
    """Write tokens (< 65536) as an llm.c shard, atomically (temp file + rename)."""
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= 2 ** 16):
        raise ShardError(f"write_shard {path}: expected token ids in [0, 65536) for uint16 shards, got "
                         f"{int(tokens.min())}..{int(tokens.max())}")
    header = np.zeros(HEADER_INTS, dtype=np.int32)
    header[:3] = [MAGIC, VERSION, tokens.size]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype(np.uint16).tobytes())
    os.replace(tmp, path)


def read_header(path):
    size = os.path.getsize(path)
    if size < HEADER_BYTES:
        raise ShardError(f"{path}: {size} bytes, shorter than the {HEADER_BYTES}-byte llm.c shard header\n"
                         "HINT: the file is truncated or not a token shard")
    header = np.fromfile(path, dtype=np.int32, count=HEADER_INTS)
    if header[0] != MAGIC:
        raise ShardError(f"{path}: bad magic number {header[0]}, expected {MAGIC} (llm.c token shard)\n"
                         "HINT: model files (magic 20240326) are not data; prepare shards with "
                         "examples/gpt2/prepare_data.py")
    if header[1] != VERSION:
        raise ShardError(f"{path}: unsupported shard version {header[1]}, expected {VERSION}")
    count = int(header[2])
    expected = HEADER_BYTES + 2 * count
    if size != expected:
        raise ShardError(f"{path}: header says {count} tokens ({expected} bytes) but the file has {size} bytes\n"
                         "HINT: the shard was cut off while copying or writing; re-create it")
    return count


def read_shard(path):
    """The shard's tokens as a read-only uint16 memory map."""
    count = read_header(path)
    return np.memmap(path, dtype=np.uint16, mode="r", offset=HEADER_BYTES, shape=(count,))


def find_shards(pattern):
    paths = sorted(glob.glob(pattern))
    if not paths:
        raise ShardError(f"no token shards match {pattern!r}\nHINT: run examples/gpt2/prepare_data.py, or point "
                         "data.train / data.val at existing .bin shards")
    return paths
