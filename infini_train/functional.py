"""Top-level tensor functions (it.cat, it.stack, it.matmul, it.where, ...).

Each op family lists its public functions in ``__all__``; they are gathered here, so adding an op to a
family makes it available as ``infini_train.<name>`` without touching this file.
"""
from .autograd.ops import (
    activations,
    attention,
    conversion,
    dropout,
    einsum,
    elementwise,
    embedding,
    fmod,
    indexing,
    joins,
    linear,
    logic,
    loss,
    matmul,
    normalization,
    outer,
    reduction,
    reorder,
    scan,
    scatter,
    selection,
    softmax,
    sorting,
    statistics,
    transform,
)

FAMILIES = (elementwise, logic, activations, matmul, linear, outer, softmax, normalization, loss, reduction,
            transform, joins, indexing, embedding, dropout, attention, conversion, einsum, sorting, scan, reorder,
            scatter, selection, statistics, fmod)

__all__ = []
for _family in FAMILIES:
    for _name in getattr(_family, "__all__", ()):
        globals()[_name] = getattr(_family, _name)
        __all__.append(_name)
