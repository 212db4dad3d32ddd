"""DeepSeek-V3's multi-token prediction under tensor parallelism (worker_deepseek_mtp.py): TP2 and TP2 with sequence
parallelism give the one-process loss, MTP loss and every gradient (float64, 1e-10)."""
from tests.distributed.mpi_jobs import assert_every_rank_checked, mpirun, needs_mpiexec, output


@needs_mpiexec
def test_mtp_under_tensor_and_sequence_parallelism_matches_one_process():
    proc = mpirun(2, "worker_deepseek_mtp.py", timeout=180)
    assert proc.returncode == 0, output(proc)
    assert_every_rank_checked(proc, "MTP OK", 2, at_least=100)
