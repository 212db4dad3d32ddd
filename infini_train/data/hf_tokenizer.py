"""Tokenizers of Hugging Face model directories (``data.tokenizer: hf:PATH``), through the ``tokenizers`` library,
with the encodings, decodings and chat templates transformers 5.x gives for the same directory.

    tok = get_tokenizer("hf:models/Llama-3.2-1B-Instruct")   # or hf:.../tokenizer.json
    ids = tok.encode("Hello")                                # list[int], BOS as the tokenizer adds it
    tok.decode(ids, skip_special_tokens=True)                # "Hello"
    tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)   # list[int]

PATH is a directory holding ``tokenizer.json`` or that file itself; beside it are read, when present,
``tokenizer_config.json`` (special tokens, added tokens, chat_template, split_special_tokens,
clean_up_tokenization_spaces), the legacy ``special_tokens_map.json`` and ``added_tokens.json``,
``chat_template.jinja`` and ``additional_chat_templates/*.jinja`` (these take priority over tokenizer_config.json's
chat_template, as in transformers) and ``generation_config.json`` (its ``eos_token_id``, for ``stop_token_ids``).

The result equals ``transformers.PreTrainedTokenizerFast.from_pretrained(directory)``: named special tokens
missing from tokenizer.json are added as transformers adds them; BOS/EOS come from tokenizer.json's post-processor
(transformers 5 ignores tokenizer_config.json's add_bos_token / add_eos_token when tokenizer.json exists:
save_pretrained writes those flags into the post-processor); no truncation, no padding. Not reproduced: the
model-specific classes AutoTokenizer may pick from ``tokenizer_class`` (they can rebuild the post-processor) and
transformers' repair of some Mistral tokenizers' pre-tokenizer regex.

``eot_token`` (what separates documents in token shards and starts a sample) is the EOS id; a tokenizer that names
no EOS uses the first of END_OF_TEXT_TOKENS it has. ``encode_array`` gives uint16 ids when they fit (llm.c shards
hold uint16), else uint32. The ``tokenizers`` package (and Jinja2, for chat templates) are imported
on first use: without them this module imports, and loading says what to install.
"""
from __future__ import annotations

import importlib.util
import json
import os

import numpy as np

from .chat_template import CHATML_SOURCE, CHATML_TEMPLATE, ChatTemplateError, render_chat_template
from .tokenizer import HF_PREFIX, hf_name

SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
END_OF_TEXT_TOKENS = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")
# apply_chat_template arguments of transformers that this one does not take (they would reach the template)
UNSUPPORTED_CHAT_ARGS = ("continue_final_message", "sanitize_control_tokens", "return_dict", "return_tensors",
                         "padding", "truncation", "max_length", "return_assistant_tokens_mask", "tokenizer_kwargs")
INSTALL_HINT = "HINT: pip install -e '.[tokenizers]' (tokenizers==0.23.3 and Jinja2==3.1.6)"


class HFTokenizerError(ValueError):
    """A PATH that is not a Hugging Face tokenizer, or one whose files cannot be read; ``problem`` and ``hint`` are
    the message's parts (what was expected and received; what to do), for callers that report it their way."""

    def __init__(self, subject, problem, hint=None):
        super().__init__(f"{subject}: {problem}" + (f"\nHINT: {hint}" if hint else ""))
        self.problem, self.hint = problem, hint


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise ImportError("tokenizer 'hf:PATH' needs the tokenizers package, which is not installed\n"
                          + INSTALL_HINT) from None
    return tokenizers


def tokenizer_files(path):
    """(tokenizer.json path, directory of its settings files) for ``path``, a directory or a tokenizer.json file;
    HFTokenizerError when there is no such tokenizer."""
    shown = f"tokenizer 'hf:{path}'"
    if not path:
        raise HFTokenizerError(shown, "expected a path after 'hf:', got nothing", "data.tokenizer=hf:PATH, PATH a "
                               "Hugging Face model directory or its tokenizer.json")
    full = os.path.abspath(os.path.expanduser(path))
    if os.path.isfile(full):
        return full, os.path.dirname(full)
    if not os.path.isdir(full):
        raise HFTokenizerError(shown, f"expected a Hugging Face model directory or a tokenizer.json file, got a path "
                               f"that does not exist ({full})", "download the model first (e.g. huggingface-cli "
                               "download ORG/NAME --local-dir DIR) and name DIR")
    json_file = os.path.join(full, "tokenizer.json")
    if not os.path.isfile(json_file):
        present = sorted(os.listdir(full))
        slow = [n for n in present if n in ("tokenizer.model", "vocab.json", "merges.txt", "vocab.txt",
                                            "spiece.model", "tekken.json")]
        hint = (f"it has {', '.join(slow)}: write tokenizer.json once with transformers: "
                "AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR)" if slow else
                "name the directory that holds the model's tokenizer files")
        raise HFTokenizerError(shown, f"expected tokenizer.json in {full}, got a directory without it (it holds "
                               f"{', '.join(present[:12]) or 'nothing'}{', ...' if len(present) > 12 else ''})", hint)
    return json_file, full


