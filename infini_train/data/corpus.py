"""The default corpus: text that ships with Python (the standard library's sources, docstrings and comments
included), so the default run needs no download. Deterministic for a given Python installation."""
from __future__ import annotations

import json
import os
import sysconfig

import numpy as np

from .shards import write_shard
from .tokenizer import get_tokenizer


def stdlib_documents(max_bytes):
    """Sorted .py files of the standard library (no tests, no site-packages), up to ``max_bytes``."""
    root = sysconfig.get_paths()["stdlib"]
    docs, total = [], 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "test", "tests", "idlelib",
                                                               "__pycache__", "lib2to3", "ensurepip"))
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            with open(os.path.join(dirpath, name), encoding="utf-8", errors="replace") as f:
                text = f.read()
            docs.append(text)
            total += len(text)
            if total >= max_bytes:
                return docs
    return docs


def prepare_shards(documents, out_dir, tokenizer_name="byte", val_fraction=0.05, shard_tokens=10_000_000):
    """Tokenize documents (each followed by EOT) into out_dir/{val,train}_NNNNNN.bin plus meta.json.

    The first ``val_fraction`` of the tokens is the validation split, as llm.c's data scripts do."""
    tok = get_tokenizer(tokenizer_name)
    ids = []
    for doc in documents:
        ids.extend(tok.encode(doc))
        ids.append(tok.eot_token)
    tokens = np.asarray(ids, dtype=np.uint16)
    n_val = max(int(len(tokens) * val_fraction), 1)
    os.makedirs(out_dir, exist_ok=True)
    write_shard(os.path.join(out_dir, "val_000000.bin"), tokens[:n_val])
    train = tokens[n_val:]
    for i, start in enumerate(range(0, len(train), shard_tokens)):
        write_shard(os.path.join(out_dir, f"train_{i:06d}.bin"), train[start:start + shard_tokens])
    meta = {"tokenizer": tok.name, "vocab_size": tok.vocab_size, "eot_token": tok.eot_token,
            "num_tokens": int(len(tokens)), "val_tokens": int(n_val)}
    tmp = os.path.join(out_dir, "meta.json.tmp")
    with open(tmp, "w") as f:
        json.dump(meta, f, indent=1)
    os.replace(tmp, os.path.join(out_dir, "meta.json"))
    return meta


def read_meta(pattern):
    """meta.json beside the shards of ``pattern`` (None when the shards came from elsewhere)."""
    path = os.path.join(os.path.dirname(pattern) or ".", "meta.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def ensure_default_data(data_cfg):
    """Build the stdlib corpus shards on first use when the configured shards are missing."""
    import glob
    if glob.glob(data_cfg.train) or data_cfg.source != "stdlib":
        return None
    out_dir = os.path.dirname(data_cfg.train)
    docs = stdlib_documents(data_cfg.max_corpus_bytes)
    tok = data_cfg.tokenizer if data_cfg.tokenizer != "auto" else "byte"
    return prepare_shards(docs, out_dir, tok)
