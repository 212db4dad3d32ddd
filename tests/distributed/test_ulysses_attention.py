"""Ulysses attention over 2 and 4 context-parallel ranks, and hybrid (all-to-all inside pairs, ring across) over 4,
against causal attention over the whole sequence in one process (worker_ulysses_attention.py): outputs and
gradients, grouped-query heads, float32, dropout, attention sinks and sliding windows; heads that do not split are
refused."""
import pytest

from tests.distributed.mpi_jobs import mpirun, needs_mpiexec, output

pytestmark = [needs_mpiexec, pytest.mark.layouts]


@pytest.mark.parametrize("ranks,cases", [(2, 8), (4, 10)])
def test_ulysses_attention_equals_whole_sequence_attention(ranks, cases):
    proc = mpirun(ranks, "worker_ulysses_attention.py", timeout=120)
    assert proc.returncode == 0, output(proc)
    assert proc.stdout.count(f"ulysses ok {cases}") == ranks, output(proc)
