import os

import numpy as np
import pytest

from infini_train.data.shards import HEADER_BYTES, ShardError, find_shards, read_header, read_shard, write_shard


def test_round_trip_header_and_memmap(tmp_path):
    tokens = (np.arange(1000) * 97) % 65536
    path = str(tmp_path / "a.bin")
    write_shard(path, tokens)
    header = np.fromfile(path, dtype=np.int32, count=256)
    assert list(header[:3]) == [20240520, 1, 1000] and not header[3:].any()
    assert os.path.getsize(path) == HEADER_BYTES + 2 * 1000
    loaded = read_shard(path)
    assert isinstance(loaded, np.memmap) and loaded.dtype == np.uint16 and not loaded.flags.writeable
    np.testing.assert_array_equal(loaded, tokens)
    assert read_header(path) == 1000


def test_write_is_atomic_and_overwrites(tmp_path):
    path = str(tmp_path / "sub" / "a.bin")  # directories are created
    write_shard(path, [1, 2, 3])
    write_shard(path, [65535, 0])
    np.testing.assert_array_equal(read_shard(path), [65535, 0])
    assert os.listdir(tmp_path / "sub") == ["a.bin"]  # no temporary file left behind
    write_shard(str(tmp_path / "empty.bin"), [])
    assert len(read_shard(str(tmp_path / "empty.bin"))) == 0


def test_write_refuses_tokens_that_do_not_fit_uint16(tmp_path):
    with pytest.raises(ShardError, match=r"b.bin: expected token ids in \[0, 65536\) for uint16 shards, got ids "
                                         r"3..70000"):
        write_shard(str(tmp_path / "b.bin"), [3, 70000])
    with pytest.raises(ShardError, match=r"expected token ids in \[0, 65536\).*got ids -1..5"):
        write_shard(str(tmp_path / "b.bin"), [-1, 5])
    with pytest.raises(ShardError, match="expected integer token ids, got an array of dtype float64"):
        write_shard(str(tmp_path / "b.bin"), [1.5])
    assert not (tmp_path / "b.bin").exists()


@pytest.fixture
def raw(tmp_path):
    path = tmp_path / "s.bin"
    write_shard(str(path), np.arange(100))
    return path.read_bytes()


def test_bad_magic_names_file_expected_and_found(tmp_path, raw):
    bad = tmp_path / "bad_magic.bin"
    bad.write_bytes(np.int32(12345).tobytes() + raw[4:])
    with pytest.raises(ShardError, match=r"bad_magic.bin: bad magic number 12345, expected 20240520 \(llm.c token "
                                         r"shard\)\nHINT: "):
        read_shard(str(bad))
    bad.write_bytes(np.int32(20240326).tobytes() + raw[4:])
    with pytest.raises(ShardError, match="bad magic number 20240326 \\(that is llm.c's model-weights magic\\)"):
        read_shard(str(bad))


def test_bad_version(tmp_path, raw):
    ver = tmp_path / "bad_version.bin"
    ver.write_bytes(raw[:4] + np.int32(7).tobytes() + raw[8:])
    with pytest.raises(ShardError, match=r"bad_version.bin: unsupported shard version 7, expected 1\nHINT: "):
        read_shard(str(ver))


def test_truncated_and_count_mismatch(tmp_path, raw):
    cut = tmp_path / "cut.bin"
    cut.write_bytes(raw[:-10])
    with pytest.raises(ShardError, match=r"cut.bin: header says 100 tokens \(1224 bytes\) but the file has 1214 "
                                         r"bytes\nHINT: "):
        read_shard(str(cut))
    longer = tmp_path / "longer.bin"
    longer.write_bytes(raw + b"\0\0")
    with pytest.raises(ShardError, match="longer.bin: header says 100 tokens .* but the file has 1226 bytes"):
        read_shard(str(longer))
    tiny = tmp_path / "tiny.bin"
    tiny.write_bytes(raw[:100])
    with pytest.raises(ShardError, match="tiny.bin: 100 bytes, shorter than the 1024-byte llm.c shard header"):
        read_shard(str(tiny))
    with pytest.raises(ShardError, match="missing.bin: cannot read the token shard"):
        read_shard(str(tmp_path / "missing.bin"))


def test_find_shards_sorted_and_clear_when_empty(tmp_path):
    for name in ("train_000002.bin", "train_000000.bin", "train_000001.bin", "val_000000.bin"):
        write_shard(str(tmp_path / name), [1, 2])
    (tmp_path / "train_000003.bin.d").mkdir()  # directories never count
    found = find_shards(str(tmp_path / "train_*.bin*"))
    assert [os.path.basename(p) for p in found] == ["train_000000.bin", "train_000001.bin", "train_000002.bin"]
    with pytest.raises(ShardError, match=r"no token shards match '.*none_\*.bin'.*\nHINT: run "
                                         r"examples/gpt2/prepare_data.py"):
        find_shards(str(tmp_path / "none_*.bin"))


def test_find_shards_names_the_setting_the_pattern_came_from(tmp_path):
    missing = str(tmp_path / "nowhere" / "val_*.bin")
    with pytest.raises(ShardError, match=r"^data.val: no token shards match '.*nowhere/val_\*.bin' .*\nHINT: run "
                                         r"examples/gpt2/prepare_data.py, or point data.val at existing .bin shards, "
                                         r"or set data.val=null to skip validation$"):
        find_shards(missing, "data.val")
    with pytest.raises(ShardError, match=r"^data.train: no token shards match .*\nHINT: .*point data.train at "
                                         r"existing .bin shards$"):
        find_shards(str(tmp_path / "train_*.bin"), "data.train")
