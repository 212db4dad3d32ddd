"""Run-config text to nested dicts: YAML read strictly and dotted command-line overrides merged in, both driven by
the dataclass schema of infini_train.training.config.schema (RunConfig, whose dataclass-typed fields are its sections).

    raw = load_yaml(f, RunConfig)            # duplicate keys raise; str settings keep their text (out_dir: 0755)
    apply_overrides(raw, ["train.learning_rate=3e-4", "model={n_layer: 2}"], errors, RunConfig)

Nothing here checks values against the schema beyond choosing how to read them: unknown keys and type or range
problems are left to the validation in infini_train.training.config.schema. Problems with the override text itself
(no ``=``, a setting used as a section, a section value that is not YAML) are appended to ``errors``, one line
each.
"""
from __future__ import annotations

import dataclasses
import typing
from typing import Optional

import yaml

_TEXT_TAGS = {f"tag:yaml.org,2002:{kind}" for kind in ("int", "float", "timestamp")}
_NULLS = ("null", "Null", "NULL", "~")
_BAD = object()  # an override value that was refused (its error is already recorded)


def declared_type(schema, path):
    """The annotation of dotted key ``path`` in dataclass ``schema`` (a section's dataclass for "model", ...),
    or None for an unknown key."""
    cls, parts = schema, path.split(".")
    for part in parts[:-1]:
        cls = typing.get_type_hints(cls).get(part)
        if not dataclasses.is_dataclass(cls):
            return None
    return typing.get_type_hints(cls).get(parts[-1])


def _is_text(annotation):
    return annotation in (str, Optional[str])


class _StrictLoader(yaml.SafeLoader):
    """safe_load that reports a key given twice in one mapping instead of keeping the last silently."""


def _mapping_without_duplicates(loader, node, deep=False):
    seen = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first given at line {seen[key] + 1})", key_node.start_mark)
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


def _keep_text(node, schema):
    """Re-tag as strings the plain scalars YAML would read as numbers or dates where ``schema`` (RunConfig or a
    section) declares a str setting, so ``out_dir: 0755`` stays '0755' (not 493) and 2024-01-01 stays text."""
    if not isinstance(node, yaml.MappingNode):
        return
    hints = typing.get_type_hints(schema)
    for key_node, value_node in node.value:
        name = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
        if dataclasses.is_dataclass(hints.get(name)):  # a section
            _keep_text(value_node, hints[name])
        elif (name in hints and _is_text(hints[name]) and isinstance(value_node, yaml.ScalarNode)
              and value_node.style is None and value_node.tag in _TEXT_TAGS):
            value_node.tag = "tag:yaml.org,2002:str"


def load_yaml(source, schema=None):
    """A YAML document (text, bytes or a file) -> Python values; duplicate keys raise, and str settings of
    ``schema`` keep their text as written."""
    loader = _StrictLoader(source)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if schema is not None:
            _keep_text(node, schema)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def parse_value(text):
    """A command-line value of a non-text setting as YAML (``3e-4`` stays a string here; the field's type converts
    it). Text YAML cannot parse (``@x``) is taken as a plain string."""
    if text.strip() == "":
        return ""
    try:
        return load_yaml(text)
    except yaml.YAMLError:
        return text


def _text_value(text):
    """A str setting's command-line value: the text exactly as written (``out_dir=0755`` stays '0755'), except
    that a null spelling is null and one YAML-quoted text is unquoted (``out_dir="'null'"`` is the word)."""
    if text in _NULLS:
        return None
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            return text
        return value if isinstance(value, str) else text
    return text


def _override_value(schema, key, text, errors):
    """The value of ``key=text`` by the key's declared type; _BAD after recording an error."""
    declared = declared_type(schema, key)
    if _is_text(declared):
        return _text_value(text)
    if not dataclasses.is_dataclass(declared):
        return parse_value(text)
    try:  # a section: a YAML mapping merged into it key by key
        value = load_yaml(text, declared) if text.strip() else ""
    except yaml.YAMLError as exc:
        errors.append(f"{key}: expected a YAML mapping like {key}={{{dataclasses.fields(declared)[0].name}: ...}}, "
                      f"got {text!r}, which is not valid YAML ({getattr(exc, 'problem', None) or exc})")
        return _BAD
    glued = [name for name, item in (value.items() if isinstance(value, dict) else ())
             if isinstance(name, str) and ":" in name and item is None]  # YAML reads {n_layer:2} as key "n_layer:2"
    for name in glued:
        errors.append(f"{key}.{name}: unknown key; HINT: put a space after the colon: "
                      f"{key}={{{name.replace(':', ': ', 1)}}}")
    return _BAD if glued else value


def merge(into, new):
    """Merge mapping ``new`` into ``into`` key by key, recursively (nested mappings merge, anything else replaces)."""
    for key, value in new.items():
        if isinstance(into.get(key), dict) and isinstance(value, dict):
            merge(into[key], value)
        else:
            into[key] = value


def _is_setting(schema, path):
    """Whether dotted ``path`` names a setting of ``schema`` (not a section, not unknown)."""
    declared = declared_type(schema, path)
    return declared is not None and not dataclasses.is_dataclass(declared)


def apply_overrides(raw, overrides, errors, schema):
    """Apply ``dotted.key=value`` texts to the nested dict ``raw`` in order, each value read by the type
    ``schema`` declares for its key; a mapping merges into its section key by key. Problems go to ``errors``."""
    for text in overrides:
        key, sep, value = str(text).partition("=")
        key = key.strip()
        if not sep or not key:
            errors.append(f"override {text!r}: expected dotted.key=value, e.g. train.learning_rate=3e-4")
            continue
        parts = key.split(".")
        node = raw
        for depth, part in enumerate(parts[:-1]):
            prefix = ".".join(parts[:depth + 1])
            child = node.get(part)
            if _is_setting(schema, prefix) or (child is not None and not isinstance(child, dict)):
                errors.append(f"{key}: unknown key ({prefix!r} is a setting, not a section)")
                break
            if child is None:  # a new or empty section (an unknown one is reported by the validation)
                child = node[part] = {}
            node = child
        else:
            value = _override_value(schema, key, value, errors)
            if value is _BAD:
                continue
            if isinstance(node.get(parts[-1]), dict) and isinstance(value, dict):
                merge(node[parts[-1]], value)  # model={n_layer: 2} keeps the file's other model keys
            else:
                node[parts[-1]] = value
