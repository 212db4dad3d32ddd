"""einsum: sums of products over labelled dims, as torch.einsum.

Every operand is first brought to a canonical view: its ``...`` dims get letters of their own, repeated
letters are reduced to their diagonal, and size-1 dims are broadcast to the size the letter has elsewhere.
After that each operand has one dim per distinct letter, and both the forward and every operand's gradient
are a plain ``xp.einsum``; backward then undoes the canonical view step by step.

float16/bfloat16 operands are contracted in float32 (widened on the host, see low_precision.py) and the
result, like each gradient, is rounded once to their dtype.
"""
from __future__ import annotations

import string

from ...tensor import Tensor
from . import low_precision as lp
from ..function import Op, op_error, sum_to

__all__ = ["einsum"]

_LETTERS = string.ascii_letters


# ------------------------------------------------------------------------------------- the equation
def _parse_term(term, where):
    """Letters of one term, with "..." kept as one item; rejects anything else."""
    labels, i = [], 0
    while i < len(term):
        char = term[i]
        if char in _LETTERS:
            labels.append(char)
            i += 1
        elif char == ".":
            if term[i:i + 3] != "...":
                raise op_error("einsum", "'.' only as part of an ellipsis '...'", f"{term!r} for {where}")
            if "..." in labels:
                raise op_error("einsum", f"at most one ellipsis for {where}", repr(term))
            labels.append("...")
            i += 3
        else:
            raise op_error("einsum", "subscripts in [a-zA-Z], ',', '->' and '...'", f"{char!r} in {term!r}",
                           "write the equation like 'ij,jk->ik'")
    return labels


def _parse(equation, num_operands):
    """-> (one label list per operand, the output label list or None for implicit mode)."""
    if not isinstance(equation, str):
        raise op_error("einsum", "an equation string first", type(equation).__name__,
                       "call einsum('ij,jk->ik', a, b)")
    lhs, arrow, rhs = equation.replace(" ", "").partition("->")
    if "->" in rhs:
        raise op_error("einsum", "at most one '->'", repr(equation))
    terms = lhs.split(",")
    if len(terms) != num_operands:
        raise op_error("einsum", f"as many operands as terms in the equation ({len(terms)})",
                       f"{num_operands} operands for {equation!r}")
    inputs = [_parse_term(term, f"operand {i}") for i, term in enumerate(terms)]
    return inputs, (_parse_term(rhs, "the output") if arrow else None)


class _Plan:
    """The equation bound to the operands' shapes: each operand's dims as letters (ellipsis dims get
    unused letters), the size of every letter, and the output letters."""

    def __init__(self, equation, shapes):
        terms, output = _parse(equation, len(shapes))
        used = {c for term in terms + [output or []] for c in term if c != "..."}
        ellipsis_shape = self._ellipsis_shape(terms, shapes)
        free = [c for c in _LETTERS if c not in used]
        if len(ellipsis_shape) > len(free):
            raise op_error("einsum", f"at most {len(free)} dims covered by '...' next to these subscripts",
                           f"{len(ellipsis_shape)}")
        ellipsis = free[:len(ellipsis_shape)]
        self.dims = []
        for term, shape in zip(terms, shapes):
            covered = len(shape) - (len(term) - 1)  # how many dims this operand's "..." stands for
            dims = []
            for label in term:  # an operand's "..." dims are the trailing ones of the broadcast ellipsis
                dims.extend(ellipsis[len(ellipsis) - covered:] if label == "..." else [label])
            self.dims.append(dims)
        self.sizes = self._sizes(shapes, ellipsis, ellipsis_shape)
        self.out = self._output(terms, output, ellipsis)
        # canonical views: one dim per distinct letter, in order of first appearance
        self.unique = [list(dict.fromkeys(dims)) for dims in self.dims]

    @staticmethod
    def _ellipsis_shape(terms, shapes):
        shape = ()
        for i, (term, dims) in enumerate(zip(terms, shapes)):
            named = len(term) - ("..." in term)
            if ("..." not in term and named != len(dims)) or named > len(dims):
                raise op_error("einsum", f"one subscript per dim of operand {i} (shape {tuple(dims)})",
                               f"{named} subscripts" + (" and '...'" if "..." in term else ""),
                               "give one subscript per dim, or '...' for the dims left unnamed")
            if "..." not in term:
                continue
            at = term.index("...")
            covered = tuple(dims[at:len(dims) - (len(term) - 1 - at)])
            width = max(len(shape), len(covered))
            shape, covered = (1,) * (width - len(shape)) + shape, (1,) * (width - len(covered)) + covered
            if any(a != b and a != 1 and b != 1 for a, b in zip(shape, covered)):
                raise op_error("einsum", "the dims covered by '...' to broadcast across operands",
                               f"{covered} in operand {i} against {shape} before it")
            shape = tuple(b if a == 1 else a for a, b in zip(shape, covered))
        return shape

    def _sizes(self, shapes, ellipsis, ellipsis_shape):
        sizes = dict(zip(ellipsis, ellipsis_shape))
        for i, (dims, shape) in enumerate(zip(self.dims, shapes)):
            own = {}
            for label, n in zip(dims, shape):
                if own.setdefault(label, n) != n:
                    raise op_error("einsum", f"equal sizes for subscript {label!r}, repeated in operand {i}",
                                   f"sizes {own[label]} and {n}", "a repeated subscript takes a diagonal")
                seen = sizes.get(label)
                if seen is not None and n != seen and 1 not in (n, seen):
                    raise op_error("einsum", f"size {seen} (or 1) for subscript {label!r} as in an earlier operand",
                                   f"size {n} in operand {i}, shape {tuple(shape)}",
                                   "a subscript shared by operands must have one size (or broadcast from 1)")
                sizes[label] = n if seen in (None, 1) else seen
        return sizes

    def _output(self, terms, output, ellipsis):
        counts = {}
        for term in terms:
            for label in term:
                if label != "...":
                    counts[label] = counts.get(label, 0) + 1
        if output is None:  # implicit: ellipsis dims, then the letters used once, alphabetically
            return list(ellipsis) + sorted(label for label, n in counts.items() if n == 1)
        out = []
        for label in output:
            if label == "...":
                out.extend(ellipsis)
            elif label not in counts:
                raise op_error("einsum", "output subscripts that appear in an input", f"{label!r} only in the output")
            elif label in out:
                raise op_error("einsum", "each output subscript once", f"{label!r} more than once")
            else:
                out.append(label)
        return out


