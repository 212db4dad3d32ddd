"""The autograd graph as a picture: Graphviz DOT text in the style of torchviz's ``make_dot``.

Nodes:
- one per Function reachable from the output(s), labelled with the op's name as the project reports it
  (``fn.name``: ``Matmul``, ``Add``, ``Tanh``, ``AccumulateGrad``; the class name, no ``Backward`` suffix);
- one per leaf tensor that requires grad (light blue), labelled with its name from ``params`` (when given),
  its shape and dtype; it points into its ``AccumulateGrad``;
- one per output tensor (green), pointed to by its ``grad_fn``;
- with ``show_saved=True``, one per array a Function saved for backward (orange, an undirected edge).

Edges follow ``next_functions``, drawn in the forward direction as torchviz does: from the input's node to the
Function that consumed it, one edge per recorded input (``x * x`` gives two parallel edges). The traversal is a
loop, never a recursion, so graphs thousands of ops deep are fine, and a subgraph shared by several consumers
appears once.

``to_dot`` needs nothing beyond the package; ``render`` and ``to_graphviz`` use the ``graphviz`` Python package
(``pip install 'infini_train[graph]'``) and, to draw, Graphviz's ``dot`` program.
"""
from __future__ import annotations

import os

from ..atomic_file import write_text_atomically
from .accumulate import AccumulateGrad
from .saved_hooks import saved_tensors_hooks  # noqa: F401  (it.autograd.graph.saved_tensors_hooks, as torch's)
from .save_on_cpu import save_on_cpu  # noqa: F401  (it.autograd.graph.save_on_cpu, as torch's)

_GRAPH_ATTRS = 'node [align=left fontname=monospace fontsize=10 height=0.2 ranksep=0.1 shape=box style=filled]'
_FILL = {"fn": "lightgrey", "leaf": "lightblue", "output": "darkolivegreen1", "saved": "orange"}
_MACHINERY = {"device", "xp", "next_functions", "needs_input_grad", "tensor", "is_view", "retain_graph",
              "differentiable", "cross_device", "output_devices", "backward_graph"}
_INSTALL_HINT = "pip install 'infini_train[graph]'"


def quote(text):
    """``text`` as a DOT double-quoted string (backslashes and quotes escaped, newlines as DOT's ``\\n``)."""
    text = str(text).replace("\\", "\\\\").replace('"', '\\"')
    return '"' + text.replace("\r\n", "\n").replace("\r", "\n").replace("\n", "\\n") + '"'


def _tensor_class():
    from ..tensor import Tensor
    return Tensor


def _outputs(tensor_or_tensors):
    Tensor = _tensor_class()
    items = [tensor_or_tensors] if isinstance(tensor_or_tensors, Tensor) else tensor_or_tensors
    if not isinstance(items, (list, tuple)) or not items or not all(isinstance(t, Tensor) for t in items):
        got = (type(items).__name__ if not isinstance(items, (list, tuple)) else
               f"an empty {type(items).__name__}" if not items else
               f"a {type(items).__name__} of {', '.join(sorted({type(t).__name__ for t in items}))}")
        raise TypeError(f"autograd.graph.to_dot: expected a Tensor or a non-empty list of Tensors, got {got}\n"
                        "HINT: pass the output of the forward pass, e.g. to_dot(loss)")
    for i, t in enumerate(items):
        if t.grad_fn is None and not t.requires_grad:
            raise ValueError(f"autograd.graph.to_dot: output {i} (shape {tuple(t.shape)}) has no autograd graph "
                             "(grad_fn is None and requires_grad is False)\nHINT: compute it with grad enabled "
                             "(outside no_grad / inference_mode) from tensors that require grad")
    return items


def _names(params):
    """id(tensor) -> name, from a mapping name -> Tensor or an iterable of (name, Tensor) pairs."""
    if params is None:
        return {}
    Tensor = _tensor_class()
    pairs = params.items() if hasattr(params, "items") else params
    names = {}
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[1], Tensor)):
            raise TypeError(f"autograd.graph.to_dot: params: expected a dict name -> Tensor (or (name, Tensor) "
                            f"pairs), got an entry {type(pair).__name__}\n"
                            "HINT: pass dict(model.named_parameters())")
        names.setdefault(id(pair[1]), str(pair[0]))
    return names


def _describe(name, shape, dtype):
    lines = [name] if name else []
    lines.append(str(tuple(int(n) for n in shape)))
    lines.append(str(dtype))
    return "\n".join(lines)


def _attr_text(value, max_chars):
    simple = (int, float, bool, str, type(None))
    if isinstance(value, simple) or (isinstance(value, (tuple, list)) and all(isinstance(v, simple) for v in value)):
        text = repr(value)
        return text if len(text) <= max_chars else text[:max_chars - 3] + "..."
    return None


def _fn_label(fn, show_attrs, max_attr_chars):
    label = fn.name
    if not show_attrs:
        return label
    lines = []
    for key, value in vars(fn).items():
        if key.startswith("_") or key in _MACHINERY or key.startswith(("dependencies_", "grad_outputs")):
            continue
        text = _attr_text(value, max_attr_chars)
        if text is not None:
            lines.append(f"{key}: {text}")
    return "\n".join([label, "-" * max(len(label), 8), *lines]) if lines else label


