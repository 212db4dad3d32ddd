"""The registry of GPU kernels that came after the first fused ones: each compiles
(tests/kernels/test_kernel_sources.py) and has a NumPy reference of its exact arithmetic checked on the CPU
(infini_train/kernels/reference/). A kernel is a candidate until a GPU run has checked it against the array path
(``benchmarks/gpu_session.sh``, phase ``kernels``: its cuda tests and ``benchmarks/check_kernels.py``'s results
table); then it moves to VERIFIED with the lines that verified it, and runs by default like the fused kernels
before it (off with INFINI_TRAIN_FUSED_KERNELS=0).

INFINI_TRAIN_KERNELS selects the kernels that run where they apply: unset or empty, the verified ones; ``candidate``
(or ``all``), every one; ``none``, none of them (the array path); ``name,name``, those named. Names it does not know
are an error when the package is imported.
"""
from __future__ import annotations

import contextlib
import os

from .cuda_source import enabled

ENV = "INFINI_TRAIN_KERNELS"
KERNELS = {  # name -> what it replaces
    "flash_attention": "scaled_dot_product_attention in bf16/fp16: one tensor-core kernel forward, three backward",
    "fused_classifier": "cross_entropy over the vocabulary: the loss and the logits' gradient without probabilities",
    "layer_norm_forward": "layer norm forward (and residual add + layer norm) in one pass, 128-bit loads",
    "gelu_forward": "GELU forward (tanh and exact forms) in one pass, 128-bit loads",
}
_H200 = "NVIDIA H200, cupy 14.2.0 / CUDA 13.0, 2026-11-28, benchmarks/check_kernels.py (of max; time vs the array path)"
VERIFIED = {  # name -> the GPU run and the results-table lines that verified it
    "flash_attention": f"{_H200}: B8 H12 T1024 D64 causal bf16 5.75e-03 0.24x, fp16 7.18e-04 0.16x, dropout 0.1 "
                       "5.03e-03 0.17x; B2 H32/8 T2048 D128 bf16 1.02e-02 0.09x",
    "fused_classifier": f"{_H200}: 8192 x 50304 float32 1.19e-06 0.69x, bfloat16 4.88e-04 0.55x",
    "layer_norm_forward": f"{_H200}: 8192 x 768 bfloat16 1.10e-03 0.61x, float32 2.02e-07 0.41x",
    "gelu_forward": f"{_H200}: 8192 x 3072 tanh bfloat16 / float32 bitwise 0.18x / 0.24x, exact bfloat16 bitwise 0.04x",
}
CANDIDATE = {name: what for name, what in KERNELS.items() if name not in VERIFIED}
_ALL = ("candidate", "all")
_NONE = ("0", "none", "off", "false")


def parse(spec):
    """The kernel names a value of INFINI_TRAIN_KERNELS runs (a frozenset; unset or empty: the verified ones)."""
    spec = (spec or "").strip()
    if not spec:
        return frozenset(VERIFIED)
    if spec.lower() in _NONE:
        return frozenset()
    if spec.lower() in _ALL:
        return frozenset(KERNELS)
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in KERNELS]
    if unknown:
        raise ValueError(f"{ENV}: expected 'candidate', 'none' or a comma-separated list of kernel names from "
                         f"{sorted(KERNELS)}, got {spec!r} (unknown: {', '.join(unknown)})\n"
                         f"HINT: unset {ENV} to run the verified kernels ({', '.join(sorted(VERIFIED)) or 'none yet'}),"
                         f" or set {ENV}=candidate for every kernel")
    return frozenset(names)


_ACTIVE = [parse(os.environ.get(ENV))]


def use(name):
    """Whether kernel ``name`` runs where it applies (with the fused kernels on)."""
    if name not in KERNELS:
        raise KeyError(f"kernel registry: no kernel named {name!r}; known: {sorted(KERNELS)}")
    return enabled() and name in _ACTIVE[0]


def active():
    """The kernel names selected now."""
    return _ACTIVE[0]


def select(spec):
    """Select the kernels that run as INFINI_TRAIN_KERNELS would (``'candidate'``, ``'none'``, ``'a,b'``, ``''``
    for the verified ones, or a frozenset of names); returns the previous selection (a frozenset)."""
    previous = _ACTIVE[0]
    _ACTIVE[0] = frozenset(spec) if isinstance(spec, (set, frozenset)) else parse(spec)
    return previous


@contextlib.contextmanager
def selected(spec="candidate"):
    """``with selected('none'):`` runs its body on the array path; ``with selected():`` with every kernel;
    ``with selected('flash_attention'):`` with that one alone."""
    previous = select(spec)
    try:
        yield
    finally:
        select(previous)


__all__ = ["KERNELS", "CANDIDATE", "VERIFIED", "ENV", "parse", "use", "active", "select", "selected"]