# ----------------------------------------------------------------------------------------- canonical
def _diagonal_index(xp, dims, unique, sizes):
    """Index arrays that pick (or place) the diagonal of repeated letters: dim ``d`` of the operand gets an
    arange along the canonical position of its letter, so every letter's copies advance together."""
    index = []
    for label, n in zip(dims, sizes):
        position = unique.index(label)
        index.append(xp.arange(n).reshape((1,) * position + (n,) + (1,) * (len(unique) - position - 1)))
    return tuple(index)


def _contract(xp, terms, out, *arrays):
    """xp.einsum over canonical operands. With two or more, optimize=True lets numpy pick a pairwise order
    and hand each pair to BLAS (tensordot): ~10x faster than its plain loop on matmul shapes."""
    equation = ",".join("".join(t) for t in terms) + "->" + "".join(out)
    return xp.einsum(equation, *arrays, optimize=len(arrays) > 1)


def _canonical(xp, array, dims, unique, sizes):
    if len(unique) < len(dims):
        array = array[_diagonal_index(xp, dims, unique, array.shape)]
    full = tuple(sizes[label] for label in unique)
    return array if array.shape == full else xp.broadcast_to(array, full)


class Einsum(Op):
    def __init__(self, equation):
        self.equation = equation

    def forward(self, *operands):
        dtypes = {a.dtype for a in operands}
        if len(dtypes) > 1:
            raise op_error("einsum", "operands of one dtype", ", ".join(str(a.dtype) for a in operands),
                           "cast them with .to(dtype) first")
        plan = self.plan = _Plan(self.equation, [a.shape for a in operands])
        xp = self.xp
        dtype = operands[0].dtype
        wide = lp.widen(xp, *operands)
        views = [_canonical(xp, a, d, u, plan.sizes) for a, d, u in zip(wide, plan.dims, plan.unique)]
        if dtype.kind in "biu":
            views = self._integer_views(views)
        out = _contract(xp, plan.unique, plan.out, *views)
        if len(operands) == 1 and xp.may_share_memory(out, operands[0]):
            out = out.copy()  # a pure transpose comes back as a view; ours must not alias the input
        return lp.narrow(xp, out, dtype) if dtype.kind in "fV" else out  # integer sums may give int64

    def _integer_views(self, views):
        """torch sums a letter found in one operand only with sum(), which gives int64 for integer and
        bool tensors; contractions between operands keep the dtype (and are not defined for bool)."""
        plan = self.plan
        if any(label not in plan.out and sum(label in v for v in plan.unique) == 1
               for u in plan.unique for label in u):
            return [v.astype("int64") for v in views]
        if views[0].dtype.kind == "b" and any(label not in plan.out for u in plan.unique for label in u):
            raise op_error("einsum", "integer or floating operands for a contraction", "bool operands",
                           "cast them with .long() or .float() first")
        return views

    def setup_context(self, inputs, output):
        self.save_for_backward(*inputs)

    def backward(self, g):
        xp, plan = self.xp, self.plan
        g, *operands = lp.widen(xp, g, *self.saved_arrays)
        views = [_canonical(xp, a, d, u, plan.sizes) for a, d, u in zip(operands, plan.dims, plan.unique)]
        return tuple(lp.narrow(xp, self._operand_grad(g, views, k), self._input_dtypes[k]) if need else None
                     for k, need in enumerate(self.needs_input_grad))

    def backward_graph(self, g):
        """Each operand's gradient as an einsum of g and the other operands (on Tensors, recorded): the equation
        written with the plan's letters (``...`` dims have letters of their own there); letters of the operand
        alone are broadcast back, size-1 dims summed, and a repeated letter's gradient placed on its diagonal."""
        from .indexing import ScatterBack

        plan, operands = self.plan, self.saved_tensors
        grads = []
        for k, need in enumerate(self.needs_input_grad):
            if not need:
                grads.append(None)
                continue
            dims, unique, shape = plan.dims[k], plan.unique[k], self._input_shapes[k]
            others = [j for j in range(len(operands)) if j != k]
            reached = [label for label in unique if label in plan.out or any(label in plan.dims[j] for j in others)]
            equation = ",".join(["".join(plan.out)] + ["".join(plan.dims[j]) for j in others]) + "->" + \
                "".join(reached)
            grad = einsum(equation, g, *(operands[j] for j in others))
            grad = grad.reshape(tuple(plan.sizes[label] if label in reached else 1 for label in unique))
            grad = grad.expand(tuple(plan.sizes[label] for label in unique))
            own = dict(zip(dims, shape))
            grad = sum_to(grad, tuple(own[label] for label in unique))  # size-1 dims broadcast in forward
            if len(unique) != len(dims):  # repeated letters read a diagonal: the gradient goes back onto it
                grad = ScatterBack(_diagonal_index(self.xp, dims, unique, shape), shape, False).apply(grad)
            grads.append(grad)
        return tuple(grads)

    def _operand_grad(self, g, views, k):
        xp, plan = self.xp, self.plan
        unique = plan.unique[k]
        others = [j for j in range(len(views)) if j != k]
        reached = [label for label in unique if label in plan.out or any(label in plan.unique[j] for j in others)]
        terms = [plan.out] + [plan.unique[j] for j in others]
        grad = _contract(xp, terms, reached, g, *(views[j] for j in others))
        # letters of this operand alone were summed away: the output is flat along them, so is the gradient
        full = tuple(plan.sizes[label] for label in unique)
        grad = xp.broadcast_to(grad.reshape(tuple(n if label in reached else 1 for label, n in zip(unique, full))),
                               full)
        # size-1 dims broadcast in forward gather the gradient of every position they stood for
        own = {label: n for label, n in zip(plan.dims[k], self._input_shapes[k])}
        summed = tuple(i for i, label in enumerate(unique) if own[label] == 1 and full[i] != 1)
        if summed:
            grad = grad.sum(axis=summed, keepdims=True)
        if len(unique) == len(plan.dims[k]):
            return grad
        # repeated letters read a diagonal: their gradient goes back onto it, zero elsewhere
        shape = self._input_shapes[k]
        placed = xp.zeros(shape, g.dtype)
        placed[_diagonal_index(xp, plan.dims[k], unique, shape)] = grad
        return placed


def einsum(equation, *operands):
    """Sum of products of ``operands`` over the subscripts of ``equation``, as torch.einsum.

    ``'ij,jk->ik'`` is a matrix product; without ``->`` the output holds the subscripts used once, in
    alphabetical order. ``...`` stands for the leading dims and broadcasts across operands; a subscript
    repeated in one operand takes its diagonal (``'ii->i'``); subscripts missing from the output are summed.
    The operands may also come as one list: ``einsum('ij,jk', [a, b])``.
    """
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not operands:
        raise op_error("einsum", "at least one operand", "none", "call einsum('ij,jk->ik', a, b)")
    for i, a in enumerate(operands):
        if not isinstance(a, Tensor):
            raise op_error("einsum", "Tensor operands", f"{type(a).__name__} at position {i}",
                           "wrap values with infini_train.tensor(...)")
    return Einsum(equation).apply(*operands)
