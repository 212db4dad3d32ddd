"""The one-machine Slurm cluster the cluster tests submit to: started once per test session (by the worker that
runs them; they share an xdist group) and stopped at its end, so nothing is left running."""
import os
import re
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SLURM_UP = os.path.join(HERE, "slurm_up.sh")
PACKAGES_MISSING = 3  # slurm_up.sh / install_packages.sh: the packages are missing and cannot be installed here


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """The environment (SLURM_CONF set) in which Slurm's commands reach the test cluster."""
    directory = tmp_path_factory.mktemp("slurm")
    up = subprocess.run([SLURM_UP, str(directory)], capture_output=True, text=True, timeout=600)
    if up.returncode == PACKAGES_MISSING:
        pytest.skip(f"no Slurm here: {up.stderr.strip()}")
    assert up.returncode == 0, f"slurm_up.sh failed ({up.returncode}):\n{up.stdout}\n{up.stderr}"
    try:
        yield dict(os.environ, SLURM_CONF=str(directory / "slurm.conf"))
    finally:
        subprocess.run([SLURM_UP, "--stop", str(directory)], capture_output=True, timeout=120)


@pytest.fixture(scope="session")
def open_mpi():
    """The first line of Open MPI's ``mpirun --version``, installed from Debian's packages when missing."""
    install = subprocess.run([os.path.join(HERE, "install_packages.sh"), "openmpi"], capture_output=True, text=True,
                             timeout=600)
    if install.returncode == PACKAGES_MISSING:
        pytest.skip(f"no Open MPI here: {install.stderr.strip()}")
    assert install.returncode == 0, f"install_packages.sh openmpi failed:\n{install.stdout}\n{install.stderr}"
    version = subprocess.run(["mpirun.openmpi", "--version"], capture_output=True, text=True, timeout=60).stdout
    assert re.search(r"Open ?MPI|OpenRTE", version), version  # Open MPI 4's mpirun names its runtime, OpenRTE
    return version.splitlines()[0]
