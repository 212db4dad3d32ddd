import os
import subprocess
import sys

import pytest

from tests.blas_coretype import cpu_flags, other_coretype, running_coretype

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("running,machine,flags,expected", [
    ("SkylakeX", "x86_64", ["avx512f"], "Haswell"),
    ("SapphireRapids", "x86_64", ["avx512f"], "Haswell"),
    ("Haswell", "x86_64", ["avx2", "avx512f"], "SkylakeX"),
    ("Zen", "x86_64", ["avx2"], "Sandybridge"),
    ("NEOVERSEN1", "aarch64", [], "NEOVERSEN1"),
])
def test_the_second_pass_takes_another_kernel_family(running, machine, flags, expected):
    assert other_coretype(running, machine, flags) == expected


def test_the_command_names_a_family_other_than_the_one_this_environment_runs():
    running = running_coretype()
    assert running  # numpy's OpenBLAS says which kernels it runs
    chosen = subprocess.run([sys.executable, "-m", "tests.blas_coretype"], capture_output=True, text=True, cwd=REPO,
                            timeout=60, check=True).stdout.strip()
    assert chosen == other_coretype(running, os.uname().machine, cpu_flags())
    if os.uname().machine == "x86_64":
        assert chosen.lower() != running.lower()
        forced = subprocess.run([sys.executable, "-c", "from tests.blas_coretype import running_coretype as r; "
                                 "print(r())"], capture_output=True, text=True, cwd=REPO, timeout=60, check=True,
                                env=dict(os.environ, OPENBLAS_CORETYPE=chosen)).stdout.strip()
        assert forced.lower() == chosen.lower()  # OpenBLAS takes the family asked for
