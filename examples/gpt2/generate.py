"""Generate text from a model (GPT-2, LLaMA-3, Qwen3, Qwen3-MoE, Mixtral: any training checkpoint, or HF weights), with
no graph built (no_grad) and a KV cache.

    python examples/gpt2/generate.py --checkpoint runs/gpt2_tiny --prompt "def main(" --max-new-tokens 200
    python examples/gpt2/generate.py --pretrained path/to/gpt2_124M.bin --prompt "Hello" --top-k 40
    mpirun -n 2 python examples/gpt2/generate.py --checkpoint runs/gpt2_tiny --prompt "def main("

Under mpirun the model is split over the ranks with tensor parallelism (attention heads, MLP and vocabulary); every
rank generates the same tokens and rank 0 prints them.

Tokens are streamed to stdout as they are produced.

    python examples/gpt2/generate.py --checkpoint runs/llama3_lora_sft --chat --temperature 0

--chat talks to the model through its chat template (the tokenizer's, or ChatML for tokenizers that ship none):
each line read from stdin is a user turn, the reply is streamed and kept in the conversation, and a reply ends at
the tokenizer's end-of-sequence / end-of-turn tokens (generation_config.json's eos_token_id list) or after
--max-new-tokens. An empty line or end of input ends the chat.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from common import (DEVICE_FORMS, DTYPES, PRECISIONS, join_tensor_parallel, load_model, parse_device, parse_dtype,
                    parse_precision, split_over_ranks, to_tensor)

import infini_train as it


class StreamPrinter:
    """Writes each new token as it comes, holding back bytes that do not yet form whole characters; ``hide``: ids
    not shown (a chat reply's end-of-turn token); ``stop_text``: text that ends what is shown (an end-of-turn marker
    a tokenizer writes as text), held back while it may be starting; ``skip_special``: decode without the special
    tokens (a chat reply's <|im_start|>; Hugging Face tokenizers)."""

    def __init__(self, tokenizer, out=sys.stdout, hide=(), stop_text=None, skip_special=False):
        self.tokenizer = tokenizer
        self.decode_options = {"skip_special_tokens": True} if skip_special else {}
        self.out = out
        self.pending = []
        self.hide = set(hide)
        self.stop_text = stop_text
        self.held = ""
        self.ended = False

    def __call__(self, token_ids):
        if self.ended or int(token_ids[0]) in self.hide:
            self.ended = True  # (a stopped row repeats its stop token)
            return
        self.pending.append(int(token_ids[0]))
        text = self.tokenizer.decode(self.pending, **self.decode_options)
        if not text.endswith("\ufffd"):
            self._emit(text)

    def flush(self):
        self._emit(self.tokenizer.decode(self.pending, **self.decode_options) if self.pending else "", final=True)

    def _emit(self, text, final=False):
        self.pending = []
        text, self.held = self.held + text, ""
        if self.stop_text:
            cut = text.find(self.stop_text)
            if cut >= 0:
                text, self.ended = text[:cut], True
            elif not final:  # keep back an ending that may begin the stop text
                n = next((n for n in range(min(len(text), len(self.stop_text) - 1), 0, -1)
                          if self.stop_text.startswith(text[-n:])), 0)
                text, self.held = text[:len(text) - n], text[len(text) - n:]
        if text:
            self.out.write(text)
            self.out.flush()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="a checkpoints/step_XXXXXX directory or a run's out_dir (its newest good "
                                          "checkpoint), whole or sharded; a LoRA run's adapters are merged")
    src.add_argument("--pretrained", help="a Hugging Face directory (config.json + safetensors: GPT-2, LLaMA, Qwen3, "
                                          "Qwen3-MoE, Mixtral) or an llm.c GPT-2 .bin file")
    p.add_argument("--prompt", default="", help="text to continue (default: start from end-of-text)")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=1.0, help="0 picks the most likely token (greedy)")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k likeliest tokens (0: all of them)")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling: the likeliest tokens holding this "
                                                             "much probability, in (0, 1]")
    p.add_argument("--num-samples", type=int, default=1)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--device", default="cpu", help=f"{DEVICE_FORMS} (default cpu)")
    p.add_argument("--dtype", default="float32", help=f"{' or '.join(DTYPES)} (default float32)")
    p.add_argument("--tokenizer", default=None, help="override the tokenizer recorded with the model")
    p.add_argument("--no-cache", action="store_true", help="re-run the whole context for every token")
    p.add_argument("--precision", default="fp32", help=f"{' | '.join(PRECISIONS)}: the forward under autocast")
    p.add_argument("--chat", action="store_true", help="talk through the chat template: each stdin line is a user "
                                                        "turn (see the description above)")
    p.add_argument("--system", default=None, help="--chat: a system message before the first turn")
    p.add_argument("--tensor-parallel", type=int, default=None,
                   help="under mpirun: ranks the model is split over (default and only value: all of them)")
    args = p.parse_args(argv)
    check_sampling_args(p, args)
    tp_group, device_name = join_tensor_parallel(args.tensor_parallel, args.device)
    device, dtype = parse_device(device_name), parse_dtype(args.dtype)  # before the (slow) model load
    amp = parse_precision(args.precision, device)
    printing = it.distributed.get_rank() == 0
    out = sys.stdout if printing else open(os.devnull, "w")  # every rank generates, rank 0 prints

    model, tok = load_model(args.checkpoint, args.pretrained, device, args.tokenizer, dtype)
    if tp_group is not None:
        split_over_ranks(model, tp_group)
    if args.chat:
        with it.no_grad(), amp():
            chat(model, tok, args, device, out)
        it.distributed.destroy_process_group()
        return 0
    ids = tok.encode(args.prompt) if args.prompt else [tok.eot_token]
    block = model.config.context_length
    if len(ids) > block:
        raise SystemExit(f"error: the prompt is {len(ids)} tokens, more than the model's block_size {block}\n"
                         f"HINT: shorten the prompt to at most {block} tokens")
    with it.no_grad(), amp():
        for i in range(args.num_samples):
            if args.num_samples > 1 and printing:
                print(f"--- sample {i + 1} ---")
            out.write(args.prompt)
            out.flush()
            stream = StreamPrinter(tok, out)
            t0 = time.perf_counter()
            model.generate(to_tensor([ids], device), args.max_new_tokens, temperature=args.temperature,
                           top_k=args.top_k, top_p=args.top_p, seed=args.seed + i, use_cache=not args.no_cache,
                           stream=stream)
            dt = time.perf_counter() - t0
            stream.flush()
            out.write("\n")
            if printing:
                print(f"[{args.max_new_tokens} tokens in {dt:.2f} s: {args.max_new_tokens / dt:.1f} tokens/s]",
                      file=sys.stderr)
    it.distributed.destroy_process_group()
    return 0


