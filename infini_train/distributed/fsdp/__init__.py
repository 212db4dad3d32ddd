"""Fully sharded data parallelism (ZeRO-3) with FSDP2's interface: ``fully_shard``, ``FSDPModule``,
``MixedPrecisionPolicy``; hybrid sharding (HSDP) over a ``HybridShardMesh``."""
from .flat_shard import Placeholder, ShardedError, ShardedFlatSpace
from .fully_shard import FSDPModule, fully_shard
from .hybrid_mesh import HybridShardMesh
from .param_group import MixedPrecisionPolicy

__all__ = ["fully_shard", "FSDPModule", "HybridShardMesh", "MixedPrecisionPolicy", "ShardedFlatSpace", "Placeholder",
           "ShardedError"]
