import itertools
import json

import numpy as np
import pytest

from infini_train.data import loader as loader_module
from infini_train.data.loader import DistributedDataLoader, ShardTooSmall
from infini_train.data.shards import ShardError, read_shard, write_shard


def make_shards(tmp_path, sizes):
    """Shards holding consecutive integers, so a token's value is its global index."""
    start = 0
    for i, n in enumerate(sizes):
        write_shard(str(tmp_path / f"train_{i:06d}.bin"), np.arange(start, start + n))
        start += n
    return str(tmp_path / "train_*.bin")


def expected_starts(sizes, global_batch):
    """Reference order (llm.c's train_gpt2.py, one rank): each shard yields windows at 0, G, 2G, ... while
    G + 1 tokens fit, then the next shard, cycling forever. Yields global token indices."""
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    for shard in itertools.cycle(range(len(sizes))):
        pos = 0
        while pos + global_batch + 1 <= sizes[shard]:
            yield int(offsets[shard] + pos)
            pos += global_batch


def test_batches_are_token_windows_and_y_is_x_shifted(tmp_path):
    loader = DistributedDataLoader(make_shards(tmp_path, (100, 80)), B=2, T=8)
    x, y = loader.next_batch()
    assert x.dtype == np.int64 and y.dtype == np.int64 and x.shape == y.shape == (2, 8)
    np.testing.assert_array_equal(x, np.arange(16).reshape(2, 8))
    np.testing.assert_array_equal(y, np.arange(1, 17).reshape(2, 8))
    assert not np.shares_memory(x, y)


def test_shard_switching_and_wrap_around(tmp_path):
    sizes = (100, 80, 50)
    loader = DistributedDataLoader(make_shards(tmp_path, sizes), B=2, T=8)
    ref = expected_starts(sizes, 16)
    starts = []
    for _ in range(30):
        x, y = loader.next_batch()
        np.testing.assert_array_equal(x.ravel(), np.arange(x[0, 0], x[0, 0] + 16))
        np.testing.assert_array_equal(y, x + 1)
        starts.append(int(x[0, 0]))
    assert starts == [next(ref) for _ in range(30)]
    # shard 0 (100 tokens) gives 6 batches (a 7th would need token 112), shard 1 starts at token 100 and gives 4,
    # shard 2 (50 tokens) 3, then the loader wraps around to shard 0
    assert starts[:14] == [0, 16, 32, 48, 64, 80, 100, 116, 132, 148, 180, 196, 212, 0]


def test_reset_goes_back_to_the_first_batch(tmp_path):
    loader = DistributedDataLoader(make_shards(tmp_path, (100, 80)), B=2, T=8)
    first = loader.next_batch()[0]
    for _ in range(8):
        loader.next_batch()
    assert loader.state_dict()["shard"] == 1
    loader.reset()
    assert loader.state_dict() == {"shard": 0, "position": 0}
    np.testing.assert_array_equal(loader.next_batch()[0], first)


@pytest.mark.parametrize("steps_before", [0, 3, 5, 6, 9, 13, 20])
def test_state_dict_resume_gives_identical_batches(tmp_path, steps_before):
    pattern = make_shards(tmp_path, (100, 80, 50))
    a = DistributedDataLoader(pattern, 2, 8)
    for _ in range(steps_before):
        a.next_batch()
    state = json.loads(json.dumps(a.state_dict()))  # JSON-serialisable, as a checkpoint stores it
    assert set(state) == {"shard", "position"}
    expect = [a.next_batch() for _ in range(15)]
    b = DistributedDataLoader(pattern, 2, 8)
    b.load_state_dict(state)
    for ex, ey in expect:
        x, y = b.next_batch()
        np.testing.assert_array_equal(x, ex)
        np.testing.assert_array_equal(y, ey)


def test_load_state_dict_rejects_states_of_other_data(tmp_path):
    loader = DistributedDataLoader(make_shards(tmp_path, (100, 80)), 2, 8)
    with pytest.raises(ValueError, match="shard 5 is out of range: 2 shards match"):
        loader.load_state_dict({"shard": 5, "position": 0})
    with pytest.raises(ValueError, match="position 500 is outside shard .*train_000001.bin \\(80 tokens\\)"):
        loader.load_state_dict({"shard": 1, "position": 500})
    with pytest.raises(ValueError, match="expected \\{'shard': int, 'position': int\\}"):
        loader.load_state_dict({"position": 3})


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_read_disjoint_slices_whose_union_is_the_one_rank_batch(tmp_path, world):
    sizes = (200, 130, 97)  # batch boundaries cross shards and wrap around within the steps below
    pattern = make_shards(tmp_path, sizes)
    B, T = 2, 8
    full = DistributedDataLoader(pattern, B=B * world, T=T)
    ranks = [DistributedDataLoader(pattern, B=B, T=T, rank=r, world_size=world) for r in range(world)]
    ref = expected_starts(sizes, B * T * world)
    for step in range(25):
        x, y = full.next_batch()
        parts = [r.next_batch() for r in ranks]
        np.testing.assert_array_equal(np.concatenate([p[0] for p in parts]), x, err_msg=f"step {step}")
        np.testing.assert_array_equal(np.concatenate([p[1] for p in parts]), y, err_msg=f"step {step}")
        assert x[0, 0] == next(ref)
        firsts = [int(p[0][0, 0]) for p in parts]
        assert firsts == [int(x[0, 0]) + r * B * T for r in range(world)]  # rank r: position + r*B*T
        assert len({r.state_dict()["position"] for r in ranks} | {full.state_dict()["position"]}) == 1


