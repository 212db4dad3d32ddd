"""Train a small CNN on scikit-learn's 8x8 digits (offline) or on MNIST when ``data.mnist_dir`` holds its files.

    python examples/mnist/train.py --config configs/mnist_digits.yaml [dotted.key=value ...]
    python examples/mnist/train.py parallel=dataparallel devices=cpu:0,cpu:1     # one process, two devices
    mpirun -n 2 python examples/mnist/train.py                                   # DDP, one shard of each batch per rank

conv 3x3 -> BatchNorm2d -> ReLU -> conv 3x3 -> BatchNorm2d -> ReLU -> max pool 2 -> flatten -> linear -> ReLU ->
linear, Adam with a cosine learning rate, cross-entropy. Every epoch prints the train loss and the test accuracy
and appends them to out_dir/metrics.jsonl. Under DDP each rank takes a contiguous 1/N of every global batch (the
batch size must divide), so the ranks' mean loss is the one-process loss; BatchNorm normalises each replica's or
rank's part of the batch on its own (as torch without SyncBatchNorm), and the test set is split over the ranks.
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import infini_train as it  # noqa: E402
import infini_train.nn.functional as F  # noqa: E402
from infini_train import distributed as dist  # noqa: E402
from infini_train import nn  # noqa: E402
from infini_train.training.config import ConfigError  # noqa: E402
from infini_train.training.metrics import MetricsLog  # noqa: E402

from examples.mnist.config import parse_args  # noqa: E402
from examples.mnist.data import DataError, load_dataset  # noqa: E402

NUM_CLASSES = 10


def build_model(cfg, height, width):
    """The CNN for (1, height, width) images; images of 16 pixels or more are max-pooled after the first block
    too (28x28 MNIST), so the convolutions stay cheap."""
    m = cfg.model
    pool_first = height >= 16

    def block(cin, cout):
        return [nn.Conv2d(cin, cout, 3, padding=1)] + ([nn.BatchNorm2d(cout)] if m.batch_norm else []) + [nn.ReLU()]

    layers = block(1, m.channels1) + ([nn.MaxPool2d(2)] if pool_first else []) + block(m.channels1, m.channels2)
    layers += [nn.MaxPool2d(2), nn.Flatten()]
    shrink = 4 if pool_first else 2
    layers += [nn.Linear(m.channels2 * (height // shrink) * (width // shrink), m.hidden), nn.ReLU(),
               nn.Linear(m.hidden, NUM_CLASSES)]
    return nn.Sequential(*layers)


def _optimizer(cfg, params):
    t = cfg.train
    if t.optimizer == "sgd":
        return it.optim.SGD(params, lr=t.learning_rate, momentum=0.9, weight_decay=t.weight_decay)
    cls = it.optim.AdamW if t.optimizer == "adamw" else it.optim.Adam
    return cls(params, lr=t.learning_rate, weight_decay=t.weight_decay)


def _mode(cfg, world):
    mode = cfg.parallel
    if mode == "auto":
        mode = "ddp" if world > 1 else "none"
    elif world > 1 and mode != "ddp":
        raise ConfigError(f"parallel: expected ddp (or auto) under mpirun with {world} ranks, got {mode!r}"
                          "\nHINT: run parallel=dataparallel in one process (no mpirun)")
    if mode == "ddp" and cfg.train.batch_size % world:
        fit = cfg.train.batch_size // world * world or world
        raise ConfigError(f"train.batch_size: expected a multiple of the {world} ranks under ddp, got "
                          f"{cfg.train.batch_size}\nHINT: train.batch_size={fit}")
    return mode


def _sum_over_ranks(values, mode):
    """Elementwise sum of a float64 vector over the ranks (itself outside ddp)."""
    values = np.asarray(values, np.float64)
    if mode != "ddp" or dist.get_world_size() == 1:
        return values
    t = it.tensor(values)
    dist.all_reduce(t, "sum")
    return t.numpy()


def evaluate(model, x, y, mode, batch=512):
    """Test accuracy in eval mode; under ddp each rank scores its contiguous part with rank 0's buffers (BatchNorm's
    running statistics, as DDP's next forward would broadcast them) and the counts are summed."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if mode == "ddp" else (0, 1)
    if world > 1:
        for b in model.buffers():
            dist.broadcast(b, 0)
    lo, hi = len(x) * rank // world, len(x) * (rank + 1) // world
    correct = 0
    model.eval()
    with it.no_grad():
        for start in range(lo, hi, batch):
            stop = min(start + batch, hi)
            logits = model(it.tensor(x[start:stop])).to("cpu")
            correct += int((logits.numpy().argmax(axis=1) == y[start:stop]).sum())
    model.train()
    return float(_sum_over_ranks([correct], mode)[0]) / len(x)


