"""The helper the range and consistency checks share: Checker collects problems on settings that passed their type
checks (a problem is reported once, at the first key it is found at), closest suggests a choice."""
from __future__ import annotations

import difflib
import math


class Checker:
    """Range checks on fields that passed the type checks."""

    def __init__(self, cfg, errors, bad):
        self.cfg, self.errors, self.bad = cfg, errors, bad

    def value(self, path):
        node = self.cfg
        for part in path.split("."):
            node = getattr(node, part)
        return node

    def ok(self, *paths):
        return not any(p in self.bad or p.split(".")[0] in self.bad for p in paths)

    def need(self, path, predicate, expected):
        if not self.ok(path):
            return
        value = self.value(path)
        if value is None:
            return
        if not predicate(value):
            self.errors.append(f"{path}: expected {expected}, got {value!r}")
            self.bad.add(path)


def closest(value, choices):
    """ " (did you mean 'bf16-mixed'?)" for a misspelt choice, or ""."""
    close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.4)
    return f" (did you mean {close[0]!r}?)" if close else ""


def finite(v):
    return math.isfinite(v)


__all__ = ["Checker", "closest", "finite"]
