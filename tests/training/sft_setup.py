"""A tiny HF LLaMA with its own LLaMA-3-style tokenizer and chat template (trained here with the tokenizers library,
nothing downloaded), and a small synthetic chat set, for the fine-tuning runs' tests."""
import json

import numpy as np
import torch
from transformers import GenerationConfig
from transformers import LlamaConfig as HFLlamaConfig
from transformers import LlamaForCausalLM

from tests.data.sft_tokenizers import train_tiny_llama3

NAMES = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
         "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen"]


def make_model_dir(directory, seed=0):
    """The tokenizer (chat template included) and a random LlamaForCausalLM of its vocabulary in ``directory``;
    returns the transformers tokenizer."""
    tok = train_tiny_llama3(directory)
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    torch.manual_seed(seed)
    hf = LlamaForCausalLM(HFLlamaConfig(vocab_size=len(tok), hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                        rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=tok.bos_token_id,
                                        eos_token_id=eot, pad_token_id=None))
    hf.generation_config = GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=[eot])
    hf.save_pretrained(directory)
    return tok


def conversation(a, b, system=False):
    messages = [{"role": "system", "content": "You are a helpful assistant. Answer briefly."}] if system else []
    return messages + [{"role": "user", "content": f"What is {NAMES[a]} plus {NAMES[b]}?"},
                       {"role": "assistant", "content": f"{NAMES[a]} plus {NAMES[b]} is {NAMES[a + b]}."}]


def write_chat_set(path, count, seed):
    """``count`` arithmetic conversations (some with a system turn, some two-turn) as chat JSONL."""
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for i in range(count):
            a, b = (int(v) for v in rng.integers(0, 9, 2))
            messages = conversation(a, b, system=i % 3 == 0)
            if i % 4 == 0:
                c, d = (int(v) for v in rng.integers(0, 9, 2))
                messages += conversation(c, d)
            f.write(json.dumps({"messages": messages}) + "\n")
    return path
