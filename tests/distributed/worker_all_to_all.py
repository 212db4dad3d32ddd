"""Run under ``mpiexec -n N python worker_all_to_all.py`` (N >= 2): dist.all_to_all_single against numpy for even,
uneven and zero-size blocks, several dtypes and row shapes, sync and async, strided and raw arrays, on the world
and on a sub-group whose group ranks are not the world ranks; the argument errors (the same on every rank, so no
rank is left waiting); and the autograd ``all_to_all``: forward, the gradient as the exact opposite permutation of
an upstream gradient, and a float64 finite-difference check of a loss summed over ranks.
Every rank computes every rank's input (seeded by rank), so each checks its own result. Prints "rank R A2A OK N"."""
import ml_dtypes
import numpy as np

import infini_train as it
from infini_train import distributed as dist
from infini_train.backend import CPU
from infini_train.nn.parallel import all_to_all
from tests.distributed.rank_checks import RankChecks

world_group = dist.init_process_group("mpi", timeout=60)
rank, world = dist.get_rank(), dist.get_world_size()
assert world >= 2 and world_group.backend == "mpi", (world, world_group)
check = RankChecks(rank)
BF16 = np.dtype(ml_dtypes.bfloat16)


def tensor(array):
    return it.Tensor._make(array, CPU)  # wraps without copying: views stay views of their buffer


def matrix(kind, n):
    """S[i][j]: the rows group rank i sends group rank j."""
    if kind == "even":
        return [[2] * n for _ in range(n)]
    if kind == "uneven":
        return [[(i + 2 * j) % 3 + 1 + (i == j) for j in range(n)] for i in range(n)]
    if kind == "zeros":  # rank 0 sends nothing, the last rank receives nothing, some other pairs exchange nothing
        return [[0 if i == 0 or j == n - 1 else (i * j + i + j) % 3 for j in range(n)] for i in range(n)]
    return [[0] * n for _ in range(n)]  # "empty": nobody sends anything


KINDS = ("even", "uneven", "zeros", "empty")


def data(i, rows, row_shape, dtype, salt):
    """Rank i's input: distinct values (integers encode rank, row and element; floats are seeded normals)."""
    shape = (rows,) + tuple(row_shape)
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        return (np.arange(int(np.prod(shape))).reshape(shape) + 10_000 * (i + 1) + 1_000_000 * salt).astype(dtype)
    return np.random.default_rng(100 * salt + i).standard_normal(shape).astype(dtype)


def blocks(array, splits):
    return np.split(array, np.cumsum(splits)[:-1]) if len(splits) > 1 else [array]


def exchanged(S, me, arrays):
    """What group rank ``me`` receives: block ``me`` of every rank's array, in rank order (numpy's reference)."""
    return np.concatenate([blocks(arrays[j], S[j])[me] for j in range(len(S))])


def run_case(group, S, row_shape, dtype, async_op, salt, form="list", layout="contiguous"):
    n, me = group.size, group.rank
    inputs = [data(j, sum(S[j]), row_shape, dtype, salt) for j in range(n)]
    expected = exchanged(S, me, inputs)
    in_splits = S[me]
    out_splits = [S[j][me] for j in range(n)]
    if form == "tuple":
        in_splits, out_splits = tuple(in_splits), tuple(out_splits)
    elif form == "numpy":
        in_splits, out_splits = np.array(in_splits, np.int64), [np.int32(v) for v in out_splits]
    elif form == "none":
        in_splits = out_splits = None
    src = inputs[me].copy()
    out_shape = expected.shape
    if layout == "strided":  # a Fortran-ordered input and every other row of a bigger output
        src = np.asfortranarray(src)
        base = np.zeros((2 * out_shape[0],) + out_shape[1:], dtype)
        out = base[::2]
    else:
        base = out = np.full(out_shape, 7, dtype)
    target = tensor(out) if layout != "raw" else out
    version = target._version[0] if layout != "raw" else None
    work = dist.all_to_all_single(target, tensor(src) if layout != "raw" else src, out_splits, in_splits,
                                  group=group, async_op=async_op)
    label = f"{dtype} rows {row_shape} S={S} {form} {layout} async={async_op}"
    if async_op:
        check(isinstance(work, dist.Work) and work.wait() is True and work.is_completed(), f"async Work {label}")
    else:
        check(work is None, f"sync returns None {label}")
    check(out.dtype == dtype and out.shape == out_shape, f"dtype and shape {label}")
    check(out.tobytes() == expected.tobytes(), f"values {label}: {out} vs {expected}")
    check(np.array_equal(src, inputs[me]), f"input untouched {label}")
    if layout == "strided":
        check(not base[1::2].any(), f"rows between the strided output's untouched {label}")
    if layout != "raw":
        check(target._version[0] == version + 1, f"version bumped {label}")


# ---- every split kind x dtype x row shape, sync and async; then split-list forms and layouts
for kind in KINDS:
    S = matrix(kind, world)
    for dtype in (np.float32, np.float64, np.int64, BF16):
        for row_shape in ((), (2, 3)):
            for async_op in (False, True):
                run_case(world_group, S, row_shape, dtype, async_op, salt=len(row_shape))
    for form in ("tuple", "numpy"):
        run_case(world_group, S, (3,), np.float32, False, salt=5, form=form)
    for layout in ("strided", "raw"):
        run_case(world_group, S, (2, 3), np.float64, True, salt=6, layout=layout)
run_case(world_group, matrix("even", world), (4,), np.float32, False, salt=7, form="none")
run_case(world_group, matrix("even", world), (), np.int64, True, salt=8, form="none")

