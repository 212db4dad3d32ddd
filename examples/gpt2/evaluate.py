"""Mean loss and perplexity of a GPT-2 over a token shard or a text file, under no_grad.

    python examples/gpt2/evaluate.py --checkpoint runs/gpt2_tiny --data "data/stdlib_byte/val_*.bin"
    python examples/gpt2/evaluate.py --pretrained gpt2_124M.bin --text some.txt --batch-size 4 --seq-len 256
"""
from __future__ import annotations

import argparse
import math
import sys

import numpy as np
from common import load_model, to_tensor

import infini_train as it
from infini_train.data.shards import find_shards, read_shard


@it.no_grad()
def evaluate_tokens(model, tokens, batch_size, seq_len, device, max_batches=None, progress=True):
    """Mean cross-entropy over consecutive (B, T) windows of ``tokens`` (the training loss function)."""
    per_batch = batch_size * seq_len
    n_batches = (len(tokens) - 1) // per_batch
    if max_batches:
        n_batches = min(n_batches, max_batches)
    if n_batches == 0:
        raise SystemExit(f"error: {len(tokens)} tokens are fewer than one batch needs ({per_batch + 1})\n"
                         "HINT: lower --batch-size or --seq-len")
    total = 0.0
    batches = range(n_batches)
    if progress:
        from tqdm import tqdm
        batches = tqdm(batches, desc="eval", file=sys.stderr, dynamic_ncols=True)
    for b in batches:
        window = np.asarray(tokens[b * per_batch:(b + 1) * per_batch + 1], dtype=np.int64)
        x, y = window[:-1].reshape(batch_size, seq_len), window[1:].reshape(batch_size, seq_len)
        _, loss = model(to_tensor(x, device), to_tensor(y, device))
        total += loss.item()
    return total / n_batches, n_batches


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint")
    src.add_argument("--pretrained")
    data = p.add_mutually_exclusive_group(required=True)
    data.add_argument("--data", help="token shard(s), a glob pattern")
    data.add_argument("--text", help="a text file, tokenized on the fly")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=None, help="default: the model's block_size")
    p.add_argument("--max-batches", type=int, default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--tokenizer", default=None)
    args = p.parse_args(argv)

    model, tok = load_model(args.checkpoint, args.pretrained, args.device, args.tokenizer)
    seq_len = args.seq_len or model.config.block_size
    if seq_len > model.config.block_size:
        raise SystemExit(f"error: --seq-len {seq_len} exceeds the model's block_size {model.config.block_size}")
    if args.data:
        tokens = np.concatenate([np.asarray(read_shard(path)) for path in find_shards(args.data)])
    else:
        with open(args.text, encoding="utf-8", errors="replace") as f:
            tokens = np.asarray(tok.encode(f.read()), dtype=np.int64)
    if tokens.size and int(tokens.max()) >= model.config.vocab_size:
        raise SystemExit(f"error: the data holds token id {int(tokens.max())}, outside the model's vocabulary "
                         f"({model.config.vocab_size})\nHINT: the data was made with another tokenizer")
    loss, n = evaluate_tokens(model, tokens, args.batch_size, seq_len, args.device, args.max_batches)
    print(f"batches {n} | tokens {n * args.batch_size * seq_len} | loss {loss:.6f} | perplexity {math.exp(loss):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
