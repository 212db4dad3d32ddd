"""``mpiexec -n N python tests/distributed/capped_train.py MB --config ... key=value ...``: train.py's run with each
rank's address space capped (RLIMIT_AS) at its size once started up plus MB megabytes, so a rank that needs more
memory than that fails with MemoryError instead of using it."""
import os
import resource
import sys

from mpi4py import MPI  # noqa: F401  (MPI's own start-up mappings come before the cap)

import infini_train  # noqa: F401
from infini_train.training.cli import run_script


def address_space_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


if __name__ == "__main__":
    allowance = int(float(sys.argv[1]) * 2 ** 20)
    cap = address_space_bytes() + allowance
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    print(f"rank {os.environ.get('PMI_RANK', '0')}: address space capped at {cap / 2 ** 20:.0f} MB", flush=True)
    sys.argv = [sys.argv[0]] + sys.argv[2:]
    sys.exit(run_script())
