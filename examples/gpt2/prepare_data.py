"""Text files -> llm.c token shards (val/train_NNNNNN.bin), or JSONL samples -> SFT shards (.sft), plus meta.json.

    python examples/gpt2/prepare_data.py                                # the default corpus (Python's stdlib)
    python examples/gpt2/prepare_data.py book.txt "notes/**/*.md" --out-dir data/mine --tokenizer gpt2
    python examples/gpt2/prepare_data.py input.txt --split-on $'\\n\\n' --val-tokens 32768   # tinyshakespeare-style
    python examples/gpt2/prepare_data.py --format chat chat.jsonl --out-dir data/chat --val-fraction 0.05

Each input file is one document (or several, cut at --split-on); every document is preceded by the
end-of-text token and the first tokens form the validation split, as in llm.c's dev/data scripts.
The byte tokenizer keeps the inputs' exact bytes, whatever their encoding; gpt2 needs UTF-8. Binary files (a NUL
byte in the first 8000 bytes) found in a directory or by a glob are skipped with a warning; name one on its
own to take its bytes with the byte tokenizer.
Then train with:  train.py data.train=DIR/train_*.bin data.val=DIR/val_*.bin data.source=null

SFT formats (see infini_train/data/sft_records.py): each line of the JSONL files is one sample; the samples are
tokenized with the tokenizer's chat template (the byte and gpt2 tokenizers: a built-in ChatML rendering) and the
assistant turns marked for the loss. --val-fraction / --val-samples pick validation samples at random
(--split-seed). Then train with data.format=FORMAT data.train=DIR/train_*.sft data.val=DIR/val_*.sft.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from infini_train.data.corpus import (  # noqa: E402
    DEFAULT_MAX_BYTES,
    DEFAULT_SHARD_TOKENS,
    DEFAULT_VAL_FRACTION,
    build_default_corpus,
    prepare_shards,
    stdlib_files,
)
from infini_train.data.inputs import expand_inputs, read_documents  # noqa: E402
from infini_train.data.sft_prepare import DEFAULT_SFT_SHARD_TOKENS, prepare_sft_shards  # noqa: E402
from infini_train.data.sft_records import SFT_FORMATS  # noqa: E402
from infini_train.data.tokenizer import get_tokenizer  # noqa: E402


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def no_text_error(inputs, stats):
    skipped = f" ({len(stats.skipped)} binary file(s) skipped)" if stats.skipped else ""
    return (f"error: the inputs hold no text: {', '.join(map(repr, inputs))}{skipped}\nHINT: give non-empty "
            "files; binary files found in directories or by globs are skipped, name one on its own to take its "
            "bytes with --tokenizer byte")


def read_inputs(args, tok):
    """(documents, stats, out_dir) of the inputs named on the command line; SystemExit when they hold no text."""
    files = expand_inputs(args.inputs)
    documents, stats = read_documents(files, tok, args.max_bytes, args.split_on,
                                      warn=lambda line: print(line, file=sys.stderr))
    if not documents:
        raise SystemExit(no_text_error(args.inputs, stats))
    first = os.path.splitext(os.path.basename(files[0].path))[0] or "text"
    return documents, stats, args.out_dir or os.path.join("data", f"{first}_{tok.name}")


def prepare_sft(args, tok):
    """--format chat | instruction | text: the JSONL inputs as SFT shards; returns the exit status."""
    refused = [flag for flag, value in (("--val-tokens", args.val_tokens), ("--split-on", args.split_on),
                                        ("--max-bytes", args.max_bytes)) if value is not None]
    if refused:
        raise SystemExit(f"error: {refused[0]} is for --format tokens, got it with --format {args.format}\nHINT: "
                         "SFT data is split by samples: use --val-fraction or --val-samples")
    if not args.inputs:
        raise SystemExit(f"error: --format {args.format} needs JSONL files, got none\nHINT: "
                         f"examples/gpt2/prepare_data.py --format {args.format} data.jsonl --out-dir data/mine")
    files = [f.path for f in expand_inputs(args.inputs)]
    first = os.path.splitext(os.path.basename(files[0]))[0] or "sft"
    out_dir = args.out_dir or os.path.join("data", f"{first}_{re.sub(r'[^A-Za-z0-9_.-]+', '_', tok.name)}")
    fraction = DEFAULT_VAL_FRACTION if args.val_fraction is None else args.val_fraction
    t0 = time.perf_counter()
    meta = prepare_sft_shards(files, out_dir, tok, args.format, val_fraction=fraction, val_samples=args.val_samples,
                              shard_tokens=args.shard_tokens or DEFAULT_SFT_SHARD_TOKENS, split_seed=args.split_seed,
                              extra_meta={"source": "files", "inputs": args.inputs})
    print(f"{len(files)} files, {meta['num_samples']:,} {args.format} samples -> {meta['num_tokens']:,} {tok.name} "
          f"tokens, {meta['trained_tokens']:,} trained ({meta['train_samples']:,} samples in {meta['train_shards']} "
          f"train shard(s), {meta['val_samples']:,} in {meta['val_shards']} val) in {out_dir}/ "
          f"({time.perf_counter() - t0:.2f} s)")
    val = f" data.val={os.path.join(out_dir, 'val_*.sft')}" if meta["val_shards"] else " data.val=null"
    print(f"train with: examples/gpt2/train.py data.format={args.format} data.train="
          f"{os.path.join(out_dir, 'train_*.sft')}{val} data.tokenizer={tok.name} data.source=null")
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="*", help="text files, globs or directories (default: Python's stdlib sources)")
    p.add_argument("--out-dir", default=None,
                   help="where the shards go (default data/stdlib_<tokenizer>, or data/<first input>_<tokenizer>)")
    p.add_argument("--tokenizer", default="byte", help="a name get_tokenizer takes (default byte, needs nothing)")
    p.add_argument("--format", default="tokens", choices=("tokens",) + SFT_FORMATS,
                   help="tokens: text files -> token shards (default); chat | instruction | text: JSONL -> SFT shards")
    split = p.add_mutually_exclusive_group()
    split.add_argument("--val-fraction", type=float, default=None,
                       help=f"fraction of the tokens (SFT: of the samples) for validation (default "
                            f"{DEFAULT_VAL_FRACTION})")
    split.add_argument("--val-tokens", type=int, default=None, help="the first N tokens for validation instead")
    split.add_argument("--val-samples", type=int, default=None, help="SFT: N samples for validation instead")
    p.add_argument("--split-seed", type=int, default=0, help="SFT: seed of the validation samples' draw (default 0)")
    p.add_argument("--shard-tokens", type=int, default=DEFAULT_SHARD_TOKENS,
                   help=f"tokens per shard at most (default {DEFAULT_SHARD_TOKENS:,}, as llm.c's fineweb)")
    p.add_argument("--max-bytes", type=positive_int, default=None,
                   help="read no more than this many bytes of the inputs (default: all). The default corpus "
                        f"takes whole stdlib files until the sizes reach it (default {DEFAULT_MAX_BYTES:,})")
    p.add_argument("--split-on", default=None, help="also cut each file into documents at this separator")
    args = p.parse_args(argv)

    try:
        tok = get_tokenizer(args.tokenizer)
    except (RuntimeError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None
    if args.format != "tokens":
        try:
            return prepare_sft(args, tok)
        except ValueError as exc:
            raise SystemExit(f"error: {exc}") from None
    if args.val_samples is not None:
        raise SystemExit("error: --val-samples is for the SFT formats, got it with --format tokens\nHINT: use "
                         "--val-tokens or --val-fraction")
    split_args = dict(val_fraction=DEFAULT_VAL_FRACTION if args.val_fraction is None else args.val_fraction,
                      val_tokens=args.val_tokens, shard_tokens=args.shard_tokens)
    t0 = time.perf_counter()
    try:
        if args.inputs:
            documents, stats, out_dir = read_inputs(args, tok)
            n_files, total = stats.files, stats.bytes
            if stats.stopped_at_limit:
                print(f"stopped reading at --max-bytes {args.max_bytes:,}", file=sys.stderr)
            meta = prepare_shards(documents, out_dir, tok, **split_args,
                                  extra_meta={"source": "files", "inputs": args.inputs})
        else:
            max_bytes = args.max_bytes or DEFAULT_MAX_BYTES
            files = stdlib_files(max_bytes)
            n_files, total = len(files), sum(os.path.getsize(path) for path in files)
            out_dir = args.out_dir or os.path.join("data", f"stdlib_{tok.name}")
            meta = build_default_corpus(out_dir, tok, max_bytes, **split_args)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    dt = time.perf_counter() - t0
    print(f"{n_files} files, {meta['documents']} documents, {total:,} bytes -> {meta['num_tokens']:,} {tok.name} "
          f"tokens ({meta['train_tokens']:,} train in {meta['train_shards']} shard(s), {meta['val_tokens']:,} val "
          f"in {meta['val_shards']}) in {out_dir}/ ({dt:.2f} s)")
    val = f" data.val={os.path.join(out_dir, 'val_*.bin')}" if meta["val_shards"] else " data.val=null"
    print(f"train with: examples/gpt2/train.py data.train={os.path.join(out_dir, 'train_*.bin')}{val} "
          f"data.tokenizer={tok.name} data.source=null model.vocab_size={tok.vocab_size}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
