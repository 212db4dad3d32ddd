"""Turning text into llm.c shards, and the default corpus that needs no download.

The default corpus is text that ships with Python: the standard library's ``.py`` sources (code, docstrings
and comments), taken in sorted path order up to a size cap, without tests, bundled wheels, codec tables or
build-specific files, then cut at blank lines into ~1 KB pieces put in a fixed pseudo-random order. The same
Python installation always gives the same bytes.

    docs = stdlib_documents(max_bytes=4_000_000)             # one str per file, sorted
    meta = prepare_shards(docs, "data/x", "byte")            # val_000000.bin, train_00000N.bin, meta.json
    meta = build_default_corpus("data/stdlib_byte", "byte")  # stdlib files cut at blank lines, shuffled
    meta = ensure_default_data(cfg)      # builds data.train's directory on first use when data.source == "stdlib"
    meta = read_meta("data/stdlib_byte/train_*.bin")          # meta.json beside the shards, or None

Layout follows llm.c's data scripts: every document is preceded by the end-of-text token, the first tokens
of the stream form the validation split and the rest the training split.
"""
from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import math
import os
import sys
import sysconfig
import time

import numpy as np

from ..progress import progress
from .shards import find_shards, write_shard
from .tokenizer import get_tokenizer

DEFAULT_MAX_BYTES = 4_000_000
DEFAULT_VAL_FRACTION = 0.05
DEFAULT_SHARD_TOKENS = 100_000_000  # llm.c's fineweb shard size
DEFAULT_CHUNK_CHARS = 1024
CORPUS_SEED = 1337
CORPUS_VERSION = 2  # bump when the default corpus's recipe changes: cached shards are then rebuilt
SKIP_DIRS = {"test", "tests", "idle_test", "idlelib", "turtledemo", "site-packages", "dist-packages", "__pycache__",
             "lib2to3", "ensurepip", "encodings", "__phello__"}


def stdlib_files(max_bytes=DEFAULT_MAX_BYTES):
    """Paths of the standard library's .py files in sorted order, until their sizes reach ``max_bytes``."""
    root = sysconfig.get_paths()["stdlib"]
    paths = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith(("config-", "."))]
        for name in filenames:
            # _sysconfigdata*: the build's compiler flags, different on every installation
            if name.endswith(".py") and not name.startswith("_sysconfigdata"):
                paths.append(os.path.relpath(os.path.join(dirpath, name), root))
    chosen, total = [], 0
    for rel in sorted(paths, key=lambda p: p.replace(os.sep, "/")):
        if total >= max_bytes:
            break
        path = os.path.join(root, rel)
        chosen.append(path)
        total += os.path.getsize(path)
    return chosen


def read_text(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def stdlib_documents(max_bytes=DEFAULT_MAX_BYTES):
    """The default corpus: one document per standard-library .py file, about ``max_bytes`` in all."""
    return [read_text(path) for path in stdlib_files(max_bytes)]


def split_documents(documents, min_chars=DEFAULT_CHUNK_CHARS):
    """Cut documents at blank lines into pieces of at least ``min_chars`` characters (a file's last piece
    may be shorter): functions, classes and paragraphs stay whole."""
    pieces = []
    for doc in documents:
        current = []
        size = 0
        for block in doc.split("\n\n"):
            current.append(block)
            size += len(block) + 2
            if size >= min_chars:
                pieces.append("\n\n".join(current))
                current, size = [], 0
        if current and any(block.strip() for block in current):
            pieces.append("\n\n".join(current))
    return pieces


def shuffled(items, seed=0):
    """``items`` in a pseudo-random order fixed by ``seed`` alone (sha256 of seed and index: the same on every
    platform and Python version)."""
    def key(i):
        return hashlib.sha256(f"{seed}:{i}".encode()).digest()
    return [items[i] for i in sorted(range(len(items)), key=key)]


def default_documents(max_bytes=DEFAULT_MAX_BYTES):
    """The default corpus as documents: the stdlib files cut into pieces of ~1 KB at blank lines, shuffled.

    Read in order, sorted files would make every step's batch come from one file and the validation split
    from other modules (the loader reads sequentially, as llm.c's does); shuffled pieces make consecutive
    batches, and the train and val splits, come from the same mix, so both losses fall together."""
    return shuffled(split_documents(stdlib_documents(max_bytes)), seed=CORPUS_SEED)


def tokenize_documents(documents, tokenizer):
    """One uint16 stream: EOT, doc 0, EOT, doc 1, ... (llm.c's layout: EOT starts every document). Documents
    are str, or bytes for a tokenizer that takes bytes (the byte tokenizer keeps them exactly)."""
    eot = np.array([tokenizer.eot_token], dtype=np.uint16)
    encode = getattr(tokenizer, "encode_array", None)
    parts = []
    for doc in progress(documents, desc="tokenizing the corpus", unit="doc"):
        parts.append(eot)
        parts.append(encode(doc) if encode else np.asarray(tokenizer.encode(doc), dtype=np.uint16))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)


def _write_split(out_dir, split, tokens, shard_tokens):
    """Write tokens as ``split_000000.bin ...``: ceil(n / shard_tokens) shards of near-equal size (so none is
    tiny); returns their paths after removing stale shards of an earlier, larger preparation."""
    n_shards = max(1, math.ceil(len(tokens) / shard_tokens))
    paths = []
    for i, part in enumerate(np.array_split(tokens, n_shards)):
        paths.append(os.path.join(out_dir, f"{split}_{i:06d}.bin"))
        write_shard(paths[-1], part)
    for stale in sorted(set(glob.glob(os.path.join(out_dir, f"{split}_[0-9]*.bin"))) - set(paths)):
        os.remove(stale)
    return paths


