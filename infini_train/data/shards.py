"""llm.c token shards: a 256 x int32 header (magic 20240520, version 1, token count) then uint16 tokens.

The format of llm.c's ``dev/data/*.py`` scripts (fineweb, tinyshakespeare, ...), so shards made there load
here and the other way round.

    write_shard("data/x/train_000000.bin", tokens)   # atomic: temp file + os.replace
    tokens = read_shard("data/x/train_000000.bin")   # read-only np.memmap of uint16, header validated
    paths = find_shards("data/x/val_*.bin", "data.val")  # sorted; an error naming pattern and key if none
"""
from __future__ import annotations

import glob
import os

import numpy as np

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
MAX_TOKEN = 2 ** 16  # tokens are stored as uint16
MODEL_MAGIC = 20240326  # llm.c's model .bin files: a common mix-up


class ShardError(ValueError):
    """A token shard that cannot be written or read: names the file, what was expected and what was found."""


def write_shard(path, tokens):
    """Write ``tokens`` (integers in [0, 65536)) as an llm.c shard, atomically (temp file + os.replace)."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        tokens = tokens.reshape(-1)
    if tokens.size and not (np.issubdtype(tokens.dtype, np.integer) or tokens.dtype == np.bool_):
        raise ShardError(f"write_shard {path}: expected integer token ids, got an array of dtype {tokens.dtype}\n"
                         "HINT: tokenize the text first (infini_train.data.tokenizer.get_tokenizer)")
    if tokens.size:
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0 or high >= MAX_TOKEN:
            raise ShardError(f"write_shard {path}: expected token ids in [0, {MAX_TOKEN}) for uint16 shards, got "
                             f"ids {low}..{high}\nHINT: llm.c shards hold vocabularies of at most 65536 tokens "
                             "(GPT-2 has 50257)")
    if tokens.size >= 2 ** 31:
        raise ShardError(f"write_shard {path}: {tokens.size} tokens do not fit the int32 count of the header\n"
                         "HINT: split the tokens over several shards")
    header = np.zeros(HEADER_INTS, dtype=np.int32)
    header[:3] = [MAGIC, VERSION, tokens.size]
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(header.tobytes())
            f.write(tokens.astype("<u2", copy=False).tobytes())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def read_header(path):
    """Validate the shard's header against its size; returns its token count."""
    try:
        size = os.path.getsize(path)
    except OSError as exc:
        raise ShardError(f"{path}: cannot read the token shard ({exc.strerror or exc})\n"
                         "HINT: check data.train / data.val, or run examples/gpt2/prepare_data.py") from None
    if size < HEADER_BYTES:
        raise ShardError(f"{path}: {size} bytes, shorter than the {HEADER_BYTES}-byte llm.c shard header\n"
                         "HINT: the file is truncated or not a token shard; re-create it")
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    magic, version, count = int(header[0]), int(header[1]), int(header[2])
    if magic != MAGIC:
        what = " (that is llm.c's model-weights magic)" if magic == MODEL_MAGIC else ""
        raise ShardError(f"{path}: bad magic number {magic}{what}, expected {MAGIC} (llm.c token shard)\n"
                         "HINT: point data.train / data.val at token shards made by "
                         "examples/gpt2/prepare_data.py or llm.c's dev/data scripts")
    if version != VERSION:
        raise ShardError(f"{path}: unsupported shard version {version}, expected {VERSION}\n"
                         "HINT: version 1 holds uint16 tokens; re-create the shard with "
                         "examples/gpt2/prepare_data.py")
    expected = HEADER_BYTES + 2 * count
    if count < 0 or size != expected:
        raise ShardError(f"{path}: header says {count} tokens ({expected} bytes) but the file has {size} bytes\n"
                         "HINT: the shard was cut off while copying or writing; re-create it")
    return count


def read_shard(path):
    """The shard's tokens as a read-only uint16 memory map (nothing is read until it is indexed)."""
    count = read_header(path)
    if count == 0:
        return np.zeros(0, dtype=np.uint16)  # mmap cannot map zero bytes
    return np.memmap(path, dtype="<u2", mode="r", offset=HEADER_BYTES, shape=(count,))


def find_shards(pattern, config_key=None):
    """Paths matching the glob ``pattern``, sorted; a ShardError naming the pattern when none match.

    ``config_key``: the setting the pattern came from ("data.train", "data.val", "--data"), named in the error."""
    paths = sorted(p for p in glob.glob(os.path.expanduser(pattern)) if os.path.isfile(p))
    if not paths:
        raise ShardError(_no_match_message(pattern, config_key))
    return paths


def _no_match_message(pattern, config_key):
    where = f"{config_key}: " if config_key else ""
    target = config_key or "data.train / data.val"
    hint = f"run examples/gpt2/prepare_data.py, or point {target} at existing .bin shards"
    if config_key == "data.val":
        hint += ", or set data.val=null to skip validation"
    return (f"{where}no token shards match {pattern!r} (relative paths start at {os.getcwd()})\n"
            f"HINT: {hint}")
