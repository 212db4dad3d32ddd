"""DeepSeek-MoE routing across ranks (worker_deepseek_moe.py): an expert-parallel and a data-parallel DeepSeekMoE
equal the one-process layer (outputs, input and expert gradients, routing with the biased choice and unbiased
weights), and the auxiliary-loss-free bias update, from the loads summed over the data ranks, keeps the correction
bias equal to the one-process one on every rank; the sequence-wise balance loss over slices of the sequences
(sequence parallelism) sums to the one-process loss and gradient."""
import pytest

from tests.distributed.mpi_jobs import assert_every_rank_checked, mpirun, needs_mpiexec, output

pytestmark = pytest.mark.layouts


@needs_mpiexec
@pytest.mark.parametrize("ranks", [2, 4])
def test_deepseek_moe_across_ranks_matches_one_process(ranks):
    proc = mpirun(ranks, "worker_deepseek_moe.py", timeout=180)
    assert proc.returncode == 0, output(proc)
    assert_every_rank_checked(proc, "DS OK", ranks, at_least=45)
