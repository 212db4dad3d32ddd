"""bfloat16 stacks of matrices on a GPU (cuBLAS's strided batched GEMM) against torch CUDA's bfloat16 matmul and
against the host's widened product. Marked cuda: skipped without cupy and a GPU."""
import numpy as np
import pytest

import infini_train as it
from infini_train.autograd.ops import low_precision as lp
from tests.autograd.test_low_precision import assert_ulps

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not it.backend.cuda_available(), reason="needs cupy and an NVIDIA GPU")]

CASES = {  # the stacks drawn for a and b, and which one enters as its transpose (a view of the contiguous stack)
    "3d": ((6, 33, 17), (6, 17, 29), None),
    "4d-kT": ((2, 3, 40, 16), (2, 3, 40, 16), "b"),  # attention's q @ k^T
    "4d-pT": ((2, 3, 40, 24), (2, 3, 40, 16), "a"),  # attention backward's p^T @ g
    "broadcast": ((5, 12, 8), (8, 7), None),
    "broadcast-batch": ((2, 1, 9, 8), (1, 4, 8, 3), None),
    "empty-inner": ((3, 4, 0), (3, 0, 5), None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bfloat16_stacks_on_the_gpu_match_torch_cuda_and_the_host(case):
    import cupy
    import torch

    a_shape, b_shape, flipped = CASES[case]
    rng = np.random.default_rng(0)
    a = rng.standard_normal(a_shape).astype(it.bfloat16)
    b = rng.standard_normal(b_shape).astype(it.bfloat16)
    ga, gb = cupy.asarray(a), cupy.asarray(b)
    if flipped == "a":  # the operand is the transpose of the stack drawn: a view, not contiguous
        a, ga = np.swapaxes(a, -1, -2), cupy.swapaxes(ga, -1, -2)
    if flipped == "b":
        b, gb = np.swapaxes(b, -1, -2), cupy.swapaxes(gb, -1, -2)
    assert flipped is None or not (ga if flipped == "a" else gb).flags.c_contiguous
    got = lp.matmul(cupy, ga, gb)
    assert got.dtype == it.bfloat16
    host = lp.matmul(np, a, b)
    assert got.shape == host.shape
    assert_ulps(got.get().astype(np.float32), host.astype(np.float32), "bfloat16", ulps=1, floor=1e-2,
                what="cuBLAS vs the host's float32 product")
    th = torch.matmul(torch.tensor(a.astype(np.float32), device="cuda").bfloat16(),
                      torch.tensor(b.astype(np.float32), device="cuda").bfloat16()).float().cpu().numpy()
    assert_ulps(got.get().astype(np.float32), th, "bfloat16", ulps=1, floor=1e-2, what="cuBLAS vs torch CUDA")
