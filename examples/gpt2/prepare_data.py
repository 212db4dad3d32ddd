"""Text files -> llm.c token shards (val_NNNNNN.bin, train_NNNNNN.bin) plus meta.json, for train.py.

    python examples/gpt2/prepare_data.py                                # the default corpus (Python's stdlib)
    python examples/gpt2/prepare_data.py book.txt "notes/**/*.md" --out-dir data/mine --tokenizer gpt2
    python examples/gpt2/prepare_data.py input.txt --split-on $'\\n\\n' --val-tokens 32768   # tinyshakespeare-style

Each input file is one document (or several, cut at --split-on); every document is preceded by the
end-of-text token and the first tokens form the validation split, as in llm.c's dev/data scripts.
Then train with:  train.py data.train=DIR/train_*.bin data.val=DIR/val_*.bin data.source=null
"""
from __future__ import annotations

import argparse
import glob
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from infini_train.data.corpus import (  # noqa: E402
    DEFAULT_MAX_BYTES,
    DEFAULT_SHARD_TOKENS,
    DEFAULT_VAL_FRACTION,
    build_default_corpus,
    prepare_shards,
    read_text,
    stdlib_files,
)
from infini_train.data.tokenizer import TOKENIZERS, get_tokenizer  # noqa: E402


def expand_inputs(patterns):
    """Files named by paths, globs (``**`` recurses) or directories (every file below, hidden ones skipped),
    in the order given, each pattern's matches sorted; SystemExit naming a pattern that matches nothing."""
    files = []
    for pattern in patterns:
        if os.path.isdir(pattern):
            matches = []
            for directory, dirs, names in os.walk(pattern):
                dirs[:] = [d for d in dirs if not d.startswith(".")]
                matches += [os.path.join(directory, name) for name in names if not name.startswith(".")]
        else:
            matches = glob.glob(os.path.expanduser(pattern), recursive=True)
        matches = sorted(p for p in matches if os.path.isfile(p))
        if not matches:
            raise SystemExit(f"error: no files match {pattern!r}\nHINT: give text files, globs (quote them) or "
                             "directories; with no inputs the default corpus is used")
        files += [p for p in matches if p not in files]
    return files


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="*", help="text files, globs or directories (default: Python's stdlib sources)")
    p.add_argument("--out-dir", default=None,
                   help="where the shards go (default data/stdlib_<tokenizer>, or data/<first input>_<tokenizer>)")
    p.add_argument("--tokenizer", default="byte", choices=TOKENIZERS, help="default byte (needs nothing)")
    split = p.add_mutually_exclusive_group()
    split.add_argument("--val-fraction", type=float, default=None,
                       help=f"fraction of the tokens for validation (default {DEFAULT_VAL_FRACTION})")
    split.add_argument("--val-tokens", type=int, default=None, help="the first N tokens for validation instead")
    p.add_argument("--shard-tokens", type=int, default=DEFAULT_SHARD_TOKENS,
                   help=f"tokens per shard at most (default {DEFAULT_SHARD_TOKENS:,}, as llm.c's fineweb)")
    p.add_argument("--max-bytes", type=int, default=None,
                   help=f"stop reading input after this many bytes (default corpus: {DEFAULT_MAX_BYTES:,})")
    p.add_argument("--split-on", default=None, help="also cut each file into documents at this separator")
    args = p.parse_args(argv)

    try:
        tok = get_tokenizer(args.tokenizer)
    except RuntimeError as exc:
        raise SystemExit(f"error: {exc}") from None
    split_args = dict(val_fraction=DEFAULT_VAL_FRACTION if args.val_fraction is None else args.val_fraction,
                      val_tokens=args.val_tokens, shard_tokens=args.shard_tokens)
    t0 = time.perf_counter()
    try:
        if args.inputs:
            files = expand_inputs(args.inputs)
            first = os.path.splitext(os.path.basename(files[0]))[0] or "text"
            out_dir = args.out_dir or os.path.join("data", f"{first}_{tok.name}")
            documents, total = [], 0
            for path in files:
                if args.max_bytes and total >= args.max_bytes:
                    break
                text = read_text(path)
                total += len(text.encode("utf-8"))
                documents += [d for d in text.split(args.split_on) if d] if args.split_on else [text]
            if not documents:
                raise SystemExit("error: the inputs hold no text")
            meta = prepare_shards(documents, out_dir, tok, **split_args,
                                  extra_meta={"source": "files", "inputs": args.inputs})
        else:
            max_bytes = args.max_bytes or DEFAULT_MAX_BYTES
            files = stdlib_files(max_bytes)
            total = sum(os.path.getsize(path) for path in files)
            out_dir = args.out_dir or os.path.join("data", f"stdlib_{tok.name}")
            meta = build_default_corpus(out_dir, tok, max_bytes, **split_args)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    dt = time.perf_counter() - t0
    print(f"{len(files)} files, {meta['documents']} documents, {total:,} bytes -> {meta['num_tokens']:,} {tok.name} "
          f"tokens ({meta['train_tokens']:,} train in {meta['train_shards']} shard(s), {meta['val_tokens']:,} val "
          f"in {meta['val_shards']}) in {out_dir}/ ({dt:.2f} s)")
    val = f" data.val={os.path.join(out_dir, 'val_*.bin')}" if meta["val_shards"] else " data.val=null"
    print(f"train with: examples/gpt2/train.py data.train={os.path.join(out_dir, 'train_*.bin')}{val} "
          f"data.tokenizer={tok.name} data.source=null model.vocab_size={tok.vocab_size}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
