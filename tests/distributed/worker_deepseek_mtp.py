"""Run under ``mpiexec -n 2 python worker_deepseek_mtp.py``: a DeepSeek-V3 with two multi-token prediction modules
(models/deepseek_v3/mtp.py) split over a tensor group of 2 -- without and with sequence parallelism, the MTP blocks
split as the others, the vocab-parallel embedding and head shared -- against the same model in one process, float64:
the loss, the MTP loss and every gradient (this rank's shard of a split one; the sequence-parallel ones summed over
the group first) at 1e-10. Prints "rank R MTP OK N"."""
import numpy as np

import infini_train as it
from infini_train import distributed as dist
from infini_train.models.deepseek_v3 import DeepseekV3Config
from infini_train.models.deepseek_v3.model import DeepseekV3
from infini_train.models.deepseek_v3.parallel import parallelize_deepseek_v3
from infini_train.nn.parallel.tensor_parallel import all_reduce_grads_where_any
from tests.distributed.rank_checks import RankChecks

dist.init_process_group("mpi", timeout=60)
rank = dist.get_rank()
group = dist.new_group(range(2))
check = RankChecks(rank)
CONFIG = DeepseekV3Config.from_preset("deepseek-v3-tiny", n_layers=3, num_nextn_predict_layers=2,
                                      seq_aux_loss_alpha=1e-4)


def build():
    it.manual_seed(1)
    model = DeepseekV3(CONFIG).double()
    return model.train()


def close(a, b, what):
    scale = max(float(np.abs(b).max()), 1.0)
    check(a.shape == b.shape and np.abs(a - b).max() <= 1e-10 * scale, f"{what}: max error "
          f"{np.abs(a - b).max() if a.shape == b.shape else (a.shape, b.shape)}")


def run(sequence_parallel):
    ref, split = build(), parallelize_deepseek_v3(build(), group, sequence_parallel)
    x = np.random.default_rng(0).integers(0, 257, (2, 16))
    y = np.concatenate([x[:, 1:], -np.ones((2, 1), np.int64)], 1)
    results = []
    for model in (ref, split):
        _, loss = model(it.tensor(x), it.tensor(y))
        loss.backward()
        results.append((loss.item(), model.mtp_loss.item()))
    close(np.array(results[1]), np.array(results[0]), "loss, mtp_loss")
    # (as finalize_grads: an expert may get tokens on one rank's slice only)
    all_reduce_grads_where_any([p for p in split.parameters() if p.placement.sequence_parallel], group)
    whole = dict(ref.named_parameters())
    for name, p in split.named_parameters():
        want = whole[name].grad
        if want is None:  # (an expert no token reached)
            check(p.grad is None or not np.abs(p.grad.numpy()).max(), f"{name}: a gradient where one process has none")
            continue
        want, got = want.numpy(), p.grad.numpy()
        shard = p.placement.tensor_shard
        if shard is not None:  # this rank's rows / columns (the vocabulary padded to a multiple of the group)
            size = got.shape[shard.dim]
            want = np.take(want, range(rank * size, min((rank + 1) * size, want.shape[shard.dim])), shard.dim)
            got = np.take(got, range(want.shape[shard.dim]), shard.dim)
        close(got, want, f"sequence_parallel={sequence_parallel} {name}")


run(False)
run(True)
print(f"rank {rank} MTP OK {check.count}", flush=True)
