"""The config.json that save_pretrained writes: begin/end-of-text ids of the tokenizer the vocabulary fits (not GPT-2's
50256 for a 257-token byte vocabulary), and configs transformers loads and generates from without a warning."""
import json
import logging

import pytest
import torch
import transformers

from infini_train.models.gpt2 import GPT2, GPT2Config
from infini_train.models.llama import Llama
from infini_train.models.llama.config import LlamaConfig
from infini_train.models.special_tokens import text_boundary_ids


@pytest.mark.parametrize("vocab_size,expected", [(257, (256, 256)), (320, (256, 256)), (50257, (50256, 50256)),
                                                 (50304, (50256, 50256)), (128256, (128000, 128001)),
                                                 (100, (None, None))])
def test_text_boundary_ids_follow_the_vocabulary(vocab_size, expected):
    assert text_boundary_ids(vocab_size) == expected


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _model(arch):
    if arch == "gpt2":
        return GPT2(GPT2Config(block_size=32, vocab_size=257, n_layer=2, n_head=2, n_embd=64))
    scaling = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=32)
    return Llama(LlamaConfig(vocab_size=257, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, intermediate_size=128,
                             max_seq_len=64, rope_scaling=scaling))


@pytest.mark.parametrize("arch", ["gpt2", "llama3"])
def test_an_exported_byte_vocabulary_model_loads_and_generates_in_transformers_without_warnings(tmp_path, arch):
    model = _model(arch)
    model.save_pretrained(tmp_path / arch)
    config = json.loads((tmp_path / arch / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"]) == (256, 256)
    records = _Records()
    logger = logging.getLogger("transformers")
    logger.addHandler(records)
    try:
        hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / arch)
        out = hf.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4, do_sample=False)
    finally:
        logger.removeHandler(records)
    assert out.shape == (1, 7) and hf.generation_config.eos_token_id == 256
    assert records.messages == []
