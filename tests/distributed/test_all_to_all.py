"""dist.all_to_all_single and the autograd all_to_all: real MPI jobs of 2, 3 and 4 ranks against numpy
(worker_all_to_all.py), a world of one in process (SingleProcessGroup), the argument errors, and the NCCL backend's
grouped send/recv plan, run here on simulated ranks (no GPU): each rank's ncclSend/ncclRecv calls are recorded and
the bytes delivered between them as NCCL would."""
import ctypes
from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest

import infini_train as it
from infini_train.distributed import Work
from infini_train.distributed import nccl_backend
from infini_train.distributed.nccl_backend import NCCLProcessGroup, all_to_all_plan
from infini_train.distributed.process_group import ProcessGroup, SingleProcessGroup
from infini_train.nn.parallel import all_to_all
from tests.distributed.mpi_jobs import assert_every_rank_checked, mpirun, needs_mpiexec, output

pytestmark = pytest.mark.layouts


@needs_mpiexec
@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_all_to_all_single_and_its_autograd_function_on_mpi_match_numpy(ranks):
    # even / uneven / zero-size / all-empty blocks x float32, float64, int64, bfloat16 x 1-D and 3-D rows x sync and
    # async; split lists as tuples and numpy ints, None; strided and raw arrays; a sub-group; the argument errors;
    # all_to_all's forward, its gradient (the exact opposite permutation) and finite differences
    proc = mpirun(ranks, "worker_all_to_all.py", timeout=300)
    assert proc.returncode == 0, output(proc)
    assert_every_rank_checked(proc, "A2A OK", ranks, at_least=451)


# ---------------------------------------------------------------------------------------- a world of one
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
@pytest.mark.parametrize("shape", [(5,), (4, 2, 3), (0, 3)])
def test_world_of_one_copies_input_into_output(dtype, shape):
    g = SingleProcessGroup(timeout=3)
    src = it.tensor(np.arange(np.prod(shape), dtype=dtype).reshape(shape))
    out = it.tensor(np.full(shape, -1, dtype))
    assert g.all_to_all_single(out, src) is None
    assert out.numpy().tobytes() == src.numpy().tobytes() and out.version == 1 and src.version == 0
    out2 = it.tensor(np.zeros(shape, dtype))
    work = g.all_to_all_single(out2, src, [shape[0]], (shape[0],), async_op=True)
    assert isinstance(work, Work) and work.wait() is True and work.timeout == 3.0
    assert np.array_equal(out2.numpy(), src.numpy()) and out2.dtype == dtype


def test_world_of_one_autograd_all_to_all_is_a_copy_with_an_identity_gradient():
    g = SingleProcessGroup()
    x = it.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], requires_grad=True)
    y = all_to_all(x, [3], np.array([3]), g)
    assert y.tolist() == x.tolist() and y.grad_fn is not None
    y.numpy()[0, 0] = 100.0  # a new array, not a view of the input
    assert x.tolist()[0][0] == 1.0
    upstream = it.tensor([[0.5, -1.0], [2.0, 0.25], [3.0, 4.0]])
    (y * upstream).sum().backward()
    assert x.grad.tolist() == upstream.tolist()
    z = all_to_all(it.tensor([1.0, 2.0], requires_grad=True), group=g)  # None splits: equal blocks
    assert z.tolist() == [1.0, 2.0]


