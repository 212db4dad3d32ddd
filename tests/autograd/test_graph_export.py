"""it.autograd.graph: the DOT text parsed back with pydot has exactly the graph's nodes and edges (counted by hand
for a small expression and by an independent traversal for GPT-2), leaf names from params, escaped labels, deep
graphs without recursion, and render() through Graphviz (or a clear error when it is missing)."""
import builtins
import os
import re
import shutil

import numpy as np
import pytest

import infini_train as it
from infini_train.autograd import AccumulateGrad
from infini_train.autograd.graph import quote, render, to_dot, to_graphviz
from infini_train.models.gpt2 import GPT2, GPT2Config

pydot = pytest.importorskip("pydot")
pytestmark = pytest.mark.filterwarnings("ignore:'setParseAction' deprecated")  # pydot 4.0.1 on pyparsing 3.3


def unquote(text):
    """A DOT double-quoted string back to its text (the inverse of graph.quote)."""
    assert text[0] == '"' and text[-1] == '"', text
    return re.sub(r'\\(.)', lambda m: "\n" if m.group(1) == "n" else m.group(1), text[1:-1])


def parse(dot):
    """(nodes: id -> {label, fillcolor}, edges: [(src, dst, attrs)]) of the DOT text, read by pydot."""
    graphs = pydot.graph_from_dot_data(dot)
    assert graphs is not None and len(graphs) == 1, "pydot could not parse the DOT text"
    nodes = {}
    for n in graphs[0].get_nodes():
        if n.get_name() in ("node", "edge", "graph"):  # default-attribute statements
            continue
        assert n.get_name() not in nodes, f"node {n.get_name()} declared twice"
        nodes[n.get_name()] = {"label": unquote(n.get_label()), "fillcolor": n.get("fillcolor")}
    edges = [(e.get_source(), e.get_destination(), e.get_attributes()) for e in graphs[0].get_edges()]
    for src, dst, _ in edges:
        assert src in nodes and dst in nodes, (src, dst)
    return nodes, edges


def walk(outputs):
    """An independent count of the graph: distinct Functions, leaves, outputs, and the edges to_dot must draw."""
    fns, leaves, stack = {}, {}, [t.grad_fn for t in outputs if t.grad_fn is not None]
    edges = sum(1 for t in outputs if t.grad_fn is not None)
    while stack:
        fn = stack.pop()
        if id(fn) in fns:
            continue
        fns[id(fn)] = fn
        if isinstance(fn, AccumulateGrad):
            leaves[id(fn.tensor)] = fn.tensor
            edges += 1
        for producer, _ in fn.next_functions:
            if producer is not None:
                edges += 1
                stack.append(producer)
    return len(fns), len(leaves), edges


def by_label(nodes, first_line):
    return [nid for nid, n in nodes.items() if n["label"].split("\n")[0] == first_line]


def small():
    it.manual_seed(0)
    x = it.randn(2, 3, requires_grad=True)
    w = it.randn(3, 4, requires_grad=True)
    b = it.randn(4, requires_grad=True)
    return x, w, b, (x @ w + b).tanh().sum()


