"""Candidate kernels: fused GPU kernels that compile (tests/kernels/test_kernel_sources.py) and whose NumPy
reference of their exact arithmetic is checked on the CPU (infini_train/kernels/reference/), but that no GPU run has
yet checked against the array path. They stay off until one has: ``benchmarks/gpu_session.sh`` (phase ``kernels``)
runs each against the array path and writes the results table; a kernel that passed moves from CANDIDATE to
VERIFIED here, and from then on runs like the fused kernels already in use (off only with
INFINI_TRAIN_FUSED_KERNELS=0).

INFINI_TRAIN_KERNELS selects the candidates that run: unset or empty, none of them; ``candidate``, all of them;
``name,name``, those named. Names it does not know are an error when the package is imported.
"""
from __future__ import annotations

import contextlib
import os

from .cuda_source import enabled

ENV = "INFINI_TRAIN_KERNELS"
CANDIDATE = {  # name -> what it replaces
    "flash_attention": "scaled_dot_product_attention in bf16/fp16: one tensor-core kernel forward, three backward",
    "fused_classifier": "cross_entropy over the vocabulary: the loss and the logits' gradient without probabilities",
    "layer_norm_forward": "layer norm forward (and residual add + layer norm) in one pass, 128-bit loads",
    "gelu_forward": "GELU forward (tanh and exact forms) in one pass, 128-bit loads",
}
VERIFIED = {}  # name -> the GPU, date and results-table line that verified it
_ALL = "candidate"


def parse(spec):
    """The candidate names a value of INFINI_TRAIN_KERNELS turns on (a frozenset)."""
    spec = (spec or "").strip()
    if spec.lower() in ("", "0", "none", "off", "false"):
        return frozenset()
    if spec.lower() == _ALL:
        return frozenset(CANDIDATE)
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in CANDIDATE and n not in VERIFIED]
    if unknown:
        raise ValueError(f"{ENV}: expected '{_ALL}' or a comma-separated list of kernel names from "
                         f"{sorted(CANDIDATE) + sorted(VERIFIED)}, got {spec!r} (unknown: {', '.join(unknown)})\n"
                         f"HINT: unset {ENV} to run the verified kernels only, or set {ENV}={_ALL} for every "
                         f"candidate")
    return frozenset(names)


_ACTIVE = [parse(os.environ.get(ENV))]


def use(name):
    """Whether kernel ``name`` runs where it applies: verified ones always (with the fused kernels on), candidates
    when INFINI_TRAIN_KERNELS (or ``set_candidates``) names them."""
    if name not in CANDIDATE and name not in VERIFIED:
        raise KeyError(f"kernel registry: no kernel named {name!r}; known: {sorted(CANDIDATE) + sorted(VERIFIED)}")
    return enabled() and (name in VERIFIED or name in _ACTIVE[0])


def active():
    """The candidate names turned on now."""
    return _ACTIVE[0]


def set_candidates(spec):
    """Turn candidates on as INFINI_TRAIN_KERNELS would (``'candidate'``, ``'a,b'``, ``''``); returns the previous
    selection (a frozenset, which this also takes)."""
    previous = _ACTIVE[0]
    _ACTIVE[0] = frozenset(spec) if isinstance(spec, (set, frozenset)) else parse(spec)
    return previous


@contextlib.contextmanager
def candidates(spec=_ALL):
    """``with candidates():`` runs its body with the candidate kernels on (or those ``spec`` names)."""
    previous = set_candidates(spec)
    try:
        yield
    finally:
        set_candidates(previous)


__all__ = ["CANDIDATE", "VERIFIED", "ENV", "parse", "use", "active", "set_candidates", "candidates"]
