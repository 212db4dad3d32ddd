"""Data parallelism: DataParallel (one process, many devices) and DistributedDataParallel."""
