"""Optimizer state offload (it.optim.offload): the file-backed and host state stores, and Adam / AdamW stepping over
them bit for bit as in memory, with state dicts that round-trip between the placements."""
import os
import tracemalloc

import numpy as np
import pytest

import infini_train as it
from infini_train.optim import Adam, AdamW
from infini_train.optim.offload import DiskStore, HostStore, OffloadedArray, OffloadError, make_store

SHAPES = [(300, 7), (5,), (1000,), (3, 4, 5)]


def _params(dtype, seed=0):
    rng = np.random.default_rng(seed)
    return [it.Tensor(rng.standard_normal(s).astype(dtype), requires_grad=True) for s in SHAPES]


def _grads(params, rng):
    for p in params:
        p.grad = it.Tensor(rng.standard_normal(p.shape).astype(p.numpy().dtype))


def _train(store, dtype, cls=AdamW, steps=4, **options):
    params = _params(dtype)
    opt = cls(params, lr=1e-2, offload=store, **options)
    rng = np.random.default_rng(1)
    for _ in range(steps):
        _grads(params, rng)
        opt.step()
    return params, opt


def _stores(tmp_path):
    """The offloaded placements under test: chunks that divide no parameter, with and without read-ahead."""
    return {"disk": DiskStore(tmp_path / "offload", rank=3, chunk=333),
            "disk-no-prefetch": DiskStore(tmp_path / "offload2", rank=0, chunk=1000, prefetch=False),
            "host": HostStore(chunk=100)}


def _bits(a):
    return np.ascontiguousarray(a).tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("cls,options", [(AdamW, dict(weight_decay=0.1)), (AdamW, dict(amsgrad=True)),
                                         (Adam, dict(weight_decay=0.05)), (Adam, dict(maximize=True, amsgrad=True))])
def test_offloaded_steps_equal_the_in_memory_steps_bitwise(tmp_path, dtype, cls, options):
    ref, ref_opt = _train(None, dtype, cls, **options)
    for name, store in _stores(tmp_path).items():
        got, opt = _train(store, dtype, cls, **options)
        for a, b in zip(ref, got):
            assert _bits(a.numpy()) == _bits(b.numpy()), name
        mine, theirs = opt.state_dict(), ref_opt.state_dict()
        assert mine["param_groups"] == theirs["param_groups"]
        for i, st in theirs["state"].items():
            assert st.keys() == mine["state"][i].keys()
            for key, value in st.items():
                if key == "step":
                    assert mine["state"][i][key] == value == 4
                else:
                    assert _bits(mine["state"][i][key].numpy()) == _bits(value.numpy()), (name, i, key)
        assert opt.state_bytes() == 0 and opt.offloaded_bytes() == ref_opt.state_bytes() > 0, name
        assert ref_opt.offloaded_bytes() == 0


def test_the_state_lives_in_the_rank_file(tmp_path):
    params, opt = _train(DiskStore(tmp_path / "off", rank=2, chunk=64), np.float32)
    store = opt.state_store
    assert os.path.dirname(store.path) == str(tmp_path / "off" / "rank00002")
    m = opt.state[params[0]]["exp_avg"]
    assert isinstance(m, OffloadedArray) and m.shape == (300, 7) and m.nbytes == 300 * 7 * 4
    on_disk = np.fromfile(store.path, np.float32, count=m.size, offset=m.offset).reshape(m.shape)
    np.testing.assert_array_equal(np.asarray(m), on_disk)
    assert np.abs(on_disk).sum() > 0
    # contiguous slices are records of the file's range; others are read at once
    np.testing.assert_array_equal(np.asarray(m[10:20]), on_disk[10:20])
    assert isinstance(m[10:20], OffloadedArray) and isinstance(m.reshape(-1)[5:2000], OffloadedArray)
    np.testing.assert_array_equal(np.asarray(m.reshape(-1)[5:2000]), on_disk.reshape(-1)[5:2000])
    np.testing.assert_array_equal(np.asarray(m[3:4, 2:5]), on_disk[3:4, 2:5])
    np.testing.assert_array_equal(m[3:9, 2:5], on_disk[3:9, 2:5])  # not contiguous: an array read at once
    store.close()
    assert not os.path.exists(store.path) and not os.path.exists(tmp_path / "off")


