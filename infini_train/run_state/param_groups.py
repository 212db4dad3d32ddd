"""The whole model's optimizer param groups by parameter name, as a checkpoint records them: a sharded checkpoint's
state.json lists each group's options and parameter names; a whole checkpoint's optimizer state numbers the
parameters as torch's layout does (it.optim.param_groups). The names are the one-process model's, whatever part of it
a rank holds, so either record loads under any layout."""
from __future__ import annotations

from ..optim.param_groups import numbering, packed_groups
from .tree import flatten_state, unflatten_state


def by_name(name):
    return name


def record(optimizer_groups, group_names):
    """state.json's record of the param groups: each group's options (``optimizer_groups``: the optimizer's groups,
    whose options every rank shares) and the names of its parameters in the whole model (``group_names``)."""
    options = [{k: v for k, v in g.items() if k != "params"} for g in optimizer_groups]
    return [{"options": flatten_state(opts)[1], "params": list(names)} for opts, names in zip(options, group_names)]


def options(saved_group):
    """A recorded param group's options as the optimizer had them (tuples kept)."""
    return unflatten_state(saved_group["options"], {})


def numbered(saved_groups, order=None):
    """({parameter name: number}, param groups in torch's layout) of recorded param groups: the parameters numbered
    across the groups in order, as a one-process optimizer's state dict numbers them, or in ``order`` (names: the
    numbering of the optimizer that wrote a whole checkpoint, e.g. ZeRO's flat order)."""
    index = numbering(saved_groups, order=order, key=by_name)
    return index, packed_groups(saved_groups, index, options=[options(g) for g in saved_groups], key=by_name)


def names_by_number(saved_groups, group_names):
    """{number: parameter name} of a whole checkpoint's optimizer state: its param groups' numbers paired, group by
    group and in order, with the whole model's names (None when the group sizes differ: another model)."""
    if [len(g["params"]) for g in saved_groups] != [len(names) for names in group_names]:
        return None
    return {int(i): n for g, names in zip(saved_groups, group_names) for i, n in zip(g["params"], names)}


__all__ = ["record", "options", "numbered", "names_by_number"]