def run(cfg, log=print):
    """Train as ``cfg`` says; returns {"dataset", "train_loss": [per epoch], "test_accuracy": [per epoch], "seconds"}.
    Call inside an initialised world (init_process_group) when running under mpirun."""
    world, rank = dist.get_world_size(), dist.get_rank()
    mode = _mode(cfg, world)
    name, train_x, train_y, test_x, test_y = load_dataset(cfg)
    it.manual_seed(cfg.seed)
    model = build_model(cfg, *train_x.shape[2:])
    raw_model = model
    if mode == "dataparallel":
        devices = cfg.device_list()
        model = nn.parallel.DataParallel(raw_model.to(devices[0]), device_ids=devices)
    elif mode == "ddp":
        model = nn.parallel.DistributedDataParallel(raw_model)
    steps_per_epoch = len(train_x) // cfg.train.batch_size
    if steps_per_epoch == 0:
        raise ConfigError(f"train.batch_size: expected at most the {len(train_x)} training images, got "
                          f"{cfg.train.batch_size}")
    opt = _optimizer(cfg, raw_model.parameters())
    sched = it.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=cfg.train.epochs * steps_per_epoch)
    metrics = MetricsLog(cfg.out_dir, enabled=rank == 0)
    if rank == 0:
        cfg.save_resolved()
        log(cfg.pretty())
        log(f"{name}: {len(train_x)} train / {len(test_x)} test images of {train_x.shape[2]}x{train_x.shape[3]}; "
            f"parallel {mode}" + (f" over {world} ranks" if mode == "ddp" else "") +
            (f" over {cfg.devices}" if mode == "dataparallel" else "") +
            f"; {sum(p.numel() for p in raw_model.parameters())} parameters")
    order_rng = np.random.default_rng(cfg.seed)  # the same order on every rank
    share = cfg.train.batch_size // world if mode == "ddp" else cfg.train.batch_size
    result = {"dataset": name, "train_loss": [], "test_accuracy": [], "seconds": 0.0}
    start = time.perf_counter()
    for epoch in range(1, cfg.train.epochs + 1):
        order = order_rng.permutation(len(train_x))
        loss_sum = 0.0
        for step in range(steps_per_epoch):
            batch = order[step * cfg.train.batch_size:(step + 1) * cfg.train.batch_size]
            if mode == "ddp":
                batch = batch[rank * share:(rank + 1) * share]
            logits = model(it.tensor(train_x[batch]))
            loss = F.cross_entropy(logits, it.tensor(train_y[batch]).to(logits.device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            loss_sum += loss.item()
        train_loss = float(_sum_over_ranks([loss_sum], mode)[0]) / steps_per_epoch / (world if mode == "ddp" else 1)
        accuracy = evaluate(raw_model if mode != "ddp" else model.module, test_x, test_y, mode)
        seconds = time.perf_counter() - start
        result["train_loss"].append(train_loss)
        result["test_accuracy"].append(accuracy)
        result["seconds"] = seconds
        metrics.write({"epoch": epoch, "step": epoch * steps_per_epoch, "train_loss": train_loss,
                       "test_accuracy": accuracy, "seconds": round(seconds, 3)})
        if rank == 0:
            log(f"epoch {epoch:3d}/{cfg.train.epochs}  train loss {train_loss:.4f}  test accuracy "
                f"{100 * accuracy:6.2f}%  ({seconds:.1f}s)")
    return result


def main(argv=None):
    try:
        cfg = parse_args(argv)
        dist.init_process_group()
        run(cfg, log=lambda text: print(text, flush=True))
    except (ConfigError, DataError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        if dist.is_initialized() and dist.get_world_size() > 1:
            from infini_train.distributed.launch_utils import abort_job

            abort_job(1)
        return 1
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
