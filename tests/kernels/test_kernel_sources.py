"""Every fused kernel's CUDA source compiles with nvcc for Hopper (sm_90) in the dtype combinations the Ops use:
compile errors show up where there is no GPU. Skipped without nvcc."""
import os
import shutil
import subprocess

import pytest

from infini_train.kernels import (SOURCES, classifier, cuda_source, flash_attention_source,  # noqa: F401 (register)
                                  gelu_forward, norm_forward)

NVCC = shutil.which("nvcc")
COMBINATIONS = {  # family -> the dtypes of its roles
    "gelu": [dict(X="float32", G="float32"), dict(X="bfloat16", G="float16")],
    "layer_norm": [dict(X="bfloat16", W="float32", G="bfloat16"), dict(X="float16", W="float16", G="float32")],
    "softmax": [dict(S="bfloat16")],
    "adam": [dict()],
    "flash_attention": [dict(X="bfloat16"), dict(X="float16")],
    "classifier": [dict(X="float32"), dict(X="bfloat16"), dict(X="float16")],
    "norm_forward": [dict(X="bfloat16", W="float32"), dict(X="float32", W="float32"), dict(X="float16", W="float16")],
    "gelu_forward": [dict(X="bfloat16"), dict(X="float32"), dict(X="float16")],
}


def test_every_family_is_checked_with_every_role_it_declares():
    assert sorted(COMBINATIONS) == sorted(SOURCES)
    for family, combinations in COMBINATIONS.items():
        assert all(sorted(roles) == sorted(cuda_source.ROLES[family]) for roles in combinations), family


def test_a_kernel_asked_for_without_one_of_its_dtypes_is_a_clear_error():
    with pytest.raises(ValueError, match=r"fused kernel gelu: expected dtypes for the roles \('X', 'G'\), got \['X'\]"):
        cuda_source.function("gelu", "gelu_backward", X="float32")


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("family", sorted(COMBINATIONS))
def test_the_source_compiles_with_nvcc(family, tmp_path):
    for roles in COMBINATIONS[family]:
        path = tmp_path / f"{family}.cu"
        path.write_text(cuda_source.prelude(**roles) + SOURCES[family])
        proc = subprocess.run([NVCC, "-c", "-arch=sm_90", "-Werror", "all-warnings", *cuda_source.OPTIONS, "-o",
                               os.devnull, str(path)], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{family} {roles}:\n{proc.stderr}"
