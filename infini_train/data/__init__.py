"""Data: llm.c token shards, the distributed loader, tokenizers and the default corpus."""
from .loader import DistributedDataLoader
from .shards import ShardError, find_shards, read_shard, write_shard
from .tokenizer import ByteTokenizer, get_tokenizer
