"""The example's images: MNIST's idx files when a directory holds them (gzipped or not; nothing is downloaded),
else scikit-learn's bundled 8x8 digits (1797 images) split into train and test with a fixed seed. Images come
back as float32 (N, 1, H, W), standardised with the training set's mean and std, labels as int64."""
from __future__ import annotations

import gzip
import os
import struct

import numpy as np

MNIST_FILES = {"train_images": "train-images-idx3-ubyte", "train_labels": "train-labels-idx1-ubyte",
               "test_images": "t10k-images-idx3-ubyte", "test_labels": "t10k-labels-idx1-ubyte"}


class DataError(ValueError):
    """A data file that is missing or not what it claims to be."""


def read_idx(path):
    """An idx file (LeCun's format: magic with the element type and rank, big-endian dims, then the data) as a
    numpy array; ``path`` may end in .gz."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] != 0x08:
        raise DataError(f"{path}: expected an idx file of unsigned bytes (magic 0x0000 08 rank), got "
                        f"{data[:4].hex() or 'an empty file'}\nHINT: the MNIST files are train-images-idx3-ubyte(.gz) "
                        "and friends from the MNIST distribution")
    rank = data[3]
    dims = struct.unpack(f">{rank}I", data[4:4 + 4 * rank])
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * rank)
    if body.size != int(np.prod(dims)):
        raise DataError(f"{path}: expected {int(np.prod(dims))} bytes of data for dims {dims}, got {body.size}")
    return body.reshape(dims)


def _find(directory, stem):
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"):
        path = os.path.join(directory, name)
        if os.path.exists(path):
            return path
    return None


def mnist_paths(directory):
    """{role: path} when ``directory`` holds all four MNIST files, else None."""
    if not directory or not os.path.isdir(directory):
        return None
    paths = {role: _find(directory, stem) for role, stem in MNIST_FILES.items()}
    return paths if all(paths.values()) else None


def _standardise(train, test):
    mean, std = float(train.mean()), float(train.std())
    return ((train - mean) / std).astype(np.float32), ((test - mean) / std).astype(np.float32)


def load_mnist(paths):
    images = {role: read_idx(paths[role]) for role in ("train_images", "test_images")}
    labels = {role: read_idx(paths[role]).astype(np.int64) for role in ("train_labels", "test_labels")}
    for split in ("train", "test"):
        if len(images[f"{split}_images"]) != len(labels[f"{split}_labels"]):
            raise DataError(f"MNIST {split}: {len(images[f'{split}_images'])} images but "
                            f"{len(labels[f'{split}_labels'])} labels")
    train, test = _standardise(images["train_images"][:, None] / 255.0, images["test_images"][:, None] / 255.0)
    return "mnist", train, labels["train_labels"], test, labels["test_labels"]


def load_digits_split(test_size, seed):
    from sklearn.datasets import load_digits

    digits = load_digits()
    order = np.random.default_rng(seed).permutation(len(digits.target))
    if test_size >= len(order):
        raise DataError(f"data.test_size: expected fewer than the {len(order)} digits, got {test_size}")
    test, train = order[:test_size], order[test_size:]
    images = digits.images[:, None] / 16.0
    train_x, test_x = _standardise(images[train], images[test])
    return "digits", train_x, digits.target[train].astype(np.int64), test_x, digits.target[test].astype(np.int64)


def load_dataset(cfg):
    """(name, train_x, train_y, test_x, test_y) for the config's data section and seed."""
    paths = mnist_paths(cfg.data.mnist_dir)
    name, train_x, train_y, test_x, test_y = load_mnist(paths) if paths else load_digits_split(cfg.data.test_size,
                                                                                               cfg.seed)
    if cfg.data.limit_train:
        train_x, train_y = train_x[:cfg.data.limit_train], train_y[:cfg.data.limit_train]
    return name, train_x, train_y, test_x, test_y
