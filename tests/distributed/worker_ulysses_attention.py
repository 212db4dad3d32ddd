"""Under ``mpiexec -n N``: Ulysses attention over N ranks (each holding chunks r and 2N-1-r of the sequence; all-to-all
to a head split) gives the outputs and q / k / v gradients of causal attention over the whole sequence in one
process: plain and grouped-query heads, float64 and float32, dropout drawing the one-process masks (materialised and
memory-efficient paths), attention sinks (their gradient summed over the ranks) and a sliding window; at N = 4 also
hybrid (all-to-all inside pairs, ring across them) with dropout; heads the group cannot share are refused. Prints
"rank R: ulysses ok C" (C: the cases checked)."""
import numpy as np

import infini_train as it
from infini_train import distributed as dist
from infini_train.autograd.op_errors import OpError
from infini_train.distributed.mesh import ProcessMesh
from infini_train.nn.attention import SDPBackend, sdpa_kernel
from infini_train.nn.parallel.context_parallel import context_attention, context_parallel, local_chunks

dist.init_process_group("mpi")
world = dist.default_group()
rank, n = world.rank, world.size
mesh = ProcessMesh(context=n, context_a2a=2) if n == 4 else None
F = it.nn.functional
W = 2 if n == 2 else 1  # heads per rank at the smallest


def case(method, dtype, heads, kv_heads, dropout=0.0, sinks=False, window=None, blocked=False, tol=1e-12):
    T = 2 * n * 6
    rng = np.random.default_rng(heads + kv_heads)
    q, k, v, g = (rng.standard_normal((2, h, T, 8)).astype(dtype) for h in (heads, kv_heads, kv_heads, heads))
    sink = rng.standard_normal(heads).astype(dtype) if sinks else None
    gqa = kv_heads != heads
    whole = [it.tensor(a, requires_grad=True) for a in (q, k, v)]
    whole_sink = it.tensor(sink, requires_grad=True) if sinks else None
    path = sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION if blocked else SDPBackend.MATH)
    with path:
        it.manual_seed(3)
        ref = F.scaled_dot_product_attention(*whole, is_causal=True, enable_gqa=gqa, dropout_p=dropout,
                                             sinks=whole_sink, sliding_window=window)
        ref.backward(it.tensor(g))
        mine = [it.tensor(local_chunks(a, world, dim=2), requires_grad=True) for a in (q, k, v)]
        my_sink = it.tensor(sink, requires_grad=True) if sinks else None
        groups = dict(a2a_group=mesh.context_a2a_group, ring_group=mesh.context_ring_group) if method == "hybrid" \
            else {}
        it.manual_seed(3)
        with context_parallel(world, method, **groups):
            out = context_attention(*mine, dropout_p=dropout, enable_gqa=gqa, sinks=my_sink, window=window)
        out.backward(it.tensor(local_chunks(g, world, dim=2)))
    np.testing.assert_allclose(out.numpy(), local_chunks(ref.numpy(), world, dim=2), rtol=tol, atol=tol)
    for m, w in zip(mine, whole):
        np.testing.assert_allclose(m.grad.numpy(), local_chunks(w.grad.numpy(), world, dim=2), rtol=tol, atol=tol)
    if sinks:  # each rank's heads get their whole gradient, the others none: the sum over the ranks is the whole
        total = it.tensor(my_sink.grad.numpy())
        dist.all_reduce(total)
        np.testing.assert_allclose(total.numpy(), whole_sink.grad.numpy(), rtol=tol, atol=tol)


cases = [
    ("ulysses", np.float64, n * W, n * W),
    ("ulysses", np.float64, 2 * n * W, n * W),  # grouped-query heads: the key/value heads split too
    ("ulysses", np.float32, n * W, n * W, 0.0, False, None, False, 2e-5),
    ("ulysses", np.float64, 2 * n, n, 0.25),  # dropout: the masks of one process's heads
    ("ulysses", np.float64, 2 * n, n, 0.25, False, None, True),  # and on the memory-efficient path
    ("ulysses", np.float64, 2 * n, n, 0.0, True, 5),  # attention sinks and a sliding window (gpt-oss)
    ("ulysses", np.float64, 2 * n, n, 0.0, True, None, True),
]
if n == 4:
    cases += [("hybrid", np.float64, 4, 2), ("hybrid", np.float64, 4, 2, 0.25)]
for spec in cases:
    case(*spec)
    dist.barrier()
try:
    bad = it.tensor(np.zeros((1, n + 1, 2 * n, 4)))
    with context_parallel(world, "ulysses"):
        context_attention(bad, bad, bad)
    raise AssertionError("heads the group cannot share were accepted")
except OpError as exc:
    assert f"query heads divisible by the all-to-all group's {n} ranks" in str(exc) and "HINT" in str(exc), exc
print(f"rank {rank}: ulysses ok {len(cases) + 1}", flush=True)
