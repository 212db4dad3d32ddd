"""Parallel modules: DataParallel (one process, many devices), DistributedDataParallel (one per rank), tensor
(+ sequence) parallelism: the conjugate communication mappings, column/row-parallel linears, the vocab-parallel
embedding and cross-entropy, LoRA wrappers of the parallel linears (registered with nn.lora), clipping by the whole
model's norm, and whole state dicts for checkpoints; context parallelism: ring, Ulysses (all-to-all) and hybrid
attention over a sequence split across ranks; expert parallelism: the token exchange (all_to_all) and
expert_parallel(moe, group)."""
from .all_to_all import all_to_all
from .context_parallel import context_parallel, local_chunks, local_positions
from .data_parallel import DataParallel, parallel_apply, replicate
from .ring_attention import ring_attention
from .ulysses import ulysses_attention
from .distributed import DistributedDataParallel, Reducer
from .grad_norm import clip_grad_norm_model_parallel_
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
    all_reduce_grads,
    all_reduce_sequence_parallel_grads,
    whole_from_shards,
    mark_sequence_parallel,
    shard_from_whole,
)
from .tensor_parallel_lora import ColumnParallelLoRALinear, RowParallelLoRALinear  # registers them with nn.lora
from .vocab_parallel import VocabParallelEmbedding, vocab_parallel_cross_entropy
from .whole_state import load_whole_state_dict, shard_state_dict, whole_state_dict
from .expert_parallel import (
    all_reduce_expert_grads,
    expert_parallel,
    expert_parameters,
    shard_expert_state_dict,
    whole_expert_state_dict,
)