def test_shard_smaller_than_one_global_batch_is_a_clear_error(tmp_path):
    pattern = make_shards(tmp_path, (100, 30))
    DistributedDataLoader(pattern, 2, 8)  # 17 tokens fit
    with pytest.raises(ShardError, match=r"train_000001.bin: 30 tokens, fewer than one global batch needs "
                                         r"\(B\*T\*world_size \+ 1 = 2\*8\*2 \+ 1 = 33\)\nHINT: lower"):
        DistributedDataLoader(pattern, 2, 8, rank=1, world_size=2)


def test_bad_arguments(tmp_path):
    pattern = make_shards(tmp_path, (100,))
    with pytest.raises(ValueError, match=r"expected rank in \[0, 2\), got 2"):
        DistributedDataLoader(pattern, 2, 8, rank=2, world_size=2)
    with pytest.raises(ValueError, match="expected B to be an integer >= 1, got 0"):
        DistributedDataLoader(pattern, 0, 8)
    with pytest.raises(ShardError, match="no token shards match"):
        DistributedDataLoader(str(tmp_path / "none_*.bin"), 2, 4)
    loader = DistributedDataLoader(pattern, 2, 8)
    assert loader.num_tokens() == 100 and len(loader.files) == 1 and "B=2, T=8" in repr(loader)


@pytest.fixture
def opened(monkeypatch):
    """The paths the loader maps, in order."""
    paths = []

    def recording_read_shard(path):
        paths.append(path)
        return read_shard(path)
    monkeypatch.setattr(loader_module, "read_shard", recording_read_shard)
    return paths


def test_lazy_loader_opens_a_shard_only_when_a_batch_is_read_from_it(tmp_path, opened):
    pattern = make_shards(tmp_path, (100, 80, 50))
    (tmp_path / "train_000002.bin").write_bytes(b"not a shard")  # only read when the loader gets there
    with pytest.raises(ShardError, match="train_000002.bin: 11 bytes, shorter than the 1024-byte"):
        DistributedDataLoader(pattern, 2, 8)  # by default every header is checked up front
    loader = DistributedDataLoader(pattern, 2, 8, lazy=True)
    assert opened == [] and "shards=3" in repr(loader)
    batches = [loader.next_batch()[0] for _ in range(6)]  # shard 0 holds 6 batches
    assert [b[0, 0] for b in batches] == [0, 16, 32, 48, 64, 80]
    assert [p[-16:] for p in opened] == ["train_000000.bin"]
    assert loader.state_dict() == {"shard": 1, "position": 0}  # moved on, but shard 1 is not mapped yet
    for _ in range(4):
        loader.next_batch()
    assert [p[-16:] for p in opened] == ["train_000000.bin", "train_000001.bin"]
    with pytest.raises(ShardError, match="train_000002.bin: 11 bytes"):
        loader.next_batch()


def test_lazy_loader_checks_a_shard_size_when_it_reaches_it(tmp_path):
    loader = DistributedDataLoader(make_shards(tmp_path, (100, 30)), 2, 8, rank=1, world_size=2, lazy=True)
    for _ in range(3):  # shard 0: 100 tokens, global batches of 32 (+1)
        loader.next_batch()
    with pytest.raises(ShardTooSmall, match="train_000001.bin: 30 tokens, fewer than one global batch") as info:
        loader.next_batch()
    assert (info.value.tokens, info.value.need) == (30, 33) and info.value.path.endswith("train_000001.bin")


def test_lazy_loader_reads_the_same_batches_and_resumes(tmp_path):
    pattern = make_shards(tmp_path, (100, 80, 50))
    eager, lazy = DistributedDataLoader(pattern, 2, 8), DistributedDataLoader(pattern, 2, 8, lazy=True)
    for _ in range(20):
        np.testing.assert_array_equal(eager.next_batch()[1], lazy.next_batch()[1])
    resumed = DistributedDataLoader(pattern, 2, 8, lazy=True)
    resumed.load_state_dict(lazy.state_dict())
    np.testing.assert_array_equal(resumed.next_batch()[0], eager.next_batch()[0])
    assert lazy.num_tokens() == 230


@pytest.mark.parametrize("key, hint", [("data.train", "point data.train at existing .bin shards"),
                                       ("data.val", "or set data.val=null to skip validation")])
def test_a_pattern_matching_nothing_names_it_and_its_config_key(tmp_path, key, hint):
    pattern = str(tmp_path / "missing" / "val_*.bin")
    with pytest.raises(ShardError) as info:
        DistributedDataLoader(pattern, 2, 8, config_key=key)
    message = str(info.value)
    assert message.startswith(f"{key}: no token shards match {pattern!r}")
    assert "\nHINT: run examples/gpt2/prepare_data.py" in message and message.endswith(hint)
