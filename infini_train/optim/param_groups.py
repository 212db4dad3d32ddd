"""Param groups as a state dict holds them (torch's layout), the one mapping between an optimizer's groups and their
numbered form, used by every optimizer, by ZeRO and by a run's checkpoints: the parameters are numbered across the
groups in order (or in an order the optimizer chooses: ZeRO's flat order), and each group keeps its options beside
the numbers of its parameters, ``[{"lr": 0.001, ..., "params": [0, 1]}, ...]``. A parameter can be a tensor or a
name (a checkpoint's record of the whole model's groups); ``key`` says what identifies it."""
from __future__ import annotations

import copy


def numbering(groups, order=None, key=id):
    """{key(p): number} of the parameters, numbered across ``groups`` in order (or in ``order``); a parameter listed
    twice keeps its first number."""
    index = {}
    for p in order if order is not None else (p for g in groups for p in g["params"]):
        index.setdefault(key(p), len(index))
    return index


def packed_groups(groups, index, options=None, key=id):
    """``groups`` as a state dict holds them: each group's options (copies; taken from ``options``, one dict per
    group, when given) and ``params``, the numbers ``index`` gives its parameters."""
    return [{**{k: copy.deepcopy(v) for k, v in opts.items() if k != "params"},
             "params": [index[key(p)] for p in g["params"]]}
            for g, opts in zip(groups, groups if options is None else options)]


def group_sizes(groups):
    return [len(g["params"]) for g in groups]


def paired(saved_groups, groups):
    """{saved number: parameter}: a state dict's param groups paired, group by group and in order, with ``groups``
    (as load_state_dict pairs them; the caller checks group_sizes first)."""
    return {int(i): p for s, g in zip(saved_groups, groups) for i, p in zip(s["params"], g["params"])}


def saved_entry(state, number):
    """The state a state dict holds for parameter ``number`` (keys may be ints or, from JSON, strings), or None."""
    return state.get(number, state.get(str(number)))


__all__ = ["numbering", "packed_groups", "group_sizes", "paired", "saved_entry"]
