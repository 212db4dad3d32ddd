"""The begin/end-of-text token ids a saved Hugging Face config names, from the vocabulary size: the tokenizer whose
vocabulary the model's fits is the one it was trained with (the byte tokenizer's 257 ids, GPT-2's 50257, LLaMA-3's
128256; a padded vocabulary such as 50304 rounds up to a multiple of 64 or 128 and keeps its tokenizer's ids)."""
from __future__ import annotations

BYTE_END_OF_TEXT = 256  # infini_train.data.tokenizer.ByteTokenizer.eot_token
GPT2_END_OF_TEXT = 50256  # <|endoftext|>
LLAMA3_BEGIN_OF_TEXT, LLAMA3_END_OF_TEXT = 128000, 128001  # <|begin_of_text|>, <|end_of_text|>


def text_boundary_ids(vocab_size):
    """(bos_token_id, eos_token_id) for a model of ``vocab_size`` ids, or (None, None) below the byte tokenizer's."""
    if vocab_size >= LLAMA3_END_OF_TEXT + 255:  # 128256: LLaMA-3's 128000 BPE ids + 256 special ids
        return LLAMA3_BEGIN_OF_TEXT, LLAMA3_END_OF_TEXT
    if vocab_size > GPT2_END_OF_TEXT:
        return GPT2_END_OF_TEXT, GPT2_END_OF_TEXT
    if vocab_size > BYTE_END_OF_TEXT:
        return BYTE_END_OF_TEXT, BYTE_END_OF_TEXT
    return None, None
