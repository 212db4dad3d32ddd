"""The registry of candidate kernels: off by default, on with INFINI_TRAIN_KERNELS=candidate (or by name), verified
kernels on with the fused kernels, unknown names a clear error (also when the package is imported)."""
import os
import subprocess
import sys

import pytest

from infini_train import kernels
from infini_train.kernels import registry


def test_candidates_are_off_by_default():
    assert registry.parse(None) == frozenset() and registry.parse("") == frozenset()
    if not os.environ.get(registry.ENV):
        assert registry.active() == frozenset()
        assert not any(registry.use(name) for name in registry.CANDIDATE)


def test_candidate_turns_every_candidate_on_and_names_turn_those_on():
    assert registry.parse("candidate") == frozenset(registry.CANDIDATE)
    assert registry.parse(" flash_attention , gelu_forward ") == {"flash_attention", "gelu_forward"}
    with registry.candidates():
        assert all(registry.use(name) for name in registry.CANDIDATE)
    with registry.candidates("fused_classifier"):
        assert registry.use("fused_classifier") and not registry.use("flash_attention")


def test_the_fused_kernel_switch_turns_candidates_off_too():
    previous = kernels.set_enabled(False)
    try:
        with registry.candidates():
            assert not any(registry.use(name) for name in registry.CANDIDATE)
    finally:
        kernels.set_enabled(previous)


def test_verified_kernels_run_without_the_candidate_switch(monkeypatch):
    monkeypatch.setitem(registry.VERIFIED, "checked_kernel", "H200, the results table")
    with registry.candidates(""):
        assert registry.use("checked_kernel")
        assert registry.parse("checked_kernel") == {"checked_kernel"}


def test_an_unknown_name_is_a_clear_error():
    with pytest.raises(ValueError, match=r"INFINI_TRAIN_KERNELS: expected 'candidate' or a comma-separated list .*"
                                         r"unknown: flash_attn, bogus\)\nHINT: unset INFINI_TRAIN_KERNELS"):
        registry.parse("flash_attn,gelu_forward,bogus")
    with pytest.raises(KeyError, match="no kernel named 'nope'"):
        registry.use("nope")


def test_a_bad_value_fails_the_import_naming_it():
    env = dict(os.environ, INFINI_TRAIN_KERNELS="flash_atention")
    proc = subprocess.run([sys.executable, "-c", "import infini_train"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0 and "unknown: flash_atention" in proc.stderr and "HINT" in proc.stderr


def test_every_candidate_has_a_compiled_family_a_reference_and_a_gpu_check():
    import pathlib

    from infini_train.kernels import SOURCES, reference
    from tests.kernels import test_kernel_sources

    families = {"flash_attention": "flash_attention", "fused_classifier": "classifier",
                "layer_norm_forward": "norm_forward", "gelu_forward": "gelu_forward"}
    assert sorted(families) == sorted(registry.CANDIDATE) == sorted(reference.FOR_KERNEL)
    assert set(families.values()) <= set(SOURCES) and set(families.values()) <= set(test_kernel_sources.COMBINATIONS)
    cuda_tests = "".join(p.read_text() for p in pathlib.Path(__file__).parent.glob("test_*_cuda.py"))
    assert all(f'"{name}"' in cuda_tests for name in registry.CANDIDATE)
    assert set(registry.CANDIDATE).isdisjoint(registry.VERIFIED)
