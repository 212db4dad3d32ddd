"""The kernel registry: verified kernels run by default, candidates with INFINI_TRAIN_KERNELS=candidate (or by name),
``none`` is the array path, the fused-kernel switch turns every one off, unknown names are a clear error (also when
the package is imported)."""
import os
import subprocess
import sys

import pytest

from infini_train import kernels
from infini_train.kernels import registry


def test_the_verified_kernels_run_by_default_and_candidates_do_not():
    assert registry.parse(None) == registry.parse("") == frozenset(registry.VERIFIED)
    assert set(registry.KERNELS) == set(registry.CANDIDATE) | set(registry.VERIFIED)
    assert set(registry.CANDIDATE).isdisjoint(registry.VERIFIED)
    if not os.environ.get(registry.ENV):
        assert registry.active() == frozenset(registry.VERIFIED)
        running = {name for name in registry.KERNELS if registry.use(name)}
        assert running == (set(registry.VERIFIED) if kernels.enabled() else set())


def test_candidate_turns_every_kernel_on_names_turn_those_on_and_none_turns_them_off():
    assert registry.parse("candidate") == registry.parse("all") == frozenset(registry.KERNELS)
    assert registry.parse(" flash_attention , gelu_forward ") == {"flash_attention", "gelu_forward"}
    assert registry.parse("none") == registry.parse("0") == frozenset()
    with registry.selected():
        assert all(registry.use(name) for name in registry.KERNELS)
    with registry.selected("fused_classifier"):
        assert registry.use("fused_classifier") and not registry.use("flash_attention")
    with registry.selected("none"):
        assert not any(registry.use(name) for name in registry.KERNELS)
    assert registry.active() == registry.parse(os.environ.get(registry.ENV))


def test_the_fused_kernel_switch_turns_every_kernel_off():
    previous = kernels.set_enabled(False)
    try:
        with registry.selected():
            assert not any(registry.use(name) for name in registry.KERNELS)
    finally:
        kernels.set_enabled(previous)


def test_a_verified_kernel_names_the_run_that_verified_it():
    for name, line in registry.VERIFIED.items():
        assert "benchmarks/check_kernels.py" in line and "20" in line, (name, line)


def test_an_unknown_name_is_a_clear_error():
    with pytest.raises(ValueError, match=r"INFINI_TRAIN_KERNELS: expected 'candidate', 'none' or a comma-separated "
                                         r"list .*unknown: flash_attn, bogus\)\nHINT: unset INFINI_TRAIN_KERNELS"):
        registry.parse("flash_attn,gelu_forward,bogus")
    with pytest.raises(KeyError, match="no kernel named 'nope'"):
        registry.use("nope")


def test_a_bad_value_fails_the_import_naming_it():
    env = dict(os.environ, INFINI_TRAIN_KERNELS="flash_atention")
    proc = subprocess.run([sys.executable, "-c", "import infini_train"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0 and "unknown: flash_atention" in proc.stderr and "HINT" in proc.stderr


def test_every_kernel_has_a_compiled_family_a_reference_and_a_gpu_check():
    import pathlib

    from infini_train.kernels import SOURCES, reference
    from tests.kernels import test_kernel_sources

    families = {"flash_attention": "flash_attention", "fused_classifier": "classifier",
                "layer_norm_forward": "norm_forward", "gelu_forward": "gelu_forward"}
    assert sorted(families) == sorted(registry.KERNELS) == sorted(reference.FOR_KERNEL)
    assert set(families.values()) <= set(SOURCES) and set(families.values()) <= set(test_kernel_sources.COMBINATIONS)
    cuda_tests = "".join(p.read_text() for p in pathlib.Path(__file__).parent.glob("test_*_cuda.py"))
    assert all(f'"{name}"' in cuda_tests for name in registry.KERNELS)