def test_small_expression_has_the_nodes_and_edges_counted_by_hand():
    x, w, b, y = small()
    nodes, edges = parse(to_dot(y, params={"x": x, "w": w, "b": b}))
    # Sum, Tanh, Add, Matmul, 3 AccumulateGrad; leaves x, w, b; the output
    assert len(nodes) == 11
    # Tanh->Sum, Add->Tanh, Matmul->Add, Acc(b)->Add, Acc(x)->Matmul, Acc(w)->Matmul, 3 leaf->Acc, Sum->output
    assert len(edges) == 10
    assert sorted(n["label"].split("\n")[0] for n in nodes.values() if n["fillcolor"] == "lightgrey") == [
        "AccumulateGrad", "AccumulateGrad", "AccumulateGrad", "Add", "Matmul", "Sum", "Tanh"]
    labels = {n["label"] for n in nodes.values() if n["fillcolor"] == "lightblue"}
    assert labels == {"x\n(2, 3)\nfloat32", "w\n(3, 4)\nfloat32", "b\n(4,)\nfloat32"}
    out = [nid for nid, n in nodes.items() if n["fillcolor"] == "darkolivegreen1"]
    assert [nodes[n]["label"] for n in out] == ["()\nfloat32"]

    def one(label):
        (nid,) = by_label(nodes, label)
        return nid

    pairs = {(nodes[s]["label"].split("\n")[0], nodes[d]["label"].split("\n")[0]) for s, d, _ in edges}
    assert pairs == {("Sum", "()"), ("Tanh", "Sum"), ("Add", "Tanh"), ("Matmul", "Add"), ("AccumulateGrad", "Add"),
                     ("AccumulateGrad", "Matmul"), ("x", "AccumulateGrad"), ("w", "AccumulateGrad"),
                     ("b", "AccumulateGrad")}
    # b's AccumulateGrad feeds Add; x's and w's feed Matmul
    acc_of = {nodes[s]["label"].split("\n")[0]: d for s, d, _ in edges if nodes[d]["label"] == "AccumulateGrad"}
    assert (acc_of["b"], one("Add")) in {(s, d) for s, d, _ in edges}
    assert (acc_of["x"], one("Matmul")) in {(s, d) for s, d, _ in edges}


def test_counts_match_an_independent_traversal_and_a_reused_input_gives_parallel_edges():
    x, w, b, _ = small()
    h = x @ w
    y = (h * h + h.sigmoid()).mean()  # h feeds three consumers: one Matmul node, three edges out of it
    nodes, edges = parse(to_dot(y))
    n_fn, n_leaf, n_edges = walk([y])
    assert len(nodes) == n_fn + n_leaf + 1
    assert len(edges) == n_edges
    (mm,) = by_label(nodes, "Matmul")
    assert sum(1 for s, _, _ in edges if s == mm) == 3
    (mul,) = by_label(nodes, "Mul")
    assert sum(1 for s, d, _ in edges if (s, d) == (mm, mul)) == 2
    assert len(by_label(nodes, "(2, 3)")) == 1  # an unnamed leaf: shape and dtype only


def test_gpt2_loss_graph_counts_names_and_no_duplicates():
    it.manual_seed(0)
    model = GPT2(GPT2Config(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32))
    rng = np.random.default_rng(0)
    idx = rng.integers(0, 64, size=(2, 16))
    _, loss = model(it.tensor(idx), targets=it.tensor(np.roll(idx, -1, axis=1)))
    params = dict(model.named_parameters())
    nodes, edges = parse(to_dot(loss, params=params))
    n_fn, n_leaf, n_edges = walk([loss])
    assert len(nodes) == n_fn + n_leaf + 1
    assert len(edges) == n_edges
    leaf_names = sorted(n["label"].split("\n")[0] for n in nodes.values() if n["fillcolor"] == "lightblue")
    assert leaf_names == sorted(params)  # every parameter once, by name (a tied weight is one leaf)
    assert len(by_label(nodes, "AccumulateGrad")) == len(params)
    # one node per Function: as many Function nodes as distinct Functions, however often a subgraph is reused
    assert sum(1 for n in nodes.values() if n["fillcolor"] == "lightgrey") == n_fn
    # the text is deterministic: the same graph gives the same DOT
    assert to_dot(loss, params=params) == to_dot(loss, params=params)


def test_two_thousand_op_chain_without_recursion():
    x = it.randn(3, requires_grad=True)
    y = x
    for _ in range(2000):
        y = y * 1.0001
    nodes, edges = parse(to_dot(y, params={"x": x}))
    assert len(nodes) == 2000 + 3  # Muls, AccumulateGrad, x, the output
    assert len(edges) == 2000 + 1 + 1  # Mul chain (incl. AccumulateGrad -> first Mul), x -> Acc, last Mul -> output
    assert len(by_label(nodes, "Mul")) == 2000


def test_several_outputs_share_one_subgraph():
    x, w, b, _ = small()
    h = (x @ w).relu()
    a, c = h.sum(), (h * 2).mean()
    nodes, edges = parse(to_dot([a, c], params={"x": x, "w": w}))
    n_fn, n_leaf, n_edges = walk([a, c])
    assert len(nodes) == n_fn + n_leaf + 2 and len(edges) == n_edges
    assert len(by_label(nodes, "ReLU")) == 1 and len(by_label(nodes, "Matmul")) == 1


