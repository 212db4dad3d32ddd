"""Under ``mpiexec -n 4`` with a directory argument: a row-split tensor held by two tensor ranks x two data-parallel
replicas and a ZeRO-like flat split of another are saved with it.distributed.checkpoint.save; each replicated piece
is written once. Loaded back under other splits (uneven column blocks, row blocks, one rank holding everything) they
equal the global tensors. Prints "rank R: sharded checkpoint ok"."""
import os
import sys

import numpy as np

from infini_train import distributed as dist
from infini_train.distributed.checkpoint import LocalPieces, load, read_metadata, save, verify

dist.init_process_group("mpi")
rank, world = dist.get_rank(), dist.get_world_size()
directory = os.path.join(sys.argv[1], "ckpt")
rng = np.random.default_rng(0)
W = rng.standard_normal((8, 6)).astype(np.float32)
M = rng.standard_normal((8, 6))
tp = rank % 2
state = {"W": LocalPieces(W.shape, W.dtype, [((4 * tp, 0), W[4 * tp:4 * tp + 4].copy())]),
         "M": LocalPieces.flat_range(M.shape, 12 * rank, M.reshape(-1)[12 * rank:12 * rank + 12].copy()),
         "step": np.array(7)}
save(state, directory, extra={"saved_by": world})
meta = read_metadata(directory)
assert [c["file"] for c in meta["tensors"]["W"]["chunks"]] == ["shard00000.safetensors", "shard00001.safetensors"]
assert sorted(meta["files"]) == [f"shard{r:05d}.safetensors" for r in range(world)]
assert verify(directory) == []

cols = np.array_split(np.arange(6), world)[rank]
col_view = np.zeros((8, len(cols)), np.float32)
row_view = np.zeros((2, 6))
everything = np.zeros((8, 6), np.float32)
step = np.zeros((), np.int64)
extra = load({"W": LocalPieces(W.shape, W.dtype, [((0, int(cols[0])), col_view)]),
              "M": LocalPieces(M.shape, M.dtype, [((2 * rank, 0), row_view)]), "step": step}, directory)
load({"W": everything}, directory)
assert extra == {"saved_by": world}
np.testing.assert_array_equal(col_view, W[:, cols])
np.testing.assert_array_equal(row_view, M[2 * rank:2 * rank + 2])
np.testing.assert_array_equal(everything, W)
assert int(step) == 7
print(f"rank {rank}: sharded checkpoint ok", flush=True)