@pytest.mark.parametrize("call, error, needle", [
    (lambda g: g.all_to_all_single(it.zeros(4), it.zeros(4), [2, 2], [4]), ValueError,
     "all_to_all_single: expected output_split_sizes to hold one row count per rank of the group (1), got 2 entries "
     "[2, 2]\nHINT: entry j is the rows exchanged with group rank j of [0]"),
    (lambda g: g.all_to_all_single(it.zeros(4), it.zeros(4), [4], [-4]), ValueError,
     "all_to_all_single: expected input_split_sizes to hold non-negative ints, got -4 at index 0 of [-4]\nHINT"),
    (lambda g: g.all_to_all_single(it.zeros(4), it.zeros(4), [4], [True]), ValueError,
     "expected input_split_sizes to hold non-negative ints, got True at index 0"),
    (lambda g: g.all_to_all_single(it.zeros(4), it.zeros(4), [4.0], [4]), ValueError,
     "expected output_split_sizes to hold non-negative ints, got 4.0 at index 0"),
    (lambda g: g.all_to_all_single(it.zeros(4), it.zeros(4), [3], [4]), ValueError,
     "all_to_all_single: expected output_split_sizes to sum to output.shape[0] = 4, got [3] (sum 3)\nHINT: the "
     "blocks cover dim 0 of output exactly, in rank order"),
    (lambda g: g.all_to_all_single(it.zeros(2), it.zeros(3), [2], [3]), ValueError,
     "all_to_all_single: expected input_split_sizes[0] == output_split_sizes[0] (the rows group rank 0 sends "
     "itself), got 3 and 2\nHINT: rank i's input_split_sizes[j] must be rank j's output_split_sizes[i]"),
    (lambda g: g.all_to_all_single(it.zeros(4), it.zeros(4), 4, None), TypeError,
     "all_to_all_single: expected output_split_sizes to be None or a list of ints, got int\nHINT"),
    (lambda g: g.all_to_all_single(it.zeros(4, dtype=it.float64), it.zeros(4)), ValueError,
     "all_to_all_single: expected input and output of one dtype, got input float32 and output float64\nHINT"),
    (lambda g: g.all_to_all_single(it.zeros(4, 2), it.zeros(4, 3)), ValueError,
     "all_to_all_single: expected output rows of input's row shape input.shape[1:] = (3,), got output of shape "
     "(4, 2) for input of shape (4, 3)\nHINT: allocate output as it.empty((sum(output_split_sizes),) + "
     "input.shape[1:])"),
    (lambda g: g.all_to_all_single(it.zeros(()), it.zeros(())), ValueError,
     "all_to_all_single: expected input with a dim 0 to split into rows, got a 0-d input\nHINT"),
    (lambda g: g.all_to_all_single(it.zeros(2, device="cpu:1"), it.zeros(2)), ValueError,
     "expected input and output on one device, got input on cpu and output on cpu:1\nHINT"),
    (lambda g, buf=np.arange(6.0): g.all_to_all_single(buf[2:5], buf[:3]), ValueError,
     "all_to_all_single: expected output separate from input, got output of shape (3,) overlapping input of shape "
     "(3,) in memory\nHINT"),
    (lambda g: g.all_to_all_single(np.broadcast_to(np.ones(1), (2,)), np.zeros(2)), ValueError,
     "all_to_all_single: expected a writable tensor"),
    (lambda g: all_to_all(it.ones(3, requires_grad=True), [2], [3], g), ValueError,
     "all_to_all_single: expected input_split_sizes[0] == output_split_sizes[0] (the rows group rank 0 sends "
     "itself), got 3 and 2"),
])
def test_argument_errors(call, error, needle):
    with pytest.raises(error) as info:
        call(SingleProcessGroup())
    assert needle in str(info.value)


def test_split_checks_on_a_group_of_three_without_communication():
    g = ProcessGroup([4, 5, 6], rank=1)  # the checks only: no backend behind it
    with pytest.raises(ValueError, match=r"expected input.shape\[0\] divisible by the group size 3 when "
                                         r"input_split_sizes is None, got input.shape\[0\] = 7\nHINT"):
        g.all_to_all_single(it.zeros(6), it.zeros(7), None, None)
    with pytest.raises(ValueError, match=r"one row count per rank of the group \(3\), got 2 entries \[1, 1\]\n"
                                         r"HINT: entry j is the rows exchanged with group rank j of \[4, 5, 6\]"):
        g.all_to_all_single(it.zeros(6), it.zeros(2), None, [1, 1])
    assert g._check_all_to_all("a2a", np.zeros(3), np.zeros(9), np.zeros(3), np.zeros(9), None,
                               np.array([4, 1, 4])) == ((1, 1, 1), (4, 1, 4))