def test_labels_are_escaped():
    assert quote('a"b\\c\nd') == '"a\\"b\\\\c\\nd"'
    x = it.randn(2, requires_grad=True)
    name = 'w "quoted" \\ back\nslash {}[];'
    nodes, _ = parse(to_dot((x * 2).sum(), params={name: x}))
    assert name + "\n(2,)\nfloat32" in {n["label"] for n in nodes.values()}


def test_saved_tensors_and_attributes():
    x, w, b, y = small()
    nodes, edges = parse(to_dot(y, show_saved=True, show_attrs=True))
    saved = [nid for nid, n in nodes.items() if n["fillcolor"] == "orange"]
    (mm,) = by_label(nodes, "Matmul")
    into_mm = {nodes[s]["label"] for s, d, a in edges if d == mm and a.get("dir") == "none"}
    assert into_mm == {"saved\n(2, 3)\nfloat32", "saved\n(3, 4)\nfloat32"}
    assert all(a.get("dir") == "none" for s, _, a in edges if s in saved)
    (sum_node,) = by_label(nodes, "Sum")
    assert "keepdim: False" in nodes[sum_node]["label"].split("\n")
    y.backward()  # frees the saved arrays: no saved nodes afterwards
    nodes, _ = parse(to_dot(y, show_saved=True))
    assert not [n for n in nodes.values() if n["fillcolor"] == "orange"]


def test_bad_inputs_name_the_function():
    with pytest.raises(TypeError, match=r"to_dot: expected a Tensor or a non-empty list of Tensors, got ndarray"):
        to_dot(np.zeros(3))
    with pytest.raises(TypeError, match=r"got an empty list"):
        to_dot([])
    with pytest.raises(TypeError, match=r"got an entry str[\s\S]*HINT: pass dict\(model.named_parameters\(\)\)"):
        to_dot(small()[3], params=["w"])
    with it.no_grad():
        z = it.randn(2, requires_grad=True) * 2
    with pytest.raises(ValueError, match=r"output 0 \(shape \(2,\)\) has no autograd graph[\s\S]*HINT"):
        to_dot(z)


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot program is not installed")
def test_render_svg_and_dot(tmp_path):
    pytest.importorskip("graphviz")
    x, w, b, y = small()
    path = render(y, tmp_path / "sub" / "graph.svg", params={"x": x, "w": w, "b": b})
    svg = (tmp_path / "sub" / "graph.svg").read_text()
    assert str(path).endswith("graph.svg") and svg.lstrip().startswith("<?xml") and "<svg" in svg
    assert svg.count('class="node"') == 11 and svg.count('class="edge"') == 10
    assert to_graphviz(y).source == to_dot(y)
    render(y, tmp_path / "g.dot", format="dot")
    assert (tmp_path / "g.dot").read_text() == to_dot(y)
    with pytest.raises(ValueError, match=r"format: expected a Graphviz output format.*got 'svgz2'"):
        render(y, tmp_path / "g.x", format="svgz2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.dot", "sub"]  # no temp files left behind
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask


def test_render_without_graphviz_names_the_extra(monkeypatch, tmp_path):
    real_import = builtins.__import__

    def no_graphviz(name, *args, **kwargs):
        if name == "graphviz":
            raise ModuleNotFoundError("No module named 'graphviz'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_graphviz)
    y = small()[3]
    with pytest.raises(ImportError, match=r"render: needs the graphviz Python package[\s\S]*"
                                          r"HINT: pip install 'infini_train\[graph\]'"):
        render(y, tmp_path / "g.svg")
    with pytest.raises(ImportError, match=r"to_graphviz: needs the graphviz"):
        to_graphviz(y)
    render(y, tmp_path / "g.dot", format="dot")  # DOT text needs no graphviz
    assert (tmp_path / "g.dot").read_text() == to_dot(y)
    assert not (tmp_path / "g.svg").exists()
