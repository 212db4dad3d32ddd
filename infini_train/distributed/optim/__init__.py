"""Distributed optimizers: ZeroRedundancyOptimizer (ZeRO-1, and ZeRO-2 with DistributedDataParallel)."""
from .zero_redundancy_optimizer import ZeroRedundancyOptimizer

__all__ = ["ZeroRedundancyOptimizer"]
