"""Containers: Sequential, ModuleList, ModuleDict."""
from __future__ import annotations

from collections import OrderedDict

from .module import Module, _add_indent


def _index(i, n, kind):
    i = int(i)
    if not -n <= i < n:
        raise IndexError(f"{kind}: index {i} out of range for {n} modules")
    return i + n if i < 0 else i


class Sequential(Module):
    """Runs its modules in order, each on the previous one's output. ``Sequential(m0, m1, ...)`` names them
    "0", "1", ...; ``Sequential(OrderedDict(name=module, ...))`` keeps the given names."""

    def __init__(self, *modules):
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], (dict, OrderedDict)):
            for name, m in modules[0].items():
                self.add_module(name, m)
        else:
            for i, m in enumerate(modules):
                self.add_module(str(i), m)

    def forward(self, x):
        for m in self._modules.values():
            x = m(x)
        return x

    def __getitem__(self, i):
        items = list(self._modules.items())
        if isinstance(i, slice):
            return Sequential(OrderedDict(items[i]))
        return items[_index(i, len(items), "Sequential")][1]

    def __setitem__(self, i, module):
        key = list(self._modules)[_index(i, len(self._modules), "Sequential")]
        self.add_module(key, module)

    def __delitem__(self, i):
        keys = list(self._modules)
        for key in (keys[i] if isinstance(i, slice) else [keys[_index(i, len(keys), "Sequential")]]):
            del self._modules[key]

    def append(self, module):
        self.add_module(str(len(self._modules)), module)
        return self

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())


class ModuleList(Module):
    """A list of modules whose parameters are registered (names "0", "1", ...). It has no forward."""

    def __init__(self, modules=()):
        super().__init__()
        self.extend(modules)

    def append(self, module):
        self.add_module(str(len(self._modules)), module)
        return self

    def extend(self, modules):
        for m in modules:
            self.append(m)
        return self

    def insert(self, index, module):
        mods = list(self._modules.values())
        mods.insert(index, module)
        self._renumber(mods)

    def _renumber(self, mods):
        self._modules.clear()
        for i, m in enumerate(mods):
            self._modules[str(i)] = m

    def __getitem__(self, i):
        mods = list(self._modules.values())
        if isinstance(i, slice):
            return ModuleList(mods[i])
        return mods[_index(i, len(mods), "ModuleList")]

    def __setitem__(self, i, module):
        self.add_module(str(_index(i, len(self._modules), "ModuleList")), module)

    def __delitem__(self, i):
        mods = list(self._modules.values())
        del mods[i if isinstance(i, slice) else _index(i, len(mods), "ModuleList")]
        self._renumber(mods)

    def __iadd__(self, modules):
        return self.extend(modules)

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __repr__(self):  # torch's compact form: runs of identical entries print once, "(0-11): 12 x Block(...)"
        reprs = [repr(m) for m in self]
        if not reprs:
            return "ModuleList()"
        runs = []  # [first index, last index, repr]
        for i, r in enumerate(reprs):
            if runs and runs[-1][2] == r:
                runs[-1][1] = i
            else:
                runs.append([i, i, r])
        lines = [_add_indent(f"({a}): {r}" if a == b else f"({a}-{b}): {b - a + 1} x {r}") for a, b, r in runs]
        return type(self).__name__ + "(\n  " + "\n  ".join(lines) + "\n)"


class ModuleDict(Module):
    """A dict of modules whose parameters are registered under their keys (insertion order kept)."""

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def update(self, modules):
        for name, m in (modules.items() if hasattr(modules, "items") else modules):
            self.add_module(name, m)

    def __getitem__(self, name):
        return self._modules[name]

    def __setitem__(self, name, module):
        self.add_module(name, module)

    def __delitem__(self, name):
        del self._modules[name]

    def pop(self, name):
        return self._modules.pop(name)

    def clear(self):
        self._modules.clear()

    def __contains__(self, name):
        return name in self._modules

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)

    def keys(self):
        return self._modules.keys()

    def values(self):
        return self._modules.values()

    def items(self):
        return self._modules.items()
