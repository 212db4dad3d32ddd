"""Tokenizers for the SFT data tests: a tiny byte-level BPE trained with the tokenizers library, saved as a
transformers PreTrainedTokenizerFast with a LLaMA-3-style chat template, and the stand-in that gives it the
interface infini_train's SFT data codes against (transformers is the test oracle; the package never imports it)."""
import os

# LLaMA-3's chat template, with {% generation %} markers around the assistant turns so that transformers can say
# which tokens are the assistant's (return_assistant_tokens_mask): an oracle independent of infini_train's masking
LLAMA3_TEMPLATE = (
    "{% for message in messages %}{% if loop.index0 == 0 %}{{ bos_token }}{% endif %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] | trim + '<|eot_id|>' }}"
    "{% endgeneration %}{% else %}{{ message['content'] | trim + '<|eot_id|>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")
# LLaMA-3's pre-tokenizer split (tokenizer.json of Meta-Llama-3-8B)
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
CORPUS = [
    "The quick brown fox jumps over the lazy dog. What is the capital of France? Paris is the capital of France.",
    "Hello! How can I help you today? Please write a short poem about the sea. The sea is wide and deep and blue.",
    "system user assistant tool You are a helpful assistant. Answer briefly. 1 + 1 = 2, 2 * 3 = 6, 10 / 2 = 5.",
    "def add(a, b):\n    return a + b\n\nTranslate to French: good morning -> bonjour. Thanks, thank you, merci.",
]


def train_tiny_llama3(directory, vocab_size=400):
    """A tiny LLaMA-3-style tokenizer saved in ``directory`` and loaded back: PreTrainedTokenizerFast."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS * 4, trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
    hf.chat_template = LLAMA3_TEMPLATE
    hf.save_pretrained(directory)
    return PreTrainedTokenizerFast.from_pretrained(directory)


class HFStandIn:
    """Only the tokenizer interface infini_train's SFT data relies on (apply_chat_template, encode, eos_token_id,
    pad_token_id, eot_token, vocab_size), over a transformers tokenizer: the SFT tests run with it and with the
    project's HFTokenizer, so neither's extras are needed."""

    def __init__(self, hf, name="tiny-llama3"):
        self.hf, self.name = hf, name
        self.eos_token_id, self.pad_token_id = hf.eos_token_id, hf.pad_token_id
        self.eot_token, self.vocab_size = hf.eos_token_id, len(hf)

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        return self.hf.apply_chat_template(messages, tokenize=tokenize, add_generation_prompt=add_generation_prompt)

    def encode(self, text, add_special_tokens=False):
        return self.hf.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids):
        return self.hf.decode([int(i) for i in ids])


def tiny_llama3_dir(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("tiny_llama3_tokenizer"))
    train_tiny_llama3(directory)
    assert os.path.exists(os.path.join(directory, "tokenizer.json"))
    return directory
