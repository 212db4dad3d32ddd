"""examples/mnist/train.py: the digits run reaches 97% test accuracy, one process = DataParallel = 2-rank DDP for
an epoch, MNIST idx files are read (gzipped or not), and bad configs are refused before any work."""
import gzip
import json
import os
import struct

import numpy as np
import pytest

import infini_train as it
from examples.mnist import train as mnist
from examples.mnist.config import load_config
from examples.mnist.data import DataError, load_dataset, read_idx
from infini_train.training.config import ConfigError
from tests.distributed.mpi_jobs import REPO, mpirun, needs_mpiexec, output, python

SCRIPT = os.path.join(REPO, "examples", "mnist", "train.py")
CONFIG = os.path.join(REPO, "configs", "mnist_digits.yaml")


def _config(tmp_path, *overrides):
    return load_config(CONFIG, [f"out_dir={tmp_path}", *overrides])


def _metrics(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def _train(out_dir, *overrides, ranks=1):
    """The script as a user runs it (one BLAS thread per process, as the MPI jobs of the suite); its metrics rows."""
    args = (f"out_dir={out_dir}", *overrides)
    proc = mpirun(ranks, SCRIPT, *args, timeout=180) if ranks > 1 else python(SCRIPT, *args, timeout=180)
    assert proc.returncode == 0, output(proc)
    return proc, _metrics(out_dir)


def test_digits_reach_97_percent(tmp_path):
    proc, rows = _train(tmp_path, "train.epochs=6")
    assert "digits: 1437 train / 360 test images of 8x8; parallel none" in proc.stdout
    assert [r["epoch"] for r in rows] == list(range(1, 7))
    assert rows[-1]["test_accuracy"] >= 0.97, rows
    assert rows[-1]["train_loss"] < 0.3 * rows[0]["train_loss"]
    assert rows[-1]["seconds"] < 60
    assert load_config(str(tmp_path / "config.yaml")) == _config(tmp_path, "train.epochs=6")


def test_one_process_equals_dataparallel(tmp_path):
    common = ["train.epochs=1", "model.batch_norm=false"]
    _, single = _train(tmp_path / "one", *common)
    proc, parallel = _train(tmp_path / "dp", *common, "parallel=dataparallel", "devices=cpu:0,cpu:1")
    assert "parallel dataparallel over cpu:0,cpu:1" in proc.stdout
    np.testing.assert_allclose(parallel[0]["train_loss"], single[0]["train_loss"], rtol=1e-5)
    assert parallel[0]["test_accuracy"] == single[0]["test_accuracy"]


@needs_mpiexec
def test_two_rank_ddp_equals_one_process_and_dataparallel(tmp_path):
    _, single = _train(tmp_path / "one", "train.epochs=1", "model.batch_norm=false")
    proc, ddp = _train(tmp_path / "ddp", "train.epochs=1", "model.batch_norm=false", ranks=2)
    assert "parallel ddp over 2 ranks" in proc.stdout
    np.testing.assert_allclose(ddp[0]["train_loss"], single[0]["train_loss"], rtol=1e-5)
    assert ddp[0]["test_accuracy"] == single[0]["test_accuracy"]
    # with BatchNorm each replica / rank normalises its half of the batch: DataParallel and DDP still agree
    _, ddp_bn = _train(tmp_path / "ddp_bn", "train.epochs=1", ranks=2)
    _, dp_bn = _train(tmp_path / "dp_bn", "train.epochs=1", "parallel=dataparallel")
    np.testing.assert_allclose(ddp_bn[0]["train_loss"], dp_bn[0]["train_loss"], rtol=1e-5)
    assert ddp_bn[0]["test_accuracy"] == dp_bn[0]["test_accuracy"]


def test_dataparallel_keeps_batch_norm_running_stats(tmp_path):
    model = mnist.build_model(_config(tmp_path), 8, 8)
    x = np.random.default_rng(0).standard_normal((8, 1, 8, 8)).astype(np.float32)
    wrapped = it.nn.parallel.DataParallel(model.to("cpu:0"), device_ids=["cpu:0", "cpu:1"])
    wrapped(it.tensor(x))
    reference = mnist.build_model(_config(tmp_path), 8, 8)
    reference.load_state_dict({k: v.numpy() for k, v in model.state_dict().items()})
    reference.get_submodule("1").reset_running_stats()
    reference(it.tensor(x[:4]))  # the first replica's half of the batch
    np.testing.assert_allclose(model.get_submodule("1").running_mean.numpy(),
                               reference.get_submodule("1").running_mean.numpy(), rtol=1e-6)
    assert int(model.get_submodule("1").num_batches_tracked.numpy()) == 1


def _write_idx(path, array):
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    data = header + array.astype(np.uint8).tobytes()
    with (gzip.open(path, "wb") if path.endswith(".gz") else open(path, "wb")) as f:
        f.write(data)


def test_mnist_idx_files_are_read_gzipped_or_not(tmp_path):
    rng = np.random.default_rng(1)
    images, labels = rng.integers(0, 256, (40, 28, 28)), rng.integers(0, 10, 40)
    _write_idx(str(tmp_path / "train-images-idx3-ubyte.gz"), images[:30])
    _write_idx(str(tmp_path / "train-labels-idx1-ubyte"), labels[:30])
    _write_idx(str(tmp_path / "t10k-images-idx3-ubyte"), images[30:])
    _write_idx(str(tmp_path / "t10k-labels-idx1-ubyte.gz"), labels[30:])
    np.testing.assert_array_equal(read_idx(str(tmp_path / "train-images-idx3-ubyte.gz")), images[:30])
    name, train_x, train_y, test_x, test_y = load_dataset(_config(tmp_path / "o", f"data.mnist_dir={tmp_path}"))
    assert name == "mnist" and train_x.shape == (30, 1, 28, 28) and test_x.shape == (10, 1, 28, 28)
    np.testing.assert_array_equal(train_y, labels[:30])
    assert abs(float(train_x.mean())) < 1e-5 and abs(float(train_x.std()) - 1) < 1e-4
    result = mnist.run(_config(tmp_path / "run", f"data.mnist_dir={tmp_path}", "train.epochs=1",
                               "train.batch_size=10"), log=lambda text: None)
    assert result["dataset"] == "mnist" and len(result["train_loss"]) == 1
    (tmp_path / "bad").mkdir()
    for stem in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte"):
        (tmp_path / "bad" / stem).write_bytes(b"not an idx file")
    with pytest.raises(DataError, match="(?s)idx file.*HINT"):
        load_dataset(_config(tmp_path / "o", f"data.mnist_dir={tmp_path / 'bad'}"))


def test_bad_config_is_refused_before_any_work(tmp_path):
    with pytest.raises(ConfigError) as info:
        _config(tmp_path, "train.epoch=3", "parallel=dp", "train.batch_size=0", "model.batch_norm=maybe")
    errors = info.value.errors
    assert "train.epoch: unknown key (did you mean 'train.epochs'?)" in errors
    assert any(e.startswith("parallel: expected one of auto | none | dataparallel | ddp, got 'dp'") for e in errors)
    assert "train.batch_size: expected a positive int, got 0" in errors
    assert any(e.startswith("model.batch_norm: expected bool") for e in errors)
    with pytest.raises(ConfigError, match="multiple of the 2 ranks.*\nHINT: train.batch_size=62"):
        mnist._mode(_config(tmp_path, "train.batch_size=63"), 2)
    proc = python(SCRIPT, f"out_dir={tmp_path / 'x'}", "train.learning_rat=1")
    assert proc.returncode == 1, output(proc)
    assert "train.learning_rat: unknown key (did you mean 'train.learning_rate'?)" in proc.stderr
    assert not (tmp_path / "x").exists()
