"""DistributedDataLoader, following llm.c's train_gpt2.py.

Shards are memory-mapped. A *global batch* is ``B * T * world_size`` consecutive tokens of the current
shard starting at ``position``; rank r reads its own disjoint slice ``[position + r*B*T, position +
(r+1)*B*T + 1)`` (one extra token for the shifted targets). After each batch the position advances by one
global batch; when the next global batch would not fit, the loader moves to the start of the next shard,
and after the last shard it wraps around to the first. So ``world_size`` ranks with batch B together read
exactly what one rank with batch ``B * world_size`` reads, in the same order.

    loader = DistributedDataLoader("data/stdlib_byte/train_*.bin", B=16, T=64, rank=rank, world_size=world,
                                   config_key="data.train")   # errors name the setting that gave the pattern
    x, y = loader.next_batch()          # int64 numpy arrays of shape (B, T); y is x shifted by one token
    state = loader.state_dict()         # {"shard": 0, "position": 2048}, JSON-serialisable
    loader.load_state_dict(state)       # continue at exactly the same place (e.g. after a resume)
    loader.reset()                      # back to the first batch (validation passes, overfit_single_batch)
"""
from __future__ import annotations

import numpy as np

from .shards import ShardError, find_shards, read_header, read_shard


_NAME = "DistributedDataLoader"


def check_int(owner, name, value, low):
    """``value`` as an int >= ``low``; else a ValueError naming ``owner`` (the loader) and the argument."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
        raise ValueError(f"{owner}: expected {name} to be an integer >= {low}, got {value!r}")
    return int(value)


def check_rank(owner, rank, world_size):
    """(rank, world_size) of a loader's reader, checked: world_size >= 1 and rank in [0, world_size)."""
    world_size = check_int(owner, "world_size", world_size, 1)
    checked = check_int(owner, "rank", rank, 0)
    if checked >= world_size:
        raise ValueError(f"{owner}: expected rank in [0, {world_size}), got {rank}")
    return checked, world_size


class ShardTooSmall(ShardError):
    """A shard holding fewer tokens than one global batch needs; ``path``, ``tokens`` and ``need`` say which."""

    def __init__(self, message, path, tokens, need):
        super().__init__(message)
        self.path, self.tokens, self.need = path, tokens, need


class DistributedDataLoader:
    """Batches of (B, T) token windows from llm.c shards; rank ``rank`` of ``world_size`` reads its own slice.

    ``config_key`` names the setting the pattern came from ("data.train", "data.val") in errors. Every shard's
    header is checked up front, so a run fails before its first step rather than when it reaches a bad shard;
    ``lazy=True`` skips that and opens each shard only when a batch is read from it (evaluating a few batches
    of many shards). Either way a shard is mapped only while it is the current one.
    """

    def __init__(self, pattern, B, T, rank=0, world_size=1, *, lazy=False, config_key=None):
        self.pattern = pattern
        self.B, self.T = check_int(_NAME, "B", B, 1), check_int(_NAME, "T", T, 1)
        self.rank, self.world_size = check_rank(_NAME, rank, world_size)
        self.files = find_shards(pattern, config_key)
        if not lazy:
            for path in self.files:
                self._check_size(path, read_header(path))
        self.current_shard = None
        self.tokens = None  # the current shard's memory map, opened by _current_tokens()
        self.reset()

    def _check_size(self, path, size):
        need = self.global_batch_tokens + 1
        if size < need:
            raise ShardTooSmall(f"{path}: {size} tokens, fewer than one global batch needs (B*T*world_size + 1 = "
                                f"{self.B}*{self.T}*{self.world_size} + 1 = {need})\nHINT: lower "
                                "train.batch_size or train.sequence_length, or prepare more data (or fewer, "
                                "larger shards)", path, size, need)

    @property
    def global_batch_tokens(self):
        """Tokens all ranks consume per next_batch() call together: B * T * world_size."""
        return self.B * self.T * self.world_size

    @property
    def current_position(self):
        """Offset of this rank's next batch in the current shard (llm.c's ``current_position``)."""
        return self.position + self.rank * self.B * self.T

    def _set_shard(self, index):
        if index != self.current_shard:
            self.tokens = None
            self.current_shard = index
        self.position = 0

    def _current_tokens(self):
        if self.tokens is None:
            path = self.files[self.current_shard]
            tokens = read_shard(path)
            self._check_size(path, len(tokens))
            self.tokens = tokens
        return self.tokens

    def reset(self):
        """Go back to the first batch of the first shard."""
        self._set_shard(0)

    def _advance_if_needed(self):
        if self.position + self.global_batch_tokens + 1 > len(self._current_tokens()):
            self._set_shard((self.current_shard + 1) % len(self.files))

    def next_batch(self):
        """(x, y): int64 numpy arrays of shape (B, T); y[b, t] is the token after x[b, t]."""
        B, T = self.B, self.T
        start = self.current_position
        buf = np.asarray(self._current_tokens()[start:start + B * T + 1], dtype=np.int64)
        x = buf[:-1].reshape(B, T)
        y = buf[1:].reshape(B, T).copy()  # x and y share no memory
        self.position += self.global_batch_tokens
        self._advance_if_needed()
        return x, y

    def state_dict(self):
        """Where the next global batch starts: {"shard": index into self.files, "position": token offset}.

        The same on every rank (the rank's own offset is added when reading), JSON-serialisable."""
        return {"shard": int(self.current_shard), "position": int(self.position)}

    def load_state_dict(self, state):
        """Continue from a state_dict(): the following batches equal those the saving loader would have read."""
        try:
            shard, position = int(state["shard"]), int(state["position"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"DistributedDataLoader.load_state_dict: expected {{'shard': int, 'position': int}}, "
                             f"got {state!r}") from None
        if not 0 <= shard < len(self.files):
            raise ValueError(f"DistributedDataLoader.load_state_dict: shard {shard} is out of range: "
                             f"{len(self.files)} shards match {self.pattern!r}\nHINT: the run was saved with "
                             "other data; point data.train at the same shards")
        self._set_shard(shard)
        size = len(self._current_tokens())
        if not 0 <= position < size:
            raise ValueError(f"DistributedDataLoader.load_state_dict: position {position} is outside shard "
                             f"{self.files[shard]} ({size} tokens)\nHINT: the run was saved with "
                             "other data; point data.train at the same shards")
        self.position = position
        self._advance_if_needed()  # only when the global batch changed since the save (other B, T or ranks)

    def num_tokens(self):
        """Total tokens over all shards (reads every shard's header)."""
        return int(sum(read_header(path) for path in self.files))

    def __repr__(self):
        return (f"DistributedDataLoader({self.pattern!r}, B={self.B}, T={self.T}, rank={self.rank}, "
                f"world_size={self.world_size}, shards={len(self.files)})")
