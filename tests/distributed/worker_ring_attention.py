"""Under ``mpiexec -n N``: ring attention over N ranks (each holding chunks r and 2N-1-r of the sequence) gives the
outputs and q / k / v gradients of causal attention over the whole sequence in one process, for plain and grouped-
query heads, float64 and float32, with dropout drawing the same positions. Prints "rank R: ring ok"."""
import numpy as np

import infini_train as it
from infini_train import distributed as dist
from infini_train.nn.parallel.context_parallel import local_chunks
from infini_train.nn.parallel.ring_attention import ring_attention

dist.init_process_group("mpi")
group = dist.default_group()
rank, n = group.rank, group.size
for dtype, heads, kv_heads, dropout, tol in ((np.float64, 4, 4, 0.0, 1e-12), (np.float64, 4, 2, 0.0, 1e-12),
                                              (np.float32, 4, 1, 0.0, 2e-5), (np.float64, 2, 2, 0.25, 1e-12)):
    T = 2 * n * 6
    rng = np.random.default_rng(0)
    q, k, v, g = (rng.standard_normal((2, h, T, 8)).astype(dtype) for h in (heads, kv_heads, kv_heads, heads))
    whole = [it.tensor(a, requires_grad=True) for a in (q, k, v)]
    it.manual_seed(3)
    ref = it.nn.functional.scaled_dot_product_attention(*whole, is_causal=True, enable_gqa=kv_heads != heads,
                                                        dropout_p=dropout)
    ref.backward(it.tensor(g))
    mine = [it.tensor(local_chunks(a, group, dim=2), requires_grad=True) for a in (q, k, v)]
    it.manual_seed(3)
    out = ring_attention(*mine, group, dropout_p=dropout, enable_gqa=kv_heads != heads)
    out.backward(it.tensor(local_chunks(g, group, dim=2)))
    np.testing.assert_allclose(out.numpy(), local_chunks(ref.numpy(), group, dim=2), rtol=tol, atol=tol)
    for m, w in zip(mine, whole):
        np.testing.assert_allclose(m.grad.numpy(), local_chunks(w.grad.numpy(), group, dim=2), rtol=tol, atol=tol)
print(f"rank {rank}: ring ok", flush=True)
