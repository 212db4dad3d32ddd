"""Fused CUDA kernels behind the same Ops: the backward of GELU and of layer norm, attention's row softmax and its
backward, and the Adam/AdamW update, each one pass where the array formulation makes many. The Ops call them for
cupy arrays of the dtypes a kernel takes (float32, bfloat16, float16) and keep their array code everywhere else
(the host, float64, cases a kernel does not cover), which is also what the kernels are checked against
(tests/kernels).

The sources are self-contained CUDA C (no headers: bfloat16 and float16 are converted bit by bit or with PTX), so
``nvcc`` compiles each one where there is no GPU (tests/kernels/test_kernel_sources.py). Set
INFINI_TRAIN_FUSED_KERNELS=0 to run the array code on GPUs too.

The kernels added after those are in the registry (registry.py), each with a NumPy reference of its arithmetic
(reference/): candidates until a GPU run has checked them, then verified and on by default.
"""
from . import registry
from .cuda_source import SOURCES, enabled, set_enabled

__all__ = ["SOURCES", "enabled", "set_enabled", "registry"]
