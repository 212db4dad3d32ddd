import importlib.util
import json
import os

import numpy as np
import pytest

from infini_train.data.corpus import (
    CORPUS_VERSION,
    build_default_corpus,
    default_documents,
    ensure_default_data,
    prepare_shards,
    read_meta,
    shuffled,
    split_documents,
    stdlib_documents,
    stdlib_files,
    tokenize_documents,
)
from infini_train.data.loader import DistributedDataLoader
from infini_train.data.shards import find_shards, read_shard
from infini_train.data.tokenizer import ByteTokenizer
from infini_train.training.config import load_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = 60_000


def test_stdlib_documents_are_deterministic_sorted_and_capped():
    files = stdlib_files(SMALL)
    assert files == stdlib_files(SMALL) and files == stdlib_files(2 * SMALL)[:len(files)]
    assert all(f.endswith(".py") and os.sep + "test" + os.sep not in f for f in files)
    sizes = [os.path.getsize(f) for f in files]
    assert sum(sizes) >= SMALL and sum(sizes[:-1]) < SMALL  # stops at the file that reaches the cap
    docs = stdlib_documents(SMALL)
    assert docs == stdlib_documents(SMALL) and len(docs) == len(files)
    assert any('"""' in d for d in docs) and any("# " in d for d in docs)  # docstrings and comments included


def test_split_and_shuffle():
    doc = "a\n\nbb\n\n" + "c" * 50 + "\n\nd\n\n\n\ne"
    pieces = split_documents([doc], min_chars=10)
    assert pieces == ["a\n\nbb\n\n" + "c" * 50, "d\n\n\n\ne"]
    assert "\n\n".join(pieces) == doc
    assert split_documents(["x" * 100, "y"], min_chars=10) == ["x" * 100, "y"]
    items = list(range(50))
    order = shuffled(items, seed=3)
    assert sorted(order) == items and order != items and order == shuffled(items, seed=3)
    assert order != shuffled(items, seed=4)
    docs = default_documents(SMALL)
    assert docs == default_documents(SMALL)
    assert sorted("".join(docs)) == sorted("".join(split_documents(stdlib_documents(SMALL))))


def test_prepare_shards_layout(tmp_path):
    docs = ["first doc", "second", "x" * 500, "é"]
    out = tmp_path / "d"
    meta = prepare_shards(docs, str(out), "byte", val_tokens=20, shard_tokens=200)
    stream = tokenize_documents(docs, ByteTokenizer())
    assert stream[0] == 256 and int((stream == 256).sum()) == len(docs)  # EOT starts every document
    assert len(stream) == sum(len(d.encode()) for d in docs) + len(docs)
    val = np.concatenate([read_shard(p) for p in find_shards(str(out / "val_*.bin"))])
    train_paths = find_shards(str(out / "train_*.bin"))
    train = [np.asarray(read_shard(p)) for p in train_paths]
    np.testing.assert_array_equal(val, stream[:20])  # the first tokens are the validation split
    np.testing.assert_array_equal(np.concatenate(train), stream[20:])
    assert len(train) == 3 and max(map(len, train)) - min(map(len, train)) <= 1  # near-equal, none tiny
    on_disk = json.loads((out / "meta.json").read_text())
    assert on_disk == meta == read_meta(str(out / "train_*.bin"))
    assert {k: meta[k] for k in ("tokenizer", "vocab_size", "eot_token", "num_tokens", "val_tokens")} == \
        {"tokenizer": "byte", "vocab_size": 257, "eot_token": 256, "num_tokens": len(stream), "val_tokens": 20}
    assert meta["train_shards"] == 3 and meta["documents"] == 4
    # preparing again into the same directory leaves no stale shards of the earlier, larger split
    prepare_shards(docs, str(out), "byte", val_fraction=0.1)
    assert [os.path.basename(p) for p in find_shards(str(out / "*.bin"))] == ["train_000000.bin", "val_000000.bin"]
    assert sorted(os.listdir(out)) == ["meta.json", "train_000000.bin", "val_000000.bin"]
    meta = prepare_shards(docs, str(tmp_path / "noval"), "byte", val_fraction=0)
    assert meta["val_shards"] == 0 and not list((tmp_path / "noval").glob("val_*"))
    with pytest.raises(ValueError, match="the validation split needs fewer tokens than the 521 there are"):
        prepare_shards(docs, str(tmp_path / "e"), "byte", val_tokens=10_000)


