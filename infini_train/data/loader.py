"""DistributedDataLoader, following llm.c's train_gpt2.py: memory-mapped shards; at each step rank r reads
tokens [pos + r*B*T, pos + (r+1)*B*T + 1) so ranks take disjoint slices of one global batch; the position
advances by B*T*world_size, moves to the next shard when the next batch would not fit, and wraps around.
"""
from __future__ import annotations

import numpy as np

from .shards import ShardError, find_shards, read_header, read_shard


class DistributedDataLoader:
    def __init__(self, pattern, B, T, rank=0, world_size=1):
        self.pattern, self.B, self.T = pattern, B, T
        self.rank, self.world_size = rank, world_size
        self.files = find_shards(pattern)
        need = B * T * world_size + 1
        for path in self.files:
            if read_header(path) < need:
                raise ShardError(f"{path}: {read_header(path)} tokens, fewer than one global batch needs "
                                 f"(B*T*world_size + 1 = {need})\nHINT: lower train.batch_size or "
                                 "train.sequence_length, or prepare more data")
        self.reset()

    def reset(self):
        self._load(0)

    def _load(self, shard):
        self.current_shard = shard
        self.tokens = read_shard(self.files[shard])
        self.current_position = self.B * self.T * self.rank

    def next_batch(self):
        """(x, y) int64 arrays of shape (B, T); y is x shifted by one token."""
        B, T = self.B, self.T
        buf = np.asarray(self.tokens[self.current_position:self.current_position + B * T + 1], dtype=np.int64)
        x, y = buf[:-1].reshape(B, T), buf[1:].reshape(B, T)
        self.current_position += B * T * self.world_size
        if self.current_position + B * T * self.world_size + 1 > len(self.tokens):
            self._load((self.current_shard + 1) % len(self.files))
        return x, y

    def state_dict(self):
        """JSON-serialisable position (shard index, token offset of this rank's next batch)."""
        return {"shard": self.current_shard, "position": int(self.current_position)}

    def load_state_dict(self, state):
        self._load(int(state["shard"]))
        self.current_position = int(state["position"])

    def num_tokens(self):
        return sum(read_header(p) for p in self.files)