def _installed(module):
    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:  # a module set to None in sys.modules: imports of it fail
        return False


def config_problem(path):
    """Why ``hf:path`` cannot be a run's tokenizer, as (problem, hint), or None; reads no tokenizer file (a config
    check, before any work starts)."""
    if not (_installed("tokenizers") and _installed("jinja2")):
        return ("hf:PATH needs the tokenizers and Jinja2 packages, which are not installed",
                "pip install -e '.[tokenizers]'")
    try:
        tokenizer_files(path)
    except HFTokenizerError as exc:
        return exc.problem, exc.hint
    return None


def _read_json(path):
    """The JSON object in ``path``, or {} when there is no such file."""
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise HFTokenizerError(path, f"expected a readable JSON file, got {type(exc).__name__}: {exc}",
                               "download the file again") from None
    if not isinstance(data, dict):
        raise HFTokenizerError(path, f"expected a JSON object, got {type(data).__name__}")
    return data


def _added_token(value):
    """A tokenizers.AddedToken for a config entry (a str, or a dict as tokenizer_config.json saves them)."""
    AddedToken = _tokenizers().AddedToken
    if isinstance(value, AddedToken):
        return value
    if isinstance(value, dict):
        return AddedToken(**{k: v for k, v in value.items() if k != "__type"})
    return value


def _content(value):
    return value.content if hasattr(value, "content") else value.get("content") if isinstance(value, dict) else value


def _settings(directory):
    """tokenizer_config.json with the legacy special_tokens_map.json merged in (as transformers reads them)."""
    config = _read_json(os.path.join(directory, "tokenizer_config.json"))
    if "added_tokens_decoder" not in config:
        for key, value in _read_json(os.path.join(directory, "special_tokens_map.json")).items():
            if key in ("extra_special_tokens", "additional_special_tokens") and isinstance(value, list):
                known = list(config.get(key) or [])
                config[key] = known + [v for v in value if v not in known]
            else:
                config[key] = {**value, "special": True} if isinstance(value, dict) else value
    return config


def _named_tokens(config):
    """{name: token} of the named special tokens: the seven standard ones, then model-specific ``*_token`` keys."""
    extra = config.get("extra_special_tokens")
    extra = extra if extra is not None else config.get("additional_special_tokens")
    specific = dict(extra) if isinstance(extra, dict) else {}
    named = {}
    for key in SPECIAL_TOKEN_NAMES + tuple(k for k in config if k not in SPECIAL_TOKEN_NAMES) + tuple(specific):
        value = specific.get(key, config.get(key))
        if key.endswith("_token") and (isinstance(value, str) or (isinstance(value, dict) and "content" in value)):
            named[key] = value
    return named, (list(extra) if isinstance(extra, list) else [])


def _add_missing_tokens(backend, config, directory, named, extra):
    """Add what transformers' constructor adds: tokenizer_config.json's added tokens unlike any in tokenizer.json,
    then the named and extra special tokens tokenizer.json lacks (as special tokens)."""
    AddedToken = _tokenizers().AddedToken
    have = backend.get_added_tokens_decoder()
    present = {repr(t) for t in have.values()}
    if "added_tokens_decoder" in config:
        listed = {int(i): _added_token(t) for i, t in config["added_tokens_decoder"].items()}
    else:  # legacy added_tokens.json: token -> id
        specials = {_content(v) for v in list(named.values()) + extra}
        listed = {int(i): AddedToken(t, rstrip=False, lstrip=False, normalized=t not in specials, special=t in specials)
                  for t, i in _read_json(os.path.join(directory, "added_tokens.json")).items()}
    by_content = {t.content: t for t in listed.values()}
    to_add = [t for _, t in sorted(listed.items()) if repr(t) not in present]
    known = {t.content for t in have.values()} | {t.content for t in to_add}
    for value in [by_content.get(_content(v), _added_token(v)) for v in named.values()] + \
                 [_added_token(v) for v in extra]:
        text = _content(value)
        if text in known:
            continue
        known.add(text)
        if isinstance(value, str):
            value = AddedToken(value, special=True)
        elif not value.special and text in {_content(v) for v in named.values()}:
            value.special = True
        to_add.append(value)
    if to_add:
        backend.add_tokens(to_add)


