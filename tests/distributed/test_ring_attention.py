"""Ring attention over 2 and 3 context-parallel ranks against causal attention over the whole sequence in one
process (worker_ring_attention.py): outputs and gradients, grouped-query heads, float32, dropout."""
import pytest

from tests.distributed.mpi_jobs import mpirun, needs_mpiexec, output

pytestmark = [needs_mpiexec, pytest.mark.layouts]


@pytest.mark.parametrize("ranks", [2, 3])
def test_ring_attention_equals_whole_sequence_attention(ranks):
    proc = mpirun(ranks, "worker_ring_attention.py", timeout=120)
    assert proc.returncode == 0, output(proc)
    assert proc.stdout.count("ring ok") == ranks, output(proc)
