"""Small Hugging Face tokenizer directories for the hf: tokenizer and chat template tests, built offline: one
byte-level BPE trained on a few KB of varied text with the tokenizers library, saved by transformers'
PreTrainedTokenizerFast.save_pretrained in four shapes, and a BERT-like WordPiece.

    llama3  LLaMA-3's pre-tokenizer regex, BOS added by the post-processor, eos <|end_of_text|>, generation_config
            stopping at <|end_of_text|> and <|eot_id|>, LLaMA-3's chat template in chat_template.jinja
    qwen    no BOS, eos <|im_end|>, pad <|endoftext|>, a Qwen2-style ChatML template (default system prompt,
            tools through tojson) inside tokenizer_config.json, the older layout
    strict  <s> ... </s> added around every text (add_bos_token / add_eos_token), a LLaMA-2-style template that
            takes a system prompt, insists on alternating roles (raise_exception) and closes on loop.last, plus a
            named "tool_use" template in additional_chat_templates/; a model-specific image_token and an added
            non-special token, neither in the trained vocabulary
    plain   no template, no post-processor, written by hand in the legacy layout (special_tokens_map.json) with a
            mask_token tokenizer.json lacks and clean_up_tokenization_spaces (ignored for BPE, as transformers does)
    bert    WordPiece, lower-casing normalizer, [CLS] $A [SEP], clean_up_tokenization_spaces applied, no EOS
"""
import json
import os

SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>",
           "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>"]

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                r"|\s+(?!\S)|\s+")

LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

QWEN_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\\n' }}
        {%- if message.reasoning_content is defined and enable_thinking | default(true) %}
            {{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' }}
        {%- endif %}
        {{- message.content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

STRICT_TEMPLATE = """{% if messages[0]['role'] == 'system' %}
    {% set system_message = messages[0]['content'] %}
    {% set loop_messages = messages[1:] %}
{% else %}
    {% set system_message = false %}
    {% set loop_messages = messages %}
{% endif %}
{% set ns = namespace(turns=0) %}
{% for message in loop_messages %}
    {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {% endif %}
    {% if loop.index0 == 0 and system_message %}
        {% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}
    {% else %}
        {% set content = message['content'] %}
    {% endif %}
    {% if message['role'] == 'user' %}
        {% set ns.turns = ns.turns + 1 %}
        {{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}
    {% elif message['role'] == 'assistant' %}
        {% generation %}{{ ' ' + content.strip() + ' ' + eos_token }}{% endgeneration %}
    {% endif %}
    {% if loop.last %}
        {{ '<!-- ' ~ ns.turns ~ ' turns, ' ~ messages | length ~ ' messages -->' }}
    {% endif %}
{% endfor %}
"""

TOOL_USE_TEMPLATE = ("{{ bos_token }}[AVAILABLE_TOOLS]{{ tools | tojson(indent=2) }}[/AVAILABLE_TOOLS]"
                     "{% for m in messages %}[{{ m.role | upper }}]{{ m.content }}{% if not loop.last %}\n{% endif %}"
                     "{% endfor %}{% if add_generation_prompt %}[ASSISTANT]{% endif %}")

CORPUS = [
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs!",
    "It's a test: they're here, we've gone, I'm sure you'll see what he'd do.",
    "def train(model, data):\n    for step, (x, y) in enumerate(data):\n        loss = model(x, y)  # forward\n"
    "        loss.backward()\n    return {'loss': float(loss), \"steps\": step + 1}\n",
    "class Config:\n\tname = 'tiny'\n\tlayers = 12\n\n\n\tdef __repr__(self):\n\t\treturn f\"<{self.name}>\"\n",
    "Numbers 0 1 12 123 1234 12345 3.14159 -42 1e-5 0xFF 2024-05-20, prices $9.99 and 100%.",
    "héllo wörld, ça va? Größe, naïve café, Ελληνικά κείμενα, русский текст, עברית, العربية",
    "日本語のテキストです。中文文本。한국어 텍스트. Emoji: 🙂🚀👍🏽 and symbols ✓ ∑ ∞ ≠ → 𝛑",
    "    indented by four\n        by eight\n\n\n   three blank lines above   and   runs   of   spaces  ",
    "Q: What is 2 + 2?\nA: 4.\nQ: Who wrote Hamlet?\nA: Shakespeare, around 1600.",
    "<html><body><p class=\"x\">Tags & entities &amp; 'quotes'</p></body></html>",
    "user: hello there\nassistant: Hi! How can I help you today?\nsystem: You are a helpful assistant.",
]


def _trained():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 4, trainer)
    return tok


def _copy(tok):
    from tokenizers import Tokenizer, decoders

    copy = Tokenizer.from_str(tok.to_str())
    copy.decoder = decoders.ByteLevel()
    return copy


def build_all(root):
    """{name: directory} of the five tokenizers under ``root``."""
    from tokenizers import AddedToken, Regex, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    base = _trained()
    dirs = {name: os.path.join(root, name) for name in ("llama3", "qwen", "strict", "plain", "bert")}

    tok = _copy(base)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
        special_tokens=[("<|begin_of_text|>", bos)])
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>",
                            chat_template=LLAMA3_TEMPLATE).save_pretrained(dirs["llama3"])
    with open(os.path.join(dirs["llama3"], "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": bos, "eos_token_id": [tok.token_to_id("<|end_of_text|>"),
                                                         tok.token_to_id("<|eot_id|>")]}, f)

    tok = _copy(base)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                            chat_template=QWEN_TEMPLATE).save_pretrained(dirs["qwen"], save_jinja_files=False)

    tok = _copy(base)
    tok.add_tokens([AddedToken("<tool>", normalized=True)])
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", add_bos_token=True,
                            add_eos_token=True, extra_special_tokens={"image_token": "<image>"},
                            chat_template={"default": STRICT_TEMPLATE, "tool_use": TOOL_USE_TEMPLATE}
                            ).save_pretrained(dirs["strict"])

    os.makedirs(dirs["plain"])
    _copy(base).save(os.path.join(dirs["plain"], "tokenizer.json"))
    with open(os.path.join(dirs["plain"], "tokenizer_config.json"), "w") as f:
        json.dump({"clean_up_tokenization_spaces": True, "model_max_length": 2048, "mask_token": "<mask>",
                   "tokenizer_class": "GPT2Tokenizer"}, f)
    with open(os.path.join(dirs["plain"], "special_tokens_map.json"), "w") as f:
        json.dump({"eos_token": {"content": "<|endoftext|>", "lstrip": False, "normalized": False, "rstrip": False,
                                 "single_word": False}, "pad_token": "<|endoftext|>"}, f)

    PreTrainedTokenizerFast(tokenizer_object=_wordpiece(), unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]",
                            cls_token="[CLS]", mask_token="[MASK]", clean_up_tokenization_spaces=True
                            ).save_pretrained(dirs["bert"])
    return dirs


def _wordpiece():
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(CORPUS * 4, trainers.WordPieceTrainer(vocab_size=500, special_tokens=special,
                                                                  show_progress=False))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    return tok