# --------------------------------------------------------------------------------- NCCL, on simulated ranks
def test_nccl_plan_skips_empty_blocks_and_offsets_in_bytes():
    assert all_to_all_plan([2, 0, 1], [0, 3, 1], 8) == [
        ("send", 0, 0, 16), ("recv", 1, 0, 24), ("send", 2, 16, 8), ("recv", 2, 24, 8)]
    assert all_to_all_plan([0, 0], [0, 0], 4) == [] and all_to_all_plan([3, 1], [2, 2], 0) == []


class _FakeDeviceArray:
    """Host memory dressed as a cupy array on cuda:0 (what NCCLProcessGroup reads: shape, itemsize, data.ptr)."""

    def __init__(self, array):
        self.array, self.shape, self.dtype, self.itemsize = array, array.shape, array.dtype, array.itemsize
        self.flags, self.data, self.device = array.flags, SimpleNamespace(ptr=array.ctypes.data), SimpleNamespace(id=0)


class _Network:
    """NCCL between simulated ranks: sends queue their bytes per (src, dst), receives take them in call order."""

    def __init__(self):
        self.queues, self.receives, self.depth = defaultdict(list), [], 0
        self.module = SimpleNamespace(groupStart=self._start, groupEnd=self._end)

    def _start(self):
        self.depth += 1

    def _end(self):
        self.depth -= 1

    def comm(self, me):
        def send(ptr, nbytes, dtype, peer, stream):
            assert self.depth == 1 and dtype == "bytes" and stream == 42
            self.queues[me, peer].append(ctypes.string_at(ptr, nbytes))

        def recv(ptr, nbytes, dtype, peer, stream):
            assert self.depth == 1 and dtype == "bytes" and stream == 42
            self.receives.append((peer, me, ptr, nbytes))
        return SimpleNamespace(send=send, recv=recv)

    def deliver(self):
        for src, dst, ptr, nbytes in self.receives:
            message = self.queues[src, dst].pop(0)
            assert len(message) == nbytes
            ctypes.memmove(ptr, message, nbytes)
        assert not any(self.queues.values())


@pytest.mark.parametrize("n, row_shape, dtype", [(3, (2, 2), np.float32), (4, (), np.int64), (2, (5,), np.float64)])
def test_nccl_all_to_all_single_as_grouped_send_recv_on_simulated_ranks(monkeypatch, n, row_shape, dtype):
    net = _Network()
    monkeypatch.setattr(nccl_backend, "_nccl", lambda: net.module)
    S = [[0 if i == 0 or j == n - 1 else (i + 2 * j) % 3 + 1 for j in range(n)] for i in range(n)]  # zeros included
    inputs = [np.random.default_rng(i).integers(-99, 99, (sum(S[i]),) + row_shape).astype(dtype) for i in range(n)]
    outs, finishes = [], []
    for me in range(n):
        group = object.__new__(NCCLProcessGroup)
        ProcessGroup.__init__(group, range(n), me)
        group.device, group._bytes = SimpleNamespace(id=0), "bytes"
        group._launch = lambda name, call, finish=None, keep=None, me=me: finishes.append(call(net.comm(me), 42))
        out = np.full((sum(S[i][me] for i in range(n)),) + row_shape, -1, dtype)
        group._all_to_all_single(_FakeDeviceArray(out), _FakeDeviceArray(inputs[me]), [S[i][me] for i in range(n)],
                                 S[me])
        outs.append(out)
    net.deliver()
    assert net.depth == 0 and len(finishes) == n
    for me in range(n):
        want = [np.split(inputs[i], np.cumsum(S[i])[:-1])[me] for i in range(n)]
        assert outs[me].tobytes() == np.concatenate(want).tobytes()
