"""Sharded checkpoints (it.distributed.checkpoint): box geometry, save and resharding load in one process, damage
detection, and across ranks (worker_sharded_checkpoint.py)."""
import json
import os

import numpy as np
import pytest

import infini_train as it
from infini_train.distributed.checkpoint import (CheckpointFormatError, LocalPieces, flat_range_boxes, load,
                                                 read_metadata, save, verify)
from infini_train.distributed.checkpoint.pieces import overlap
from infini_train.distributed.process_group import SingleProcessGroup
from tests.distributed.mpi_jobs import mpirun, output

ONE = SingleProcessGroup()


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4), (4, 1, 3)])
def test_flat_range_boxes_cover_exactly_the_range_in_order(shape):
    n = int(np.prod(shape))
    whole = np.arange(n).reshape(shape)
    for start in range(n + 1):
        for stop in range(start, n + 1):
            got = [whole[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))].reshape(-1)
                   for offsets, sizes in flat_range_boxes(shape, start, stop)]
            flat = np.concatenate(got) if got else np.zeros(0, int)
            assert flat.tolist() == list(range(start, stop)), (shape, start, stop)
    assert len(flat_range_boxes((2, 3, 4), 1, 23)) <= 5


def test_overlap_of_boxes():
    assert overlap((0, 0), (2, 4), (1, 2), (4, 4)) == ((1, 2), (1, 2))
    assert overlap((0, 0), (2, 4), (2, 0), (1, 4)) is None
    assert overlap((), (), (), ()) == ((), ())


def pieces_of_rows(whole, rows):
    """LocalPieces holding the given row ranges of ``whole`` (copies, so loading can be checked)."""
    return LocalPieces(whole.shape, whole.dtype, [((a,) + (0,) * (whole.ndim - 1), whole[a:b].copy()) for a, b in rows])


def test_save_then_load_into_other_boxes(tmp_path):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 4)).astype(np.float32)
    b = rng.standard_normal(5)
    step = np.array(3, np.int64)
    meta = save({"w": pieces_of_rows(w, [(0, 2), (2, 6)]), "b": b, "step": step}, str(tmp_path), ONE,
                extra={"note": "x"})
    assert sorted(meta["tensors"]) == ["b", "step", "w"]
    assert len(meta["tensors"]["w"]["chunks"]) == 2 and meta["tensors"]["w"]["dtype"] == "F32"
    assert verify(str(tmp_path)) == []
    # columns, a flat range and a whole copy: each filled from the overlapping rows
    cols = LocalPieces((6, 4), np.float32, [((0, 1), np.zeros((6, 2), np.float32))])
    flat = np.zeros(11, np.float32)
    ranged = LocalPieces.flat_range((6, 4), 7, flat)
    whole_b, whole_step = np.zeros(5), np.zeros((), np.int64)
    extra = load({"w": cols, "b": whole_b, "step": whole_step}, str(tmp_path))
    assert extra == {"note": "x"}
    np.testing.assert_array_equal(cols.pieces[0][1], w[:, 1:3])
    np.testing.assert_array_equal(whole_b, b)
    assert int(whole_step) == 3
    load({"w": ranged}, str(tmp_path))
    np.testing.assert_array_equal(flat, w.reshape(-1)[7:18])


def test_tensors_and_bfloat16_round_trip(tmp_path):
    t = it.randn(3, 4).to(it.bfloat16)
    save({"t": t}, str(tmp_path), ONE)
    back = it.zeros(3, 4, dtype=it.bfloat16)
    load({"t": back}, str(tmp_path))
    assert np.array_equal(back.float().numpy(), t.float().numpy())