def _chat_templates(directory, config):
    """({name: (template, where it came from)}, whether the tokenizer has one template rather than named ones)."""
    found = {}
    jinja_file = os.path.join(directory, "chat_template.jinja")
    extra_dir = os.path.join(directory, "additional_chat_templates")
    if os.path.isfile(jinja_file):
        found["default"] = jinja_file
    if os.path.isdir(extra_dir):
        for name in sorted(os.listdir(extra_dir)):
            if name.endswith(".jinja"):
                found[name[:-len(".jinja")]] = os.path.join(extra_dir, name)
    if found:
        templates = {}
        for name, path in found.items():
            with open(path, encoding="utf-8") as f:
                templates[name] = (f.read(), path)
        return templates, list(templates) == ["default"]
    where = f"{os.path.join(directory, 'tokenizer_config.json')}: chat_template"
    template = config.get("chat_template")
    if isinstance(template, str):
        return {"default": (template, where)}, True
    if isinstance(template, list):
        return {t["name"]: (t["template"], f"{where} {t['name']!r}") for t in template}, False
    return {}, True


class HFTokenizer:
    """A Hugging Face tokenizer read from ``path`` (a model directory or its tokenizer.json); see the module's
    docstring. Build it with ``get_tokenizer("hf:PATH")``."""

    accepts_bytes = False  # text only

    def __init__(self, path):
        tokenizers = _tokenizers()
        json_file, directory = tokenizer_files(path)
        self.name = hf_name(path)
        self.path, self.directory = self.name[len(HF_PREFIX):], directory
        try:
            backend = tokenizers.Tokenizer.from_file(json_file)
        except Exception as exc:  # the Rust side raises its own exception type
            raise HFTokenizerError(json_file, f"expected a tokenizers JSON file, got one it cannot read: {exc}",
                                   "download it again; a tokenizer.json newer than tokenizers 0.23.3 may need a "
                                   "newer release") from None
        config = _settings(directory)
        if backend.padding and "pad_token" not in config:  # transformers takes tokenizer.json's padding token
            config["pad_token"] = backend.padding["pad_token"]
        named, extra = _named_tokens(config)
        _add_missing_tokens(backend, config, directory, named, extra)
        backend.no_truncation()
        backend.no_padding()
        backend.encode_special_tokens = bool(config.get("split_special_tokens", False))
        if backend.post_processor is None:
            backend.post_processor = tokenizers.processors.TemplateProcessing(single="$A:0", pair="$A:0 $B:1",
                                                                              special_tokens=[])
        self._tok = backend
        self._clean_up = bool(config.get("clean_up_tokenization_spaces", False)) and (
            type(backend.model).__name__ != "BPE"
            or config.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False))
        self.special_tokens = {k: _content(v) for k, v in named.items()}
        self.bos_token_id = self.token_to_id(self.special_tokens.get("bos_token"))
        self.eos_token_id = self.token_to_id(self.special_tokens.get("eos_token"))
        self.pad_token_id = self.token_to_id(self.special_tokens.get("pad_token"))
        self.eot_token = self.eos_token_id
        if self.eot_token is None:
            self.eot_token = next((i for i in map(self.token_to_id, END_OF_TEXT_TOKENS) if i is not None), None)
        generation = _read_json(os.path.join(directory, "generation_config.json")).get("eos_token_id")
        generation = generation if isinstance(generation, list) else [generation]
        self.stop_token_ids = list(dict.fromkeys(i for i in [self.eos_token_id, *generation] if isinstance(i, int)))
        self._templates, self._single_template = _chat_templates(directory, config)

    @property
    def vocab_size(self):
        """Every id, added tokens included (len() of the transformers tokenizer)."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def chat_template(self):
        """The tokenizer's own template (str), its named templates ({name: str}), or None (CHATML_TEMPLATE is used)."""
        if not self._templates:
            return None
        if self._single_template:
            return self._templates["default"][0]
        return {name: template for name, (template, _) in self._templates.items()}

    def token_to_id(self, token):
        """The id of ``token`` (a token string, special or not), or None when the vocabulary lacks it."""
        return None if token is None else self._tok.token_to_id(token)

    def encode(self, text, add_special_tokens=True):
        """``text`` -> list[int]; ``add_special_tokens``: BOS/EOS as tokenizer.json's post-processor adds them.
        Special and added tokens written in the text are matched as tokens."""
        if not isinstance(text, str):
            raise TypeError(f"{self.name}: encode expected a str, got {type(text).__name__}\nHINT: decode bytes as "
                            "UTF-8 first; only the byte tokenizer takes bytes")
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_array(self, text, add_special_tokens=True):
        """encode() as a numpy array: uint16 when every id fits (llm.c shards), else uint32."""
        ids = self.encode(text, add_special_tokens)
        return np.asarray(ids, dtype=np.uint32 if ids and max(ids) >= 2 ** 16 else np.uint16)

    def decode(self, ids, skip_special_tokens=False):
        """Token ids (a list or numpy array) -> str; ``skip_special_tokens`` leaves out the special tokens."""
        array = np.asarray(ids)
        if array.ndim > 1:
            raise ValueError(f"{self.name}: decode expected one sequence of ids, got an array of shape {array.shape}"
                             "\nHINT: decode each row: [tok.decode(row) for row in ids]")
        ids = [int(i) for i in array.reshape(-1)]
        bad = [i for i in ids if not 0 <= i < 2 ** 32]
        if bad:
            raise ValueError(f"{self.name}: decode expected token ids >= 0, got {bad[0]}")
        text = self._tok.decode(ids, skip_special_tokens=skip_special_tokens)
        if self._clean_up:
            for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                                  (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
                text = text.replace(before, after)
        return text

    def get_chat_template(self, chat_template=None, tools=None):
        """(template source, where it came from) that apply_chat_template uses: ``chat_template`` (Jinja source,
        or the name of one of the tokenizer's named templates), else the tokenizer's ("tool_use" when tools are
        given and it has one, else "default"), else the built-in CHATML_TEMPLATE."""
        if chat_template is not None and not self._single_template and chat_template in self._templates:
            return self._templates[chat_template]
        if chat_template is not None:
            return chat_template, "the chat_template argument"
        if not self._templates:
            return CHATML_TEMPLATE, CHATML_SOURCE
        if tools is not None and "tool_use" in self._templates:
            return self._templates["tool_use"]
        if "default" not in self._templates:
            raise ChatTemplateError(f"{self.name}: expected a default chat template among the tokenizer's named "
                                    f"templates, got only {sorted(self._templates)}\nHINT: pass "
                                    "chat_template=NAME to pick one")
        return self._templates["default"]

    def apply_chat_template(self, messages, tokenize=True, add_generation_prompt=False, chat_template=None,
                            tools=None, **kwargs):
        """One conversation (a list of {"role", "content"} dicts) rendered with the model's chat template.

        Returns the ids (list[int]: the rendered text encoded with add_special_tokens=False, since the template
        writes BOS/EOS itself) when ``tokenize``, else the text (str). ``add_generation_prompt`` appends the header
        that starts the assistant's reply; ``chat_template``: Jinja source or a template name; ``tools``: JSON
        schemas; other keywords (``documents``, ``enable_thinking``, ...) are variables of the template. Equals
        transformers' apply_chat_template(..., return_dict=False)."""
        unsupported = [k for k in UNSUPPORTED_CHAT_ARGS if k in kwargs]
        if unsupported:
            raise TypeError(f"{self.name}: apply_chat_template does not take {', '.join(unsupported)} (transformers' "
                            "options)\nHINT: it returns the ids (tokenize=True) or the text (tokenize=False); pad, "
                            "truncate or continue a message on the result")
        template, source = self.get_chat_template(chat_template, tools)
        text = render_chat_template(template, messages, add_generation_prompt=add_generation_prompt, tools=tools,
                                    special_tokens=self.special_tokens, source=source, **kwargs)
        return self.encode(text, add_special_tokens=False) if tokenize else text

    def __repr__(self):
        return (f"HFTokenizer({self.path!r}, vocab_size={self.vocab_size}, bos_token_id={self.bos_token_id}, "
                f"eos_token_id={self.eos_token_id})")