def prepare_shards(documents, out_dir, tokenizer_name="byte", val_fraction=DEFAULT_VAL_FRACTION,
                   shard_tokens=DEFAULT_SHARD_TOKENS, val_tokens=None, extra_meta=None):
    """Tokenize ``documents`` (str, or bytes for the byte tokenizer) into out_dir/val_NNNNNN.bin,
    out_dir/train_NNNNNN.bin and out_dir/meta.json.

    The first ``val_tokens`` tokens (default: ``val_fraction`` of all) are the validation split (none when 0),
    the rest the training split; each split is cut into shards of at most ``shard_tokens`` tokens.
    meta.json is written last, so its presence marks a complete preparation. Returns the meta dict.
    """
    tok = get_tokenizer(tokenizer_name) if isinstance(tokenizer_name, str) else tokenizer_name
    tokens = tokenize_documents(documents, tok)
    n = len(tokens)
    n_val = int(val_tokens) if val_tokens is not None else int(n * val_fraction)
    if val_tokens is None and val_fraction > 0:
        n_val = max(n_val, 1)
    if n_val < 0 or n_val >= n:
        raise ValueError(f"prepare_shards: the validation split needs fewer tokens than the {n} there are, "
                         f"got {n_val}\nHINT: give more text, or a smaller val_tokens / val_fraction")
    if shard_tokens < 1:
        raise ValueError(f"prepare_shards: expected shard_tokens >= 1, got {shard_tokens}")
    os.makedirs(out_dir, exist_ok=True)
    val_paths = _write_split(out_dir, "val", tokens[:n_val], shard_tokens) if n_val else []
    train_paths = _write_split(out_dir, "train", tokens[n_val:], shard_tokens)
    meta = {"tokenizer": tok.name, "vocab_size": tok.vocab_size, "eot_token": tok.eot_token,
            "num_tokens": int(n), "train_tokens": int(n - n_val), "val_tokens": int(n_val),
            "train_shards": len(train_paths), "val_shards": len(val_paths), "documents": len(documents),
            **(extra_meta or {})}
    tmp = os.path.join(out_dir, f".meta.json.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(meta, f, indent=1)
    os.replace(tmp, os.path.join(out_dir, "meta.json"))
    return meta


def build_default_corpus(out_dir, tokenizer="byte", max_bytes=DEFAULT_MAX_BYTES, **prepare_kwargs):
    """The default corpus's shards in ``out_dir`` (prepare_shards of default_documents); returns meta."""
    return prepare_shards(default_documents(max_bytes), out_dir, tokenizer, **prepare_kwargs, extra_meta={
        "source": "stdlib", "corpus_version": CORPUS_VERSION, "max_corpus_bytes": max_bytes,
        "files": len(stdlib_files(max_bytes)), "python": sys.version.split()[0],
        "stdlib": sysconfig.get_paths()["stdlib"]})


def read_meta(pattern):
    """meta.json beside the shards of ``pattern`` (None when there is none, e.g. shards made by llm.c)."""
    path = os.path.join(os.path.dirname(pattern) or ".", "meta.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


@contextlib.contextmanager
def _locked(directory):
    """An exclusive lock on directory/.prepare.lock: concurrent runs build the default corpus once."""
    os.makedirs(directory, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not POSIX: writes are still atomic file by file
        yield
        return
    with open(os.path.join(directory, ".prepare.lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _stale(meta, data):
    """Why a cached default corpus no longer matches the config (None when it does)."""
    if meta is None or meta.get("source") != "stdlib":
        return None  # not ours: never rebuilt
    if meta.get("corpus_version") != CORPUS_VERSION:
        return f"recipe version {meta.get('corpus_version')} -> {CORPUS_VERSION}"
    if meta.get("max_corpus_bytes") != data.max_corpus_bytes:
        return f"max_corpus_bytes {meta.get('max_corpus_bytes')} -> {data.max_corpus_bytes}"
    if data.tokenizer != "auto" and meta.get("tokenizer") != data.tokenizer:
        return f"tokenizer {meta.get('tokenizer')!r} -> {data.tokenizer!r}"
    return None


def ensure_default_data(config, log=print):
    """Build the default corpus's shards in data.train's directory when data.source is "stdlib" and they are
    missing (or were built by another recipe version, tokenizer or max_corpus_bytes). ``config``: a RunConfig or
    a DataConfig.

    Returns the meta dict of data.train's directory (None when it has no meta.json). Call it on one rank
    (rank 0) and barrier before the others open the shards.
    """
    data = getattr(config, "data", config)
    if data.source != "stdlib":
        return read_meta(data.train)
    out_dir = os.path.dirname(data.train) or "."
    meta = read_meta(data.train)
    if glob.glob(data.train) and meta is not None and _stale(meta, data) is None:
        return meta  # complete: meta.json is written last
    with _locked(out_dir):
        meta = read_meta(data.train)
        reason = _stale(meta, data)
        if glob.glob(data.train) and reason is None:
            return meta
        what = f"rebuilding ({reason})" if reason else "building"
        log(f"default corpus: {what} Python's standard library sources (up to {data.max_corpus_bytes:,} bytes) "
            f"into {out_dir}/ with the {data.tokenizer!r} tokenizer ...")
        t0 = time.perf_counter()
        meta = build_default_corpus(out_dir, data.tokenizer, data.max_corpus_bytes)
        log(f"default corpus: {meta['files']} files in {meta['documents']} pieces, {meta['num_tokens']:,} "
            f"tokens ({meta['train_tokens']:,} train, {meta['val_tokens']:,} val) in "
            f"{time.perf_counter() - t0:.1f} s")
    find_shards(data.train, "data.train")  # the pattern must match what was built (config validation checks the names)
    return meta