def test_what_does_not_fit_is_refused_by_name(tmp_path):
    save({"w": np.ones((2, 3), np.float32)}, str(tmp_path), ONE)
    with pytest.raises(CheckpointFormatError, match=r"holds no tensor 'v'.*\nHINT"):
        load({"v": np.zeros((2, 3), np.float32)}, str(tmp_path))
    with pytest.raises(CheckpointFormatError, match=r"'w' was saved with shape \(2, 3\), this model's is \(3, 2\)"):
        load({"w": np.zeros((3, 2), np.float32)}, str(tmp_path))
    with pytest.raises(CheckpointFormatError, match="no metadata.json"):
        load({"w": np.zeros((2, 3), np.float32)}, str(tmp_path / "nothing"))


def test_damage_is_detected(tmp_path):
    save({"w": np.arange(64, dtype=np.float32).reshape(8, 8)}, str(tmp_path), ONE)
    shard = tmp_path / "shard00000.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert verify(str(tmp_path)) == ["shard00000.safetensors: its SHA-256 differs from the metadata's (damaged)"]
    shard.write_bytes(bytes(data[:-8]))
    assert "truncated" in verify(str(tmp_path))[0]
    with pytest.raises(CheckpointFormatError, match="truncated"):
        load({"w": np.zeros((8, 8), np.float32)}, str(tmp_path))


def test_incomplete_coverage_is_refused(tmp_path):
    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    save({"w": pieces_of_rows(w, [(0, 2)])}, str(tmp_path), ONE)  # rows 2-3 were never saved
    meta = read_metadata(str(tmp_path))
    assert meta["tensors"]["w"]["chunks"][0]["sizes"] == [2, 3]
    with pytest.raises(CheckpointFormatError, match=r"cover 6 of the 12 elements"):
        load({"w": np.zeros((4, 3), np.float32)}, str(tmp_path))
    assert json.load(open(os.path.join(tmp_path, "metadata.json")))["format"] == "infini_train.sharded/1"


def test_ranks_write_their_own_shards_and_any_split_loads_them(tmp_path):
    proc = mpirun(4, "worker_sharded_checkpoint.py", str(tmp_path), timeout=120)
    assert proc.returncode == 0, output(proc)
    assert proc.stdout.count("sharded checkpoint ok") == 4, output(proc)


@pytest.mark.parametrize("spec_args,shape,size", [
    ((0,), (8, 3), 2), ((1,), (3, 8), 4), ((0, 3), (12, 2), 2), ((-1, 3), (2, 12), 2),
    ((0, 1, 7, 2), (7, 3), 2), ((0, 1, 5), (5, 2), 1), ((0, 1, 10, 4), (10, 2), 2)])
def test_tensor_parallel_shards_are_boxes_of_the_whole_tensor(spec_args, shape, size):
    from infini_train.nn.parallel.sharded_pieces import flat_pieces, tensor_pieces
    from infini_train.nn.parallel.tensor_parallel import ShardSpec, shard_from_whole

    spec = ShardSpec(*spec_args)
    whole = np.arange(np.prod(shape), dtype=np.float64).reshape(shape)
    seen = np.zeros(shape, int)
    for rank in range(size):
        local = shard_from_whole(whole, spec, rank, size, np)
        pieces = tensor_pieces(local, spec, rank, size)
        assert pieces.global_shape == shape
        for offsets, view in pieces.pieces:
            box = tuple(slice(o, o + n) for o, n in zip(offsets, view.shape))
            np.testing.assert_array_equal(view, whole[box])
            seen[box] += 1
        flat = local.reshape(-1)  # a ZeRO-like split of the shard into three flat ranges
        cuts = [0, flat.size // 3, 2 * flat.size // 3 + 1, flat.size]
        for a, b in zip(cuts, cuts[1:]):
            for offsets, view in flat_pieces(local.shape, flat[a:b], a, spec, rank, size).pieces:
                np.testing.assert_array_equal(view, whole[tuple(slice(o, o + n) for o, n in zip(offsets,
                                                                                                  view.shape))])
    assert (seen == 1).all()  # every element of the whole tensor held exactly once, padding held by none
