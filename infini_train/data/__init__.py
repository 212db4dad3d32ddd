"""Data: llm.c token shards, the distributed loader, tokenizers and the default corpus.

    from infini_train.data import DistributedDataLoader, get_tokenizer, ensure_default_data, read_meta
"""
from .corpus import ensure_default_data, prepare_shards, read_meta, stdlib_documents
from .loader import DistributedDataLoader, ShardTooSmall
from .shards import ShardError, find_shards, read_shard, write_shard
from .tokenizer import ByteTokenizer, GPT2Tokenizer, get_tokenizer, gpt2_available

__all__ = ["DistributedDataLoader", "ShardTooSmall", "ShardError", "find_shards", "read_shard", "write_shard",
           "ByteTokenizer", "GPT2Tokenizer", "get_tokenizer", "gpt2_available", "ensure_default_data", "prepare_shards",
           "read_meta", "stdlib_documents"]
