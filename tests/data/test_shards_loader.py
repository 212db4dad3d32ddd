import json

import numpy as np
import pytest

from infini_train.data.corpus import prepare_shards, stdlib_documents
from infini_train.data.loader import DistributedDataLoader
from infini_train.data.shards import ShardError, read_shard, write_shard
from infini_train.data.tokenizer import ByteTokenizer, get_tokenizer


def test_shard_round_trip_and_header(tmp_path):
    tokens = np.arange(1000) % 65536
    path = tmp_path / "a.bin"
    write_shard(str(path), tokens)
    header = np.fromfile(path, dtype=np.int32, count=256)
    assert list(header[:3]) == [20240520, 1, 1000]
    np.testing.assert_array_equal(read_shard(str(path)), tokens)
    with pytest.raises(ShardError, match="expected token ids in"):
        write_shard(str(tmp_path / "b.bin"), [70000])


def test_corrupt_shards_name_the_file(tmp_path):
    path = tmp_path / "s.bin"
    write_shard(str(path), np.arange(100))
    raw = path.read_bytes()
    bad = tmp_path / "bad_magic.bin"
    bad.write_bytes(np.int32(20240326).tobytes() + raw[4:])
    with pytest.raises(ShardError, match="bad_magic.bin: bad magic number 20240326, expected 20240520"):
        read_shard(str(bad))
    ver = tmp_path / "bad_version.bin"
    ver.write_bytes(raw[:4] + np.int32(7).tobytes() + raw[8:])
    with pytest.raises(ShardError, match="bad_version.bin: unsupported shard version 7"):
        read_shard(str(ver))
    cut = tmp_path / "cut.bin"
    cut.write_bytes(raw[:-10])
    with pytest.raises(ShardError, match="cut.bin: header says 100 tokens"):
        read_shard(str(cut))
    tiny = tmp_path / "tiny.bin"
    tiny.write_bytes(raw[:100])
    with pytest.raises(ShardError, match="tiny.bin: 100 bytes, shorter than"):
        read_shard(str(tiny))
    with pytest.raises(ShardError, match="no token shards match"):
        DistributedDataLoader(str(tmp_path / "none_*.bin"), 2, 4)


def make_shards(tmp_path, sizes=(100, 80)):
    start = 0
    for i, n in enumerate(sizes):
        write_shard(str(tmp_path / f"train_{i:06d}.bin"), np.arange(start, start + n))
        start += n
    return str(tmp_path / "train_*.bin")


def test_loader_windows_shift_shard_switch_and_wrap(tmp_path):
    pattern = make_shards(tmp_path)
    loader = DistributedDataLoader(pattern, B=2, T=8)
    x, y = loader.next_batch()
    np.testing.assert_array_equal(x, np.arange(16).reshape(2, 8))
    np.testing.assert_array_equal(y, x + 1)
    seen = [x[0, 0]]
    for _ in range(12):
        seen.append(loader.next_batch()[0][0, 0])
    # shard 0 (100 tokens) yields 6 batches of 16 (the 7th would need token 112), then shard 1 starts at 100
    assert seen[:8] == [0, 16, 32, 48, 64, 80, 100, 116]
    assert seen[10] == 0  # wrapped around to shard 0 after shard 1's 4 batches


def test_loader_state_dict_resumes_exactly(tmp_path):
    pattern = make_shards(tmp_path)
    a = DistributedDataLoader(pattern, 2, 8)
    for _ in range(5):
        a.next_batch()
    state = json.loads(json.dumps(a.state_dict()))
    expect = [a.next_batch()[0] for _ in range(6)]
    b = DistributedDataLoader(pattern, 2, 8)
    b.load_state_dict(state)
    for e in expect:
        np.testing.assert_array_equal(b.next_batch()[0], e)


def test_two_ranks_read_disjoint_halves_of_the_global_batch(tmp_path):
    pattern = make_shards(tmp_path, (400,))
    full = DistributedDataLoader(pattern, B=4, T=8)
    r0 = DistributedDataLoader(pattern, B=2, T=8, rank=0, world_size=2)
    r1 = DistributedDataLoader(pattern, B=2, T=8, rank=1, world_size=2)
    for _ in range(5):
        x, _ = full.next_batch()
        np.testing.assert_array_equal(np.concatenate([r0.next_batch()[0], r1.next_batch()[0]]), x)


def test_loader_rejects_shards_smaller_than_a_batch(tmp_path):
    pattern = make_shards(tmp_path, (10,))
    with pytest.raises(ShardError, match="fewer than one global batch"):
        DistributedDataLoader(pattern, 2, 8)


def test_byte_tokenizer_round_trip_and_auto():
    tok = ByteTokenizer()
    ids = tok.encode("héllo\n")
    assert max(ids) < 256 and tok.decode(ids + [tok.eot_token]) == "héllo\n"
    assert get_tokenizer("auto").name in ("byte", "gpt2")
    with pytest.raises(ValueError, match="unknown tokenizer"):
        get_tokenizer("bpe")


def test_default_corpus_is_deterministic_and_prepares_shards(tmp_path):
    docs = stdlib_documents(50_000)
    assert docs == stdlib_documents(50_000) and sum(map(len, docs)) >= 50_000
    meta = prepare_shards(docs, str(tmp_path / "d"), "byte", shard_tokens=20_000)
    assert meta["tokenizer"] == "byte" and meta["vocab_size"] == 257
    loader = DistributedDataLoader(str(tmp_path / "d" / "train_*.bin"), 2, 16)
    assert loader.num_tokens() + meta["val_tokens"] == meta["num_tokens"]
    assert len(loader.files) >= 2
    assert (tmp_path / "d" / "meta.json").exists()
