"""MkDocs hook: the configuration reference (docs/reference/config.md) generated from the run config's schema at
build time, so that it lists exactly the keys a run accepts. The page's hand-written text holds the MARKER line,
which is replaced by one table per section (infini_train.training.config.reference walks the sections the way the
loader does); a page without the marker fails the build."""
from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PAGE = "reference/config.md"
MARKER = "<!-- config-reference -->"

TITLES = {"": "Top level"}
INTROS = {  # the sections whose dataclass docstring speaks to the code rather than to a config's author
    "": "Where the run writes, how it resumes, where it runs and in what precision.",
    "model": "The model: `model.arch` (one of the registered archs), a preset of that arch (`model.preset`) and/or "
             "explicit keys, which override the preset's values (a run prints a warning for each that differs), "
             "and without a preset the arch's defaults. The keys every arch takes have GPT-2's names (`n_embd`, "
             "`n_layer`, `n_head`, `block_size`, `bias`); each arch maps them onto its own model config. With "
             "`model.pretrained` the pretrained model's own config decides everything but `dropout`.",
}


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        from mkdocs.exceptions import PluginError

        raise PluginError(f"{PAGE}: the line {MARKER} (where the generated reference goes) is missing")
    return markdown.replace(MARKER, reference_markdown())


def reference_markdown():
    """The generated part of the page: a table of keys per section, and for the model section the keys by arch,
    what a null key means for each arch and each arch's presets."""
    if ROOT not in sys.path:  # the package of this checkout, whichever one is installed (mkdocs restores sys.path
        sys.path.insert(0, ROOT)  # after loading the hooks, so this is done when the page is built)
    from infini_train.training.config.reference import arch_defaults, arch_presets, sections, settings

    rows = settings()
    parts = []
    for section, cls in sections().items():
        keys = [s for s in rows if s.section == section]
        title = TITLES.get(section, section)
        parts.append(f"## {title} {{ #{section or 'top-level'} }}\n")
        parts.append((INTROS[section] if section in INTROS else _prose(cls.__doc__)) + "\n")
        if section == "model":
            shared = [s for s in keys if not s.archs]
            parts.append("Keys every arch takes:\n")
            parts.append(_table(shared))
            parts.append("\nKeys only some archs take (any other arch refuses them, naming the archs that take "
                         "them):\n")
            parts.append(_table([s for s in keys if s.archs], archs=True))
            parts.append(_arch_tables(arch_defaults(), arch_presets()))
        else:
            parts.append(_table(keys))
        parts.append("")
    return "\n".join(parts)


def value_text(value):
    """A default as it would be written in a config file: null, true, 8, 0.001, runs/default, \"\"."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if value else '""'
    if isinstance(value, list):
        return "[" + ", ".join(value_text(v) for v in value) + "]"
    return repr(value)


def _code(text):
    """``text`` as a code span (a pipe inside one does not break a table's row)."""
    text = str(text)
    return f"``{text}``" if "`" in text else f"`{text}`"


def _escape(text, cell=True):
    """Text for the page (in a table cell when ``cell``): its code spans as they are, the rest with no Markdown
    emphasis, links, HTML or (in a cell) column breaks."""
    parts = " ".join(text.split()).replace("``", "`").split("`")
    for i in range(0, len(parts), 2):  # outside the code spans
        for ch in "\\*[]" + ("|" if cell else ""):
            parts[i] = parts[i].replace(ch, "\\" + ch)
        parts[i] = parts[i].replace("<", "&lt;")
    return "`".join(parts)  # (a pipe inside a code span does not break a table's row)


def _table(keys, archs=False):
    head = "| Key | Type | Default | Allowed | Description |" + (" Archs |" if archs else "")
    rule = "|---|---|---|---|---|" + ("---|" if archs else "")
    lines = [head, rule]
    for s in keys:
        allowed = _escape(s.allowed) if s.allowed else ("true, false" if s.type.startswith("bool") else "")
        row = (f'| <a id="{s.key}"></a>{_code(s.key)} | {s.type} | {_code(value_text(s.default))} | '
               f"{allowed} | {_escape(s.doc)} |")
        if archs:
            row += " " + ", ".join(s.archs) + " |"
        lines.append(row)
    return "\n".join(lines) + "\n"


def _arch_tables(defaults, presets):
    archs = list(defaults)
    keys = list(dict.fromkeys(k for values in defaults.values() for k in values))
    lines = ["\n### What null means, by arch\n",
             "A model key left null takes the preset's value (with `model.preset`), else the arch's default below "
             "(`train.py --print-config` shows the values a run resolves); a dash: the arch does not take the key.\n",
             "| Key | " + " | ".join(f"`{a}`" for a in archs) + " |",
             "|---|" + "---|" * len(archs)]
    for key in keys:
        cells = [_code(value_text(defaults[a][key])) if key in defaults[a] else "-" for a in archs]
        lines.append(f"| `model.{key}` | " + " | ".join(cells) + " |")
    lines += ["\n### Presets\n", "| Arch | `model.preset` |", "|---|---|"]
    lines += [f"| `{a}` | " + ", ".join(_code(p) for p in presets[a]) + " |" for a in presets]
    return "\n".join(lines) + "\n"


def _prose(doc):
    """A section dataclass's docstring as one paragraph of Markdown."""
    return _escape(doc or "", cell=False)
