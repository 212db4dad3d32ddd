"""Data parallelism: DataParallel (one process, many devices) and DistributedDataParallel (one per rank)."""
from .data_parallel import DataParallel, parallel_apply, replicate
from .distributed import DistributedDataParallel, Reducer
from .mappings import (
    copy_to_tensor_parallel_region,
    gather_from_sequence_parallel_region,
    gather_from_tensor_parallel_region,
    reduce_from_tensor_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
    scatter_to_sequence_parallel_region,
    scatter_to_tensor_parallel_region,
)
from .tensor_parallel import (
    ColumnParallelLinear,
    ParallelParameter,
    RowParallelLinear,
    ShardSpec,
    all_reduce_sequence_parallel_grads,
    full_from_shards,
    mark_sequence_parallel,
    shard_from_full,
)
from .vocab_parallel import VocabParallelEmbedding, vocab_parallel_cross_entropy
