"""The configuration reference (docs/reference/config.md) is generated from the config schema when the site is
built: every key a run accepts appears in it with its type and default, and nothing else does."""
import dataclasses
import importlib.util
import os
import re
import typing
from types import SimpleNamespace

import yaml

from infini_train.models import registry
from infini_train.training.config import SECTIONS, RunConfig, model_config_class

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOOK = os.path.join(REPO, "docs", "hooks", "config_reference.py")
PAGE = os.path.join(REPO, "docs", "reference", "config.md")


def _hook():
    spec = importlib.util.spec_from_file_location("config_reference_hook", HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _schema_keys():
    """{dotted key: default} walked as the loader builds a RunConfig: its own keys, then each section's dataclass
    (the model's with the keys of the registered archs)."""
    keys = {}
    for f in dataclasses.fields(RunConfig):
        if f.name in SECTIONS:
            cls = model_config_class() if f.name == "model" else SECTIONS[f.name]
            for g in dataclasses.fields(cls):
                keys[f"{f.name}.{g.name}"] = g.default
        else:
            keys[f.name] = f.default
    return keys


def _written(value):
    """A default as a config file writes it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return value or '""'
    return repr(value)


def _rendered_page():
    hook = _hook()
    with open(PAGE) as f:
        text = f.read()
    page = SimpleNamespace(file=SimpleNamespace(src_uri="reference/config.md"))
    return hook.on_page_markdown(text, page=page, config=None, files=None)


def test_every_schema_key_is_in_the_reference_with_its_default():
    markdown = _rendered_page()
    rows = {m.group(1): line for line in markdown.splitlines()
            for m in [re.match(r'\| <a id="([\w.]+)"></a>', line)] if m}
    keys = _schema_keys()
    assert len(keys) > 80
    missing = sorted(set(keys) - set(rows))
    assert not missing, f"keys missing from the configuration reference: {missing}"
    assert not sorted(set(rows) - set(keys)), "the reference lists keys the schema does not have"
    for key, default in keys.items():
        cells = [c.strip() for c in rows[key].split(" | ")]
        assert f"`{_written(default)}`" == cells[2], f"{key}: default {default!r}, the reference says {cells[2]}"


def test_the_reference_gives_types_doc_lines_and_allowed_values():
    markdown = _rendered_page()
    hints = typing.get_type_hints(type(RunConfig().train))
    assert hints["batch_size"] is int
    row = next(line for line in markdown.splitlines() if '<a id="train.batch_size">' in line)
    assert "| int |" in row and "an integer >= 1" in row and "sequences per micro-batch" in row
    row = next(line for line in markdown.splitlines() if '<a id="precision">' in line)
    assert "fp32, bf16-mixed, fp16-mixed" in row
    row = next(line for line in markdown.splitlines() if '<a id="model.num_experts">' in line)
    assert "int or null" in row and "qwen3_moe, mixtral" in row


def test_the_model_section_lists_each_arch_its_defaults_and_presets():
    markdown = _rendered_page()
    for arch in registry.archs():
        assert f"| `{arch}` |" in markdown, arch
        for preset in registry.section(arch).presets():
            assert f"`{preset}`" in markdown, (arch, preset)
    assert re.search(r"\| `model.n_layer` \| `12` \|", markdown)  # gpt2's default depth


def test_the_site_builds_the_page_through_the_hook():
    with open(os.path.join(REPO, "mkdocs.yml")) as f:
        config = yaml.safe_load(f.read().replace("!!python/name:", ""))
    assert "docs/hooks/config_reference.py" in config["hooks"]
    with open(PAGE) as f:
        assert f.read().count(_hook().MARKER) == 1