def check_sampling_args(parser, args):
    """Sampling options out of range: an argparse error (usage, exit status 2) before the model loads."""
    if not args.temperature >= 0:
        parser.error(f"argument --temperature: expected a number >= 0 (0: greedy), got {args.temperature:g}")
    if args.top_k is not None and args.top_k < 0:
        parser.error(f"argument --top-k: expected an integer >= 0 (0: no top-k), got {args.top_k}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        parser.error(f"argument --top-p: expected a number in (0, 1], got {args.top_p:g}")
    for option, value, least in (("--max-new-tokens", args.max_new_tokens, 0), ("--num-samples", args.num_samples, 1)):
        if value < least:
            parser.error(f"argument {option}: expected an integer >= {least}, got {value}")


END_OF_TURN_TEXT = "<|im_end|>"  # the built-in ChatML template's, as text for tokenizers without it as a token


def chat(model, tok, args, device, out):
    """The --chat loop: rank 0 reads each user line (every rank gets it), the reply is generated greedily or
    sampled as the other flags say, streamed, and appended to the conversation."""
    from infini_train.data.chat_template import render_chat

    messages = [{"role": "system", "content": args.system}] if args.system else []
    stops = list(getattr(tok, "stop_token_ids", None) or [tok.eot_token])
    hf = hasattr(tok, "apply_chat_template")  # special tokens are left out of the reply, shown and kept
    end_of_turn = tok.token_to_id(END_OF_TURN_TEXT) if hf else None
    if end_of_turn is not None and end_of_turn not in stops:  # a ChatML turn ends there, also when EOS is another
        stops.append(end_of_turn)
    block = model.config.context_length
    interactive = sys.stdin.isatty()
    turn = 0
    while True:
        line = read_line("user> " if interactive else "")
        if not line:
            break
        messages.append({"role": "user", "content": line})
        ids = tok.encode(render_chat(tok, messages, add_generation_prompt=True), **_no_special(tok))
        room = block - len(ids)
        if room < 1:
            raise SystemExit(f"error: the conversation is {len(ids)} tokens, the model's context is {block}\n"
                             "HINT: start a new chat, or use a shorter --system message")
        stream = StreamPrinter(tok, out, hide=stops, stop_text=END_OF_TURN_TEXT, skip_special=hf)
        tokens = model.generate(to_tensor([ids], device), min(args.max_new_tokens, room),
                                temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                seed=args.seed + turn, use_cache=not args.no_cache, stream=stream,
                                stop_tokens=stops).numpy()[0, len(ids):].tolist()
        stream.flush()
        out.write("\n")
        out.flush()
        while tokens and tokens[-1] in stops:
            tokens.pop()
        reply = tok.decode(tokens, **({"skip_special_tokens": True} if hf else {})).split(END_OF_TURN_TEXT)[0]
        messages.append({"role": "assistant", "content": reply})
        turn += 1


def _no_special(tok):
    """encode()'s keyword for rendered chat text: the template writes BOS/EOS itself (HF tokenizers)."""
    return {"add_special_tokens": False} if hasattr(tok, "apply_chat_template") else {}


def read_line(prompt):
    """The next stdin line on rank 0, the same on every rank ("" at end of input)."""
    line = None
    if it.distributed.get_rank() == 0:
        try:
            line = input(prompt).rstrip("\n")
        except EOFError:
            line = ""
    if it.distributed.get_world_size() > 1:
        lines = [None] * it.distributed.get_world_size()
        it.distributed.all_gather_object(lines, line)
        line = lines[0]
    return line


if __name__ == "__main__":
    sys.exit(main())