def test_a_killed_runs_file_is_removed_and_an_unusable_directory_is_an_error(tmp_path, monkeypatch):
    stale = tmp_path / "off" / "rank00000" / "optimizer-state-old.bin"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"x" * 100)
    store = make_store("disk", tmp_path / "off", 0)
    assert not stale.exists() and os.path.exists(store.path)
    store.close()
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(OffloadError, match=r"train\.optimizer_offload: expected a writable directory.*\nHINT"):
        DiskStore(tmp_path / "file", 0)

    class Full:
        f_bavail, f_frsize = 10, 4096
    monkeypatch.setattr(os, "statvfs", lambda path: Full())
    with pytest.raises(OffloadError, match=r"expected room for this rank's optimizer state \(0\.05 MB\).*0\.04 MB "
                                           r"free\nHINT"):
        AdamW(_params(np.float32), offload=DiskStore(tmp_path / "off", 0))


@pytest.mark.parametrize("start,end", [("none", "disk"), ("disk", "none"), ("disk", "host"), ("disk", "disk")])
def test_state_dicts_round_trip_across_placements(tmp_path, start, end):
    """Train two steps under one placement, load its state dict into an optimizer under another and train two more:
    the same bits as four steps in memory."""
    ref, _ = _train(None, np.float32, steps=4, weight_decay=0.1, amsgrad=True)

    def store(kind, name):
        return {"none": None, "host": HostStore(chunk=77), "disk": DiskStore(tmp_path / name, 0, chunk=128)}[kind]
    params, first = _train(store(start, "a"), np.float32, steps=2, weight_decay=0.1, amsgrad=True)
    saved = first.state_dict()
    again = [it.Tensor(p.numpy().copy(), requires_grad=True) for p in params]
    second = AdamW(again, lr=1e-2, weight_decay=0.1, amsgrad=True, offload=store(end, "b"))
    second.load_state_dict(saved)
    if end == "disk":
        assert all(isinstance(st["exp_avg"], OffloadedArray) for st in second.state.values())
    rng = np.random.default_rng(1)
    for _ in range(2):  # the gradients of steps 1 and 2 were drawn from the same generator
        _grads(params, rng)
    for _ in range(2):
        _grads(again, rng)
        second.step()
    for a, b in zip(ref, again):
        assert _bits(a.numpy()) == _bits(b.numpy())


def test_between_steps_only_a_chunk_of_the_state_is_in_memory(tmp_path):
    """A 4M-element parameter: its AdamW state (32 MB) stays in the file; a step allocates a few chunks' buffers."""
    n = 1 << 22

    def peak(store):
        p = it.Tensor(np.ones(n, np.float32), requires_grad=True)
        p.grad = it.Tensor(np.full(n, 0.5, np.float32))
        opt = AdamW([p], lr=1e-3, offload=store)
        tracemalloc.start()
        try:
            opt.step()
            opt.step()
            return tracemalloc.get_traced_memory()[1], p.numpy().copy()
        finally:
            tracemalloc.stop()

    in_memory, ref = peak(None)
    offloaded, got = peak(DiskStore(tmp_path, 0, chunk=1 << 16))
    assert in_memory >= 2 * n * 4  # the two moments
    assert offloaded < n * 4 / 4, offloaded  # well under one moment: the chunk buffers
    assert _bits(ref) == _bits(got)


@pytest.mark.cuda
def test_host_offload_on_a_gpu_equals_the_in_memory_gpu_update():
    cupy = pytest.importorskip("cupy")
    if not it.backend.cuda_available():
        pytest.skip("no GPU")

    def train(store):
        rng = np.random.default_rng(0)
        params = [it.Tensor(rng.standard_normal(s).astype(np.float32), requires_grad=True, device="cuda")
                  for s in SHAPES]
        opt = AdamW(params, lr=1e-2, weight_decay=0.1, offload=store)
        for _ in range(3):
            for p in params:
                p.grad = it.Tensor(rng.standard_normal(p.shape).astype(np.float32), device="cuda")
            opt.step()
        return [cupy.asnumpy(p.array) for p in params], opt

    ref, _ = train(None)
    got, opt = train(HostStore(chunk=1000))
    assert all(isinstance(v, np.ndarray) for st in opt.state.values() for k, v in st.items() if k != "step")
    for a, b in zip(ref, got):
        assert _bits(a) == _bits(b)
