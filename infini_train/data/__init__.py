"""Data: llm.c token shards, the distributed loader, tokenizers and the default corpus; SFT samples (JSONL or SFT
shards) and their loader.

    from infini_train.data import DistributedDataLoader, get_tokenizer, ensure_default_data, read_meta
    from infini_train.data import SFTDataLoader, SFTBatch, SFTDataError
"""
from .corpus import ensure_default_data, prepare_shards, read_meta, stdlib_documents
from .loader import DistributedDataLoader, ShardTooSmall
from .sft_loader import SFTBatch, SFTDataLoader
from .sft_records import SFTDataError
from .shards import ShardError, find_shards, read_shard, write_shard
from .tokenizer import ByteTokenizer, GPT2Tokenizer, get_tokenizer, gpt2_available

__all__ = ["DistributedDataLoader", "ShardTooSmall", "ShardError", "find_shards", "read_shard", "write_shard",
           "ByteTokenizer", "GPT2Tokenizer", "get_tokenizer", "gpt2_available", "ensure_default_data", "prepare_shards",
           "read_meta", "stdlib_documents", "SFTBatch", "SFTDataLoader", "SFTDataError"]