# ---- a sub-group: world ranks 1..N-1 are group ranks 0..N-2 (a group of one when N = 2)
rest = dist.new_group(range(1, world))
if rank >= 1:
    check(rest.rank == rank - 1 and rest.size == world - 1, "sub-group ranks")
    for kind in KINDS:
        run_case(rest, matrix(kind, rest.size), (2,), np.float64, kind == "uneven", salt=9)
    dist.destroy_process_group(rest)
dist.barrier()

# ---- argument errors: raised before any communication, the same on every rank
n_in = 2 * world
ok = [2] * world
mismatch = list(ok)
mismatch[rank], mismatch[(rank + 1) % world] = 3, 1
for kwargs, needle in (
        (dict(input_split_sizes=[2] * (world + 1)), f"all_to_all_single: expected input_split_sizes to hold one row "
                                                    f"count per rank of the group ({world}), got {world + 1} entries"),
        (dict(output_split_sizes=[-1] + [2] * (world - 2) + [3]), "expected output_split_sizes to hold non-negative "
                                                                  "ints, got -1 at index 0"),
        (dict(input_split_sizes=[1.5] * world), "expected input_split_sizes to hold non-negative ints, got 1.5"),
        (dict(input_split_sizes=[1] * world), f"expected input_split_sizes to sum to input.shape[0] = {n_in}, "
                                              f"got {[1] * world} (sum {world})"),
        (dict(output_split_sizes=mismatch), f"expected input_split_sizes[{rank}] == output_split_sizes[{rank}] (the "
                                            f"rows group rank {rank} sends itself), got 2 and 3"),
        (dict(input_split_sizes="22"), "expected input_split_sizes to be None or a list of ints, got str")):
    try:
        dist.all_to_all_single(tensor(np.zeros((n_in, 3))), tensor(np.ones((n_in, 3))), **kwargs)
    except (ValueError, TypeError) as exc:
        check(needle in str(exc) and "HINT:" in str(exc), f"error message {exc}")
    else:
        raise AssertionError(f"expected an error mentioning {needle!r}")
try:
    dist.all_to_all_single(tensor(np.zeros(world + 1)), tensor(np.ones(world + 1)))
except ValueError as exc:
    check(f"expected input.shape[0] divisible by the group size {world} when input_split_sizes is None, got "
          f"input.shape[0] = {world + 1}" in str(exc), f"indivisible message {exc}")
else:
    raise AssertionError("an indivisible even split was accepted")


# ---- autograd: forward, the gradient routed back exactly, and finite differences of a loss over every rank
def upstream(j, rows, row_shape, dtype):
    return np.random.default_rng(7000 + j).standard_normal((rows,) + row_shape).astype(dtype)


for kind in KINDS:
    S = matrix(kind, world)
    received = [sum(S[i][j] for i in range(world)) for j in range(world)]  # rows each rank receives
    for dtype in (np.float32, np.float64):
        for row_shape in ((), (2, 3)):
            inputs = [data(j, sum(S[j]), row_shape, dtype, 11) for j in range(world)]
            x = tensor(inputs[rank].copy())
            x.requires_grad = True
            y = all_to_all(x, [S[j][rank] for j in range(world)], S[rank], world_group)
            check(y.requires_grad and type(y.grad_fn).__name__ == "AllToAll", "all_to_all records its backward")
            check(y.numpy().tobytes() == exchanged(S, rank, inputs).tobytes(), f"all_to_all forward {kind} {dtype}")
            grads = [upstream(j, received[j], row_shape, dtype) for j in range(world)]
            g = grads[rank].copy()
            y.backward(tensor(g))
            check(np.array_equal(g, grads[rank]), "the upstream gradient is left untouched")
            # rank i's rows went to rank j at offset sum_{k<i} S[k][j]: their gradient comes back from there
            want = np.concatenate([grads[j][sum(S[k][j] for k in range(rank)):][:S[rank][j]] for j in range(world)])
            check(x.grad.shape == x.shape and x.grad.numpy().tobytes() == want.tobytes(),
                  f"all_to_all gradient {kind} {dtype}: {x.grad.numpy()} vs {want}")

S = matrix("uneven", world)
out_splits, row_shape = [S[j][rank] for j in range(world)], (2,)
x0 = data(rank, sum(S[rank]), row_shape, np.float64, 12)
weights = upstream(rank, sum(out_splits), row_shape, np.float64)


def loss(x_array):
    """This rank's part of L = sum over ranks of sum(sin(y) * w) (local: autograd sends the rest back)."""
    return (all_to_all(x_array, out_splits, S[rank]).sin() * tensor(weights)).sum()


x = tensor(x0.copy())
x.requires_grad = True
loss(x).backward()
h = 1e-6
for p in range(world):  # every rank perturbs in turn; all take part in every forward
    for e in (0, sum(S[p]) * 2 - 1):
        totals = []
        for step in (h, -h):
            moved = x0.copy()
            if rank == p:
                moved.flat[e] += step
            with it.no_grad():
                total = tensor(np.array([loss(tensor(moved)).item()]))
            dist.all_reduce(total)
            totals.append(total.item())
        if rank == p:
            fd = (totals[0] - totals[1]) / (2 * h)
            check(abs(fd - x.grad.numpy().flat[e]) <= 1e-7 + 1e-6 * abs(fd), f"finite differences at {e}: {fd}")

try:
    all_to_all(tensor(np.ones((n_in, 2))), ok, [1] * world)
except ValueError as exc:
    check(f"expected input_split_sizes to sum to input.shape[0] = {n_in}" in str(exc), f"all_to_all error {exc}")
else:
    raise AssertionError("all_to_all accepted a split list that does not cover its input")

dist.barrier()
dist.destroy_process_group()
print(f"rank {rank} A2A OK {check.count}", flush=True)