def test_default_corpus_is_deterministic_bytes(tmp_path):
    a = build_default_corpus(str(tmp_path / "a"), "byte", SMALL, shard_tokens=30_000)
    b = build_default_corpus(str(tmp_path / "b"), "byte", SMALL, shard_tokens=30_000)
    assert a == b and a["source"] == "stdlib" and a["corpus_version"] == CORPUS_VERSION
    assert a["train_shards"] >= 2 and a["val_tokens"] == int(a["num_tokens"] * 0.05)
    for name in sorted(os.listdir(tmp_path / "a")):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    loader = DistributedDataLoader(str(tmp_path / "a" / "train_*.bin"), 4, 32)
    assert loader.num_tokens() == a["train_tokens"]
    assert int(loader.next_batch()[0].max()) <= 256


def data_cfg(tmp_path, *extra):
    d = tmp_path / "stdlib"
    return load_config(None, [f"data.train={d}/train_*.bin", f"data.val={d}/val_*.bin",
                              f"data.max_corpus_bytes={SMALL}", *extra])


def test_ensure_default_data_builds_once_then_reuses(tmp_path):
    cfg = data_cfg(tmp_path)
    logs = []
    meta = ensure_default_data(cfg, log=logs.append)
    assert meta["max_corpus_bytes"] == SMALL and meta["tokenizer"] == "byte"
    assert "default corpus: building" in logs[0] and "pieces" in logs[1]
    train = tmp_path / "stdlib" / "train_000000.bin"
    stamp = train.stat().st_mtime_ns
    assert ensure_default_data(cfg.data, log=logs.append) == meta  # a DataConfig works too
    assert len(logs) == 2 and train.stat().st_mtime_ns == stamp  # cached: not rebuilt
    DistributedDataLoader(cfg.data.val, 2, 16)
    bigger = data_cfg(tmp_path, f"data.max_corpus_bytes={2 * SMALL}")
    meta2 = ensure_default_data(bigger, log=logs.append)
    assert "rebuilding (max_corpus_bytes 60000 -> 120000)" in logs[2]
    assert meta2["num_tokens"] > meta["num_tokens"]


def test_ensure_default_data_leaves_other_data_alone(tmp_path):
    cfg = load_config(None, [f"data.train={tmp_path}/mine/*.bin", "data.val=null", "data.source=null"])
    assert ensure_default_data(cfg, log=print) is None
    assert not (tmp_path / "mine").exists()
    prepare_shards(["some text " * 50], str(tmp_path / "own"), "byte")
    meta = json.loads((tmp_path / "own" / "meta.json").read_text())
    cfg = data_cfg(tmp_path)
    cfg.data.train = str(tmp_path / "own" / "train_*.bin")  # shards of our own, no "source": never rebuilt
    assert ensure_default_data(cfg, log=print) == meta


def load_prepare_data():
    path = os.path.join(REPO, "examples", "gpt2", "prepare_data.py")
    spec = importlib.util.spec_from_file_location("prepare_data", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_prepare_data_script_default_corpus_and_files(tmp_path, capsys):
    script = load_prepare_data()
    out = tmp_path / "default"
    assert script.main(["--max-bytes", str(SMALL), "--out-dir", str(out)]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta == build_default_corpus(str(tmp_path / "same"), "byte", SMALL)  # the same recipe as a run uses
    assert (out / "train_000000.bin").exists() and (out / "val_000000.bin").exists()
    printed = capsys.readouterr().out
    assert f"data.train={out}/train_*.bin" in printed and "model.vocab_size=257" in printed

    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.txt").write_text("para one\n\npara two\n\n" * 200)
    (tmp_path / "texts" / "b.md").write_text("# title\nbody\n" * 100)
    files_out = tmp_path / "files"
    script.main([str(tmp_path / "texts" / "*.txt"), str(tmp_path / "texts"), "--out-dir", str(files_out),
                 "--split-on", "\n\n", "--val-tokens", "100", "--shard-tokens", "2000"])
    meta = json.loads((files_out / "meta.json").read_text())
    assert meta["val_tokens"] == 100 and meta["train_shards"] == 3 and meta["source"] == "files"
    assert meta["documents"] == 400 + 1  # a.txt cut into 400 paragraphs (listed once), b.md has no blank line
    val = read_shard(str(files_out / "val_000000.bin"))
    assert val[0] == 256 and ByteTokenizer().decode(val[1:9]) == "para one"
    with pytest.raises(SystemExit, match="no files match '.*nothing_\\*.txt'"):
        script.main([str(tmp_path / "nothing_*.txt"), "--out-dir", str(tmp_path / "x")])