class _Builder:
    """Collects nodes and edges; node ids are ``n0, n1, ...`` in discovery order, so the text is deterministic."""

    def __init__(self):
        self.ids = {}  # id(object) -> node id
        self.keep = []  # the objects behind self.ids (their ids stay unique while listed)
        self.nodes = []
        self.edges = []

    def node(self, obj, label, kind):
        key = id(obj)
        if key in self.ids:
            return self.ids[key], False
        nid = self.ids[key] = f"n{len(self.ids)}"
        self.keep.append(obj)
        self.nodes.append(f"\t{nid} [label={quote(label)} fillcolor={_FILL[kind]}]")
        return nid, True

    def edge(self, src, dst, undirected=False):
        self.edges.append(f"\t{src} -> {dst}" + (" [dir=none]" if undirected else ""))

    def text(self):
        return "\n".join(["digraph {", "\t" + _GRAPH_ATTRS, *self.nodes, *self.edges, "}"]) + "\n"


def to_dot(tensor_or_tensors, params=None, show_saved=False, show_attrs=False, max_attr_chars=50):
    """Graphviz DOT text of the autograd graph that produced ``tensor_or_tensors`` (a Tensor or a list of them).

    ``params``: a dict name -> Tensor (e.g. ``dict(model.named_parameters())``) naming the leaf nodes; leaves
    not in it show their shape and dtype only. ``show_saved``: also draw the arrays each Function saved for
    backward (none after a backward without retain_graph, which frees them). ``show_attrs``: list each
    Function's plain attributes (dim, keepdim, shape, ...) under its name, each cut to ``max_attr_chars``.
    """
    outputs = _outputs(tensor_or_tensors)
    names = _names(params)
    g = _Builder()
    stack = []

    def function_node(fn):
        nid, new = g.node(fn, _fn_label(fn, show_attrs, max_attr_chars), "fn")
        if new:
            stack.append((fn, nid))
        return nid

    for t in outputs:
        out_id, new = g.node(t, _describe(names.get(id(t), ""), t.shape, t.dtype), "output")
        if new and t.grad_fn is not None:
            g.edge(function_node(t.grad_fn), out_id)
    while stack:
        fn, nid = stack.pop()
        if isinstance(fn, AccumulateGrad):
            leaf = fn.tensor
            leaf_id, _ = g.node(leaf, _describe(names.get(id(leaf), ""), leaf.shape, leaf.dtype), "leaf")
            g.edge(leaf_id, nid)
        for producer, _index in fn.next_functions:
            if producer is not None:
                g.edge(function_node(producer), nid)
        if show_saved:
            for entry in fn._saved or ():
                if entry is None:
                    continue
                array = entry[0]  # one node per array, however many Functions saved it
                saved_id, _ = g.node(array, _describe("saved", array.shape, array.dtype), "saved")
                g.edge(saved_id, nid, undirected=True)
    return g.text()


def _graphviz(caller):
    try:
        import graphviz
    except ImportError:
        raise ImportError(f"autograd.graph.{caller}: needs the graphviz Python package, which is not installed\n"
                          f"HINT: {_INSTALL_HINT} (drawing also needs Graphviz's dot program, e.g. "
                          "apt install graphviz); to_dot() works without either") from None
    return graphviz


def to_graphviz(tensor_or_tensors, params=None, show_saved=False, show_attrs=False, max_attr_chars=50):
    """The graph as a ``graphviz.Source`` (shows itself in Jupyter; ``.render()``/``.pipe()`` draw it)."""
    graphviz = _graphviz("to_graphviz")
    return graphviz.Source(to_dot(tensor_or_tensors, params, show_saved, show_attrs, max_attr_chars))


def render(tensor_or_tensors, path, format="svg", params=None, show_saved=False, show_attrs=False,
           max_attr_chars=50):
    """Draw the graph into the file ``path`` (exactly that name) in ``format`` (svg, png, pdf, ... any Graphviz
    output format; ``dot`` writes the DOT text and needs no Graphviz). Written atomically; returns ``path``."""
    text = to_dot(tensor_or_tensors, params, show_saved, show_attrs, max_attr_chars)
    if format == "dot":
        data = text.encode()
    else:
        graphviz = _graphviz("render")
        if format not in graphviz.FORMATS:
            raise ValueError(f"autograd.graph.render: format: expected a Graphviz output format (svg, png, pdf, "
                             f"dot, ...), got {format!r}\nHINT: one of {', '.join(sorted(graphviz.FORMATS))}")
        try:
            data = graphviz.Source(text).pipe(format=format)
        except graphviz.ExecutableNotFound:
            raise RuntimeError("autograd.graph.render: Graphviz's dot program was not found on PATH\n"
                               "HINT: install Graphviz (apt install graphviz, brew install graphviz or conda install "
                               "graphviz), or write the text with format='dot' / to_dot()") from None
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return write_text_atomically(path, data)
