"""Data parallelism: DataParallel (one process, many devices) and DistributedDataParallel (one per rank)."""
from .data_parallel import DataParallel, parallel_apply, replicate
from .distributed import DistributedDataParallel, Reducer
