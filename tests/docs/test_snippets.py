"""The documentation's Python snippets that are meant to run, run as written: README.md and every page under docs/
(the MkDocs site's sources). A broken snippet fails here, named by its page and line (``docs/guides/library.md:12``).

Convention: an HTML comment on the line before a ```python fence marks the snippet (unmarked snippets are fragments
of the text around them and are not run):

    <!-- snippet: run -->                  a program of its own: ``python`` in a temporary directory
    <!-- snippet: continue -->             runs after the snippet before it on the same page, in the same process
                                           (the names it defined still there)
    <!-- snippet: mpiexec -n 2 -->         under ``mpiexec -n 2`` in a temporary directory
    <!-- snippet: run with=NAME -->        after the setup NAME below: the names the text around a fragment gives
                                           it (a model, a batch, an optimizer), so the fragment itself runs as written
    <!-- snippet: run needs=WHAT -->       skipped here, for the reason NEEDS[WHAT] states (a GPU, a download, a long
                                           run), unless that need is met

A comment that starts like a marker but is not one (a misspelt kind or option) is an error, so a snippet never
drops out of the test silently. docs/development/testing.md documents the markers for writers of pages.

Snippets run one thread each (OMP / OpenBLAS), so the file stays under a minute on two cores.
"""
import glob
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.distributed.mpi_jobs import MPIEXEC, job_env, needs_mpiexec

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MARKER = re.compile(r"<!-- snippet: (run|continue|mpiexec -n 2)((?: (?:with|needs)=[\w-]+)*) -->")
MARKER_START = "<!-- snippet:"

SETUPS = {
    # a tiny GPT-2, a batch of token ids and an optimizer, as the pages on training and profiling have them
    "gpt2": """
import numpy as np
import infini_train as it
from infini_train.models.gpt2 import GPT2, GPT2Config
config = GPT2Config(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32)
model = GPT2(config)
params = list(model.parameters())
opt = it.optim.AdamW(params, lr=1e-3)
x = y = idx = targets = it.tensor(np.random.default_rng(0).integers(0, 64, (2, 16)))
""",
    # inputs of the shapes the text names: x (batch 3, length 7, 32 features); q, k, v (batch, heads, length, dim)
    "tensors": """
import infini_train as it
import infini_train.nn.functional as F
x = it.randn(3, 7, 32, requires_grad=True)
q, k, v = it.randn(2, 2, 8, 16), it.randn(2, 2, 8, 16), it.randn(2, 2, 8, 16)
""",
}


def _gpu():
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no cupy, no driver
        return False


NEEDS = {
    "gpu": (_gpu, "needs a CUDA GPU and cupy"),
    "download": (lambda: False, "reads a Hugging Face model directory that the tests do not download"),
    "graphviz": (lambda: shutil.which("dot") is not None, "needs Graphviz's dot program (the graph extra)"),
    "long": (lambda: False, "a long run (minutes); the tests run its pieces on small models"),
}


def pages(repo=REPO):
    """The Markdown files whose snippets run, relative to ``repo``: README.md, then docs/**/*.md in path order."""
    found = [os.path.join(repo, "README.md")]
    found += sorted(glob.glob(os.path.join(repo, "docs", "**", "*.md"), recursive=True))
    return [os.path.relpath(path, repo) for path in found if os.path.isfile(path)]


def snippets(text, page="README.md"):
    """[(id, kind, code, setup name or None, needs or None)] of the marked python snippets of one page, in order; a
    ``continue`` snippet's code is the code before it (on this page) followed by its own. Ids are ``page:line`` of
    the snippet's first line of code."""
    lines = text.split("\n")
    found = []
    for i, line in enumerate(lines):
        if not line.strip().startswith(MARKER_START):
            continue
        marker = MARKER.fullmatch(line.strip())
        if marker is None:
            raise ValueError(f"{page}:{i + 1}: not a snippet marker: {line.strip()!r}; expected <!-- snippet: run | "
                             "continue | mpiexec -n 2 [with=NAME] [needs=WHAT] -->")
        if i + 1 >= len(lines) or lines[i + 1].strip() != "```python":
            raise ValueError(f"{page}:{i + 1}: a snippet marker must sit on the line before a ```python fence")
        try:
            end = next(j for j in range(i + 2, len(lines)) if lines[j].strip() == "```")
        except StopIteration:
            raise ValueError(f"{page}:{i + 2}: the snippet's ```python fence is never closed") from None
        code = "\n".join(lines[i + 2:end]) + "\n"
        kind, options = marker.group(1), dict(o.split("=") for o in marker.group(2).split())
        if kind == "continue":
            if not found:
                raise ValueError(f"{page}:{i + 1}: a continue snippet needs a snippet before it on its page")
            _, kind, before, with_, needs = found[-1]
            code = before + code
            options = {"with": with_, "needs": needs, **options}
        for key, table in (("with", SETUPS), ("needs", NEEDS)):
            if options.get(key) is not None and options[key] not in table:
                raise ValueError(f"{page}:{i + 1}: {key}={options[key]} is not one of {sorted(table)}")
        found.append((f"{page}:{i + 3}", kind, code, options.get("with"), options.get("needs")))
    return found


def all_snippets(repo=REPO):
    found = []
    for page in pages(repo):
        with open(os.path.join(repo, page), encoding="utf-8") as f:
            found += snippets(f.read(), page)
    return found


SNIPPETS = all_snippets()


def test_the_pages_mark_their_runnable_snippets():
    kinds = [kind for _, kind, *_ in SNIPPETS]
    assert kinds.count("run") >= 5 and kinds.count("mpiexec -n 2") >= 1, kinds
    assert {where.split(":")[0] for where, *_ in SNIPPETS} > {"README.md"}, "no page under docs/ has a snippet"


def test_a_misspelt_marker_or_a_continue_across_pages_is_an_error():
    with pytest.raises(ValueError, match=r"page.md:1: not a snippet marker"):
        snippets("<!-- snippet: runn -->\n```python\npass\n```", "page.md")
    with pytest.raises(ValueError, match=r"page.md:1: a continue snippet needs a snippet before it on its page"):
        snippets("<!-- snippet: continue -->\n```python\npass\n```", "page.md")
    with pytest.raises(ValueError, match=r"page.md:2: the snippet's ```python fence is never closed"):
        snippets("<!-- snippet: run -->\n```python\npass\n", "page.md")
    two = snippets("<!-- snippet: run with=gpt2 -->\n```python\na = 1\n```\n\n<!-- snippet: continue -->\n```python\n"
                   "b = a\n```", "page.md")
    assert [(where, code, setup) for where, _, code, setup, _ in two] == [
        ("page.md:3", "a = 1\n", "gpt2"), ("page.md:8", "a = 1\nb = a\n", "gpt2")]


@pytest.mark.parametrize("where,kind,code,setup,needs", SNIPPETS, ids=[s[0] for s in SNIPPETS])
def test_snippet_runs_as_written(where, kind, code, setup, needs, tmp_path):
    if needs is not None and not NEEDS[needs][0]():
        pytest.skip(f"{where}: {NEEDS[needs][1]}")
    program = tmp_path / "snippet.py"
    program.write_text((SETUPS[setup] if setup else "") + code)
    command = [sys.executable, str(program)]
    if kind == "mpiexec -n 2":
        if MPIEXEC is None:
            pytest.skip(needs_mpiexec.kwargs["reason"])
        command = [MPIEXEC, "-n", "2", *command]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path, env=job_env())
    assert proc.returncode == 0, f"{where} ({kind}) failed:\n{code}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n" \
                                 f"{proc.stderr[-3000:]}"
