"""Mean loss and perplexity of a model (GPT-2, LLaMA-3, Qwen3, Qwen3-MoE, Mixtral: a run's checkpoint or a pretrained
HF directory / llm.c file), no_grad, over token shards (read as training reads them), a text file, or fine-tuning data
(JSONL or .sft shards: the held-out answer loss, the mean over every trained token, as a run's validation computes it).

    python examples/gpt2/evaluate.py --checkpoint runs/gpt2_tiny --data "data/stdlib_byte/val_*.bin"
    python examples/gpt2/evaluate.py --pretrained gpt2_124M.bin --text some.txt --batch-size 4 --seq-len 256
    python examples/gpt2/evaluate.py --checkpoint runs/llama3_lora_sft --data val.jsonl --format chat
"""
from __future__ import annotations

import argparse
import glob
import math
import os
import sys

import numpy as np
from common import DEVICE_FORMS, DTYPES, PRECISIONS, load_model, parse_device, parse_dtype, parse_precision

import infini_train as it
from infini_train.data.inputs import InputError, InputFile, read_documents
from infini_train.data.loader import DistributedDataLoader, ShardTooSmall
from infini_train.data.sft_loader import SFTDataLoader, find_sft_files
from infini_train.data.sft_records import SFT_FORMATS, SFTDataError, check_format, guess_format
from infini_train.data.sft_shards import SFT_SUFFIX, read_sft_shard
from infini_train.data.shards import ShardError
from infini_train.training.evaluation import batch_on_device, token_weighted_mean, trained_tokens


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


def is_sft_data(pattern):
    """Whether ``pattern`` names fine-tuning data (.jsonl files or .sft shards) rather than token shards."""
    return any(p.endswith((".jsonl", SFT_SUFFIX)) for p in glob.glob(os.path.expanduser(pattern)))


def sft_format(pattern, fmt):
    """The format to read ``pattern``'s samples in: ``fmt`` (--format), else the shards' own or the first record's."""
    if fmt is not None:
        return check_format(fmt, "--format")
    paths, kind = find_sft_files(pattern, "--data")
    if kind == "shards":
        return read_sft_shard(paths[0])[1]["format"]
    guessed = guess_format(paths[0])
    if guessed is None:
        raise SystemExit(f"error: --format: the first record of {paths[0]} has none of the fields of the formats "
                         f"{', '.join(SFT_FORMATS)}\nHINT: pass --format chat | instruction | text")
    return guessed


def sft_batches(pattern, tok, fmt, batch_size, seq_len, train_on_prompt=False, max_batches=None):
    """SFTBatches of the samples of ``pattern`` in file order, packed into rows of ``seq_len`` as a run's validation
    packs them, each sample once: the rows of the last batch past the last sample train nothing."""
    loader = SFTDataLoader(pattern, tok, batch_size, seq_len, format=fmt, packing=True,
                           train_on_prompt=train_on_prompt, shuffle=False, config_key="--data")
    rows = loader.rows_in_epoch(0)
    count = -(-rows // batch_size)
    for b in range(count if max_batches is None else min(count, max_batches)):
        batch = loader.next_batch()
        batch.targets[max(rows - b * batch_size, 0):] = -1  # the next pass's rows
        yield batch


@it.no_grad()
def evaluate_batches(model, batches, device, total=None, progress=True):
    """(mean cross-entropy per trained token, number of batches, trained tokens) over (x, y) batches or SFTBatches
    (their packed samples each attending to itself): the training loss function."""
    if progress:
        from tqdm import tqdm
        batches = tqdm(batches, total=total, desc="eval", file=sys.stderr, dynamic_ncols=True)
    vocab = model.config.vocab_size
    losses, tokens = [], []
    for batch in batches:
        x, y = batch[0], batch[1]
        if int(max(x.max(), y.max())) >= vocab:
            raise SystemExit(f"error: the data holds token id {int(max(x.max(), y.max()))}, outside the model's "
                             f"vocabulary ({vocab})\nHINT: the data was made with another tokenizer")
        x, y, context = batch_on_device(batch, device)
        with context():
            _, loss = model(x, y)
        losses.append(loss.item())
        tokens.append(trained_tokens(batch))
    return token_weighted_mean(losses, tokens), len(losses), sum(tokens)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="a run's out_dir (its newest good checkpoint) or a checkpoints/step_XXXXXX "
                                          "directory, whole or sharded; a LoRA run's adapters are merged")
    src.add_argument("--pretrained", help="a Hugging Face directory (config.json + safetensors: GPT-2, LLaMA, Qwen3, "
                                          "Qwen3-MoE, Mixtral) or an llm.c GPT-2 .bin file")
    data = p.add_mutually_exclusive_group(required=True)
    data.add_argument("--data", help="a glob pattern of token shards (.bin; opened only when reached) or of "
                                     "fine-tuning data (.jsonl or .sft shards: the loss over the trained tokens)")
    data.add_argument("--text", help="a text file, tokenized on the fly")
    p.add_argument("--format", choices=SFT_FORMATS, default=None,
                   help="how fine-tuning JSONL records read (default: the shards' own, else the first record's fields)")
    p.add_argument("--train-on-prompt", action="store_true",
                   help="fine-tuning data: count every token, not only the answers (data.train_on_prompt)")
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
        if args.data and is_sft_data(args.data):
            batches = sft_batches(args.data, tok, sft_format(args.data, args.format), args.batch_size, seq_len,
                                  args.train_on_prompt, args.max_batches)
        elif args.data:
            batches = shard_batches(args.data, args.batch_size, seq_len, args.max_batches)
        else:
            batches = text_batches(text_tokens(args.text, tok), args.batch_size, seq_len, args.max_batches)
        with amp():
            loss, n, tokens = evaluate_batches(model, batches, device, total=args.max_batches)
    except ShardTooSmall as exc:
        raise SystemExit(f"error: {exc.path}: {exc.tokens} tokens, fewer than one batch needs ({exc.need})\n"
                         "HINT: lower --batch-size or --seq-len") from None
    except (ShardError, InputError, SFTDataError) as exc:
        raise SystemExit(f"error: {exc}") from None
    print(f"batches {n} | tokens {tokens} | loss {loss:.6f} | perplexity {math.exp(loss):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
