"""Supervised fine-tuning: packing vs padding, and what a short fine-tune learns. Nothing here is a test.

    python benchmarks/bench_sft.py throughput --repeats 3     # tokens/s with data.packing true vs false
    python benchmarks/bench_sft.py learning --steps 60        # answer-only loss vs the (untrained) prompt loss

Both use a tiny random LLaMA (2 layers, width 48) with its own LLaMA-3-style BPE tokenizer and chat template and a
synthetic chat set of arithmetic questions (tests/training/sft_setup.py: made here, nothing downloaded), full
fine-tuning in one process (configs/llama3_lora_sft.yaml with lora.rank=0), B=2, T=256.

throughput: the median step time (metrics.jsonl ``ms`` after the first 2 steps) of each run, then the median over
the alternated repeats; tokens/s counts every position of the rows, useful tokens/s only the samples' own tokens
(the loader's share of non-pad tokens times that).

learning: the loss on the answer tokens (what the run trains) and on the prompt tokens (system and user turns and
the template's headers, which it does not train) of the held-out conversations, before the fine-tune and after it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from benchmarks.train_runs import step_records  # noqa: E402

CONFIG = os.path.join(REPO, "configs", "llama3_lora_sft.yaml")
B, T = 2, 256


def setup(root):
    from tests.training.sft_setup import make_model_dir, write_chat_set

    make_model_dir(os.path.join(root, "model"))
    write_chat_set(os.path.join(root, "train.jsonl"), 400, seed=1)
    write_chat_set(os.path.join(root, "val.jsonl"), 40, seed=2)


def train(root, out, *extra):
    return step_records(CONFIG, out, [f"model.pretrained={root}/model", f"data.train={root}/train.jsonl",
                                      f"data.val={root}/val.jsonl", f"train.batch_size={B}",
                                      f"train.sequence_length={T}", f"train.total_batch_size={B * T}",
                                      "train.val_loss_every=0", "train.save_every=0", "train.log_every=1",
                                      "train.warmup_iters=2", "lora.rank=0", "device=cpu", "plot=false", *extra])


def fill(root, packing):
    from infini_train.data.sft_loader import SFTDataLoader
    from infini_train.data.tokenizer import get_tokenizer

    tok = get_tokenizer(f"hf:{root}/model")
    return SFTDataLoader(f"{root}/train.jsonl", tok, B, T, format="chat", packing=packing).stats()["fill"]


def throughput(args):
    with tempfile.TemporaryDirectory() as root:
        setup(root)
        ms = {True: [], False: []}
        for rep in range(args.repeats):  # alternated
            for packing in ms:
                recs = train(root, os.path.join(root, f"run-{packing}-{rep}"), f"data.packing={str(packing).lower()}",
                             f"train.num_iterations={args.steps}")
                ms[packing].append(statistics.median(r["ms"] for r in recs[2:]))
                print(f"repeat {rep + 1} packing={packing}: {ms[packing][-1]:.1f} ms", flush=True)
        print("| data.packing | step ms (median of runs) | range | tokens/s | non-pad share | useful tokens/s |")
        print("| --- | --- | --- | --- | --- | --- |")
        for packing, v in ms.items():
            step = statistics.median(v)
            share = fill(root, packing)
            rate = B * T / step * 1000
            print(f"| {str(packing).lower()} | {step:.1f} | {min(v):.1f}-{max(v):.1f} | {rate:.0f} | "
                  f"{100 * share:.1f}% | {rate * share:.0f} |", flush=True)


def split_losses(model_state, root):
    """(answer loss, prompt loss) of the held-out conversations under ``model_state`` (None: the pretrained)."""
    import infini_train as it
    from infini_train.data.sft_loader import SFTDataLoader
    from infini_train.data.tokenizer import get_tokenizer
    from infini_train.models.documents import packed_documents
    from infini_train.models.pretrained import from_pretrained
    from infini_train.nn import functional as F

    model = from_pretrained(f"{root}/model")
    if model_state is not None:
        model.load_state_dict(model_state)
    model.eval()
    tok = get_tokenizer(f"hf:{root}/model")
    sums = {"answer": [0.0, 0], "prompt": [0.0, 0]}
    answers = SFTDataLoader(f"{root}/val.jsonl", tok, B, T, format="chat", shuffle=False)
    every = SFTDataLoader(f"{root}/val.jsonl", tok, B, T, format="chat", shuffle=False, train_on_prompt=True)
    with it.no_grad():
        for _ in range(answers.rows_in_epoch() // B):
            a, e = answers.next_batch(), every.next_batch()
            with packed_documents(a.positions, a.segments):
                logits, _ = model(it.tensor(a.inputs))
            flat = logits.view(-1, logits.shape[-1])
            prompt = np.where(a.targets == -1, e.targets, -1)
            for name, targets in (("answer", a.targets), ("prompt", prompt)):
                count = int((targets != -1).sum())
                if count:
                    loss = F.cross_entropy(flat, it.tensor(targets.reshape(-1)), ignore_index=-1).item()
                    sums[name][0] += loss * count
                    sums[name][1] += count
    return tuple(sums[k][0] / sums[k][1] for k in ("answer", "prompt"))


def learning(args):
    from infini_train.run_state import list_checkpoints, load_model_checkpoint

    with tempfile.TemporaryDirectory() as root:
        setup(root)
        before = split_losses(None, root)
        out = os.path.join(root, "run")
        recs = train(root, out, f"train.num_iterations={args.steps}", "train.learning_rate=3e-3")
        after = split_losses(load_model_checkpoint(list_checkpoints(out)[-1])[0], root)
        print(f"training loss (answer tokens) step 1 / {args.steps}: {recs[0]['loss']:.3f} / {recs[-1]['loss']:.3f}")
        print("| held-out loss | before | after |")
        print("| --- | --- | --- |")
        print(f"| answer tokens (trained) | {before[0]:.3f} | {after[0]:.3f} |")
        print(f"| prompt tokens (not trained) | {before[1]:.3f} | {after[1]:.3f} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["throughput", "learning"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=None)
    args = parser.parse_args()
    if args.what == "throughput":
        args.steps = args.steps or 12
        throughput(args)
    else:
        args.steps = args.steps or 60
        learning(args)


if __name__ == "__main__":
    main()
