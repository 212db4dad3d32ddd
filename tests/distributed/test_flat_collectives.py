"""The flat collectives all_gather_into_tensor and reduce_scatter_tensor: real MPI jobs of 1, 2 and 3 ranks, a
world of one without a launcher, and in-process checks on a SingleProcessGroup. The NCCL versions run in
worker_nccl.py (test_nccl.py, GPU machines only)."""
import os
import re

import numpy as np
import pytest

import infini_train as it
from infini_train.distributed import ReduceOp, Work
from infini_train.distributed.process_group import SingleProcessGroup
from tests.distributed.mpi_jobs import HERE, assert_every_rank_checked, mpirun, needs_mpiexec, output, python


@needs_mpiexec
@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_flat_collectives_on_mpi_match_numpy(ranks):
    # every dtype (float32/64, int32/64, float16, bfloat16, bool), shape and layout (flat, stacked, rows), in place
    # and not, sync and async, every ReduceOp, a sub-group, zero-copy on host arrays, and the argument errors
    proc = mpirun(ranks, "worker_flat_collectives.py", "mpi", timeout=300)
    assert proc.returncode == 0, output(proc)
    assert_every_rank_checked(proc, "FLAT OK", ranks, at_least=5001)


def test_flat_collectives_in_a_world_of_one_without_a_launcher():
    proc = python(os.path.join(HERE, "worker_flat_collectives.py"), "single")
    assert proc.returncode == 0, output(proc)
    assert re.fullmatch(r"rank 0 FLAT OK \d+", proc.stdout.strip()), output(proc)


def test_single_process_group_copies_unless_in_place_and_bumps_versions():
    g = SingleProcessGroup(timeout=3)
    out, src = it.zeros(2, 3), it.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    work = g.all_gather_into_tensor(out, src, async_op=True)
    assert isinstance(work, Work) and work.wait() and work.timeout == 3.0
    assert out.tolist() == [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]] and out.version == 1 and src.version == 0
    flat = np.arange(4.0)
    assert g.all_gather_into_tensor(flat, flat) is None and flat.tolist() == [0.0, 1.0, 2.0, 3.0]
    for op in ("sum", ReduceOp.AVG, "max", "min", "product"):
        res = it.zeros(3)
        g.reduce_scatter_tensor(res, it.tensor([[7.0, 8.0, 9.0]]), op)
        assert res.tolist() == [7.0, 8.0, 9.0] and res.version == 1


@pytest.mark.parametrize("call, error, needle", [
    (lambda g: g.all_gather_into_tensor(it.zeros(3), it.zeros(2)), ValueError,
     "all_gather_into_tensor: expected output to hold group size x input.numel() = 1 x 2 = 2 elements, got output "
     "of shape (3,) (3 elements) for input of shape (2,)\nHINT: allocate output as it.empty(2)"),
    (lambda g: g.reduce_scatter_tensor(it.zeros(2), it.zeros(2, dtype=it.float64)), ValueError,
     "reduce_scatter_tensor: expected output and input of one dtype, got output float32 and input float64\nHINT"),
    (lambda g: g.all_gather_into_tensor(it.zeros(2, 2).array.T, np.zeros((2, 2), np.float32)), ValueError,
     "all_gather_into_tensor: expected a contiguous output, got a strided view of shape (2, 2) (strides (4, 8))"),
    (lambda g: g.all_gather_into_tensor(it.zeros(2, device="cpu:1"), it.zeros(2)), ValueError,
     "expected input and output on one device, got input on cpu and output on cpu:1\nHINT"),
    (lambda g, buf=np.arange(4.0): g.reduce_scatter_tensor(buf[1:3], buf[:2]), ValueError,
     "expected output to be separate from input or exactly this rank's chunk of it (elements [0, 2) for group rank "
     "0), got output overlapping input from element 1\nHINT"),
    (lambda g: g.reduce_scatter_tensor(it.zeros(2, dtype=it.int32), it.zeros(2, dtype=it.int32), "avg"), ValueError,
     "reduce_scatter_tensor: expected a floating tensor for ReduceOp.AVG"),
    (lambda g: g.all_gather_into_tensor(np.broadcast_to(np.ones(1), (2,)), np.zeros(2)), ValueError,
     "all_gather_into_tensor: expected a writable tensor"),
])
def test_flat_collective_argument_errors(call, error, needle):
    with pytest.raises(error) as info:
        call(SingleProcessGroup())
    assert needle in str(info.value)
