"""benchmarks/check_kernels.py, the GPU phase's results table, runs through on the host (--device cpu --small): one
row per case of every candidate kernel, each saying the kernel did not run there and the results are the array
path's bit for bit; an unknown --only name is a usage error naming the candidates."""
import importlib.util
import pathlib

import pytest

from infini_train.kernels import registry

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "check_kernels.py"


def _script():
    spec = importlib.util.spec_from_file_location("check_kernels", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_table_has_a_row_per_case_of_every_kernel(tmp_path):
    out = tmp_path / "kernels.md"
    assert _script().main(["--device", "cpu", "--small", "--repeats", "1", "--warmup", "0", "--out", str(out)]) == 0
    rows = out.read_text().splitlines()[2:]
    assert {row.split(" | ")[0].strip("| ") for row in rows} == set(registry.KERNELS)
    assert all(" | no: host arrays | 0.00e+00 (out) | yes | " in row for row in rows)


def test_an_unknown_kernel_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        _script().main(["--only", "flash_atention"])
    assert "unknown kernels ['flash_atention']" in capsys.readouterr().err
