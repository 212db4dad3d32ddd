"""Mean loss and perplexity of a GPT-2 or LLaMA-3 over token shards (read as training reads them) or a text file,
no_grad.

    python examples/gpt2/evaluate.py --checkpoint runs/gpt2_tiny --data "data/stdlib_byte/val_*.bin"
    python examples/gpt2/evaluate.py --pretrained gpt2_124M.bin --text some.txt --batch-size 4 --seq-len 256
"""
from __future__ import annotations

import argparse
import math
import sys

import numpy as np
from common import (DEVICE_FORMS, DTYPES, PRECISIONS, load_model, parse_device, parse_dtype, parse_precision,
                    to_tensor)

import infini_train as it
from infini_train.data.inputs import InputError, InputFile, read_documents
from infini_train.data.loader import DistributedDataLoader, ShardTooSmall
from infini_train.data.shards import ShardError


def shard_batches(pattern, batch_size, seq_len, max_batches=None):
    """(x, y) batches of the shards of ``pattern`` in the order training reads them, each shard once. A shard
    is opened only when its first batch is read, so a few batches of many shards open only the first."""
    loader = DistributedDataLoader(pattern, batch_size, seq_len, lazy=True, config_key="--data")

    def batches():
        n = 0
        while max_batches is None or n < max_batches:
            yield loader.next_batch()
            n += 1
            if loader.state_dict() == {"shard": 0, "position": 0}:
                return  # wrapped around: every shard has been read
    return batches()


def text_batches(tokens, batch_size, seq_len, max_batches=None):
    """(x, y) batches of consecutive windows of ``tokens``."""
    per_batch = batch_size * seq_len
    n_batches = (len(tokens) - 1) // per_batch
    if max_batches is not None:
        n_batches = min(n_batches, max_batches)
    if n_batches <= 0:
        raise SystemExit(f"error: {len(tokens)} tokens are fewer than one batch needs ({per_batch + 1})\n"
                         "HINT: lower --batch-size or --seq-len")
    for b in range(n_batches):
        window = np.asarray(tokens[b * per_batch:(b + 1) * per_batch + 1], dtype=np.int64)
        yield window[:-1].reshape(batch_size, seq_len), window[1:].reshape(batch_size, seq_len)


def text_tokens(path, tok):
    """The tokens of a text file: its exact bytes with the byte tokenizer, strict UTF-8 text otherwise."""
    docs, _ = read_documents([InputFile(path, named=True)], tok)
    return np.concatenate([np.asarray(tok.encode(doc), dtype=np.int64) for doc in docs] or [np.zeros(0, np.int64)])


@it.no_grad()
def evaluate_batches(model, batches, device, total=None, progress=True):
    """(mean cross-entropy, number of batches) over (x, y) batches: the training loss function."""
    if progress:
        from tqdm import tqdm
        batches = tqdm(batches, total=total, desc="eval", file=sys.stderr, dynamic_ncols=True)
    vocab = model.config.vocab_size
    losses = []
    for x, y in batches:
        if int(max(x.max(), y.max())) >= vocab:
            raise SystemExit(f"error: the data holds token id {int(max(x.max(), y.max()))}, outside the model's "
                             f"vocabulary ({vocab})\nHINT: the data was made with another tokenizer")
        _, loss = model(to_tensor(x, device), to_tensor(y, device))
        losses.append(loss.item())
    return sum(losses) / len(losses), len(losses)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint")
    src.add_argument("--pretrained")
    data = p.add_mutually_exclusive_group(required=True)
    data.add_argument("--data", help="token shard(s), a glob pattern; shards are opened only when reached")
    data.add_argument("--text", help="a text file, tokenized on the fly")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=None, help="default: the model's block_size")
    p.add_argument("--max-batches", type=int, default=None, help="default: every full batch of the data")
    p.add_argument("--device", default="cpu", help=f"{DEVICE_FORMS} (default cpu)")
    p.add_argument("--dtype", default="float32", help=f"{' or '.join(DTYPES)} (default float32)")
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--precision", default="fp32", help=f"{' | '.join(PRECISIONS)}: the forward under autocast")
    args = p.parse_args(argv)
    device, dtype = parse_device(args.device), parse_dtype(args.dtype)  # before the (slow) model load
    amp = parse_precision(args.precision, device)
    for name in ("batch_size", "seq_len", "max_batches"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise SystemExit(f"error: --{name.replace('_', '-')}: expected an integer >= 1, got {value}")

    model, tok = load_model(args.checkpoint, args.pretrained, device, args.tokenizer, dtype)
    seq_len = args.seq_len or model.config.context_length
    if seq_len > model.config.context_length:
        raise SystemExit(f"error: --seq-len {seq_len} exceeds the model's block_size {model.config.context_length}")
    try:
        if args.data:
            batches = shard_batches(args.data, args.batch_size, seq_len, args.max_batches)
        else:
            batches = text_batches(text_tokens(args.text, tok), args.batch_size, seq_len, args.max_batches)
        with amp():
            loss, n = evaluate_batches(model, batches, device, total=args.max_batches)
    except ShardTooSmall as exc:
        raise SystemExit(f"error: {exc.path}: {exc.tokens} tokens, fewer than one batch needs ({exc.need})\n"
                         "HINT: lower --batch-size or --seq-len") from None
    except (ShardError, InputError) as exc:
        raise SystemExit(f"error: {exc}") from None
    print(f"batches {n} | tokens {n * args.batch_size * seq_len} | loss {loss:.6f} | perplexity {math.exp(loss):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
