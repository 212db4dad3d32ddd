"""Shared by generate.py and evaluate.py: load a model (training checkpoint or pretrained weights) and the
tokenizer it was trained with."""
from __future__ import annotations

import os
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import infini_train as it  # noqa: E402
from infini_train.data.tokenizer import get_tokenizer  # noqa: E402
from infini_train.models.gpt2 import GPT2  # noqa: E402
from infini_train.utils.checkpoint import load_checkpoint  # noqa: E402


def load_model(checkpoint=None, pretrained=None, device="cpu", tokenizer=None):
    """Returns (model in eval mode, tokenizer). Exactly one of checkpoint / pretrained must be given.

    A checkpoint is a run's ``checkpoints/step_XXXXXX`` directory or its out_dir (the newest one is used);
    pretrained is an HF GPT-2 directory or an llm.c .bin file.
    """
    if (checkpoint is None) == (pretrained is None):
        raise SystemExit("error: give exactly one of --checkpoint or --pretrained")
    if checkpoint is not None:
        from infini_train.models.gpt2_config import GPT2Config

        model_state, _, state = load_checkpoint(checkpoint)
        config = GPT2Config(**state["model_config"])
        model = GPT2(config)
        model.load_state_dict(model_state)
        tok_name = tokenizer or state.get("tokenizer", "byte")
    else:
        model = GPT2.from_pretrained(pretrained)
        tok_name = tokenizer or ("gpt2" if model.config.vocab_size >= 50257 else "byte")
    tok = get_tokenizer(tok_name)
    if tok.vocab_size > model.config.vocab_size:
        raise SystemExit(f"error: tokenizer {tok.name!r} has {tok.vocab_size} tokens but the model's vocab_size is "
                         f"{model.config.vocab_size}\nHINT: pass --tokenizer matching the data the model was "
                         "trained on")
    model.to(device)
    model.eval()
    return model, tok


def to_tensor(tokens, device):
    return it.tensor(np.asarray(tokens, dtype=np.int64), device=device)
