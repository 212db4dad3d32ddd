"""GradScaler on a real 2-rank job: the ranks agree on skipping when only one of them sees an inf/nan gradient."""
import os
import re

from tests.distributed.mpi_jobs import mpirun, needs_mpiexec, output

HERE = os.path.dirname(os.path.abspath(__file__))
# growth_interval 2 from 2**16: grow, back off (rank 1's inf at step 2), two clean steps, grow, back off (rank 0's
# nan at step 5), two clean steps, grow
EXPECTED_SCALES = [2.0**16, 2.0**17, 2.0**16, 2.0**16, 2.0**17, 2.0**16, 2.0**16, 2.0**17]


@needs_mpiexec
def test_inf_on_one_rank_makes_both_ranks_skip_and_back_off():
    proc = mpirun(2, os.path.join(HERE, "worker_grad_scaler.py"), timeout=300)
    assert proc.returncode == 0, output(proc)
    for rank in (0, 1):
        assert f"rank {rank} GRADSCALER OK" in proc.stdout, output(proc)
    # ranks print concurrently, so lines may run together: match the reports anywhere in the output
    reports = re.findall(r"rank (\d) (\w+) scales (\[[^\]]*\])", proc.stdout)
    assert sorted((r, g) for r, g, _ in reports) == [("0", "new_group"), ("0", "world"), ("1", "new_group"),
                                                     ("1", "world")], output(proc)
    assert {s for _, _, s in reports} == {str(EXPECTED_SCALES)}, output(proc)
