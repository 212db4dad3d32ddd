"""docs/figures/make_figures.py draws every figure it lists, from the package as it is (a renamed schedule function, a
changed mesh order or graph node breaks it here), and the pages' figures are the committed files."""
import glob
import json
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("matplotlib")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = os.path.join(REPO, "docs")
SCRIPT = os.path.join(DOCS, "figures", "make_figures.py")


def _listed():
    out = subprocess.run([sys.executable, SCRIPT, "--list"], capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.split()


def test_the_script_draws_every_figure_it_lists(tmp_path):
    names = _listed()
    assert names and all(n.endswith(".svg") for n in names)
    proc = subprocess.run([sys.executable, SCRIPT, "--out", str(tmp_path)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    for name in names:
        path = tmp_path / name
        assert path.is_file(), f"{name} was not drawn"
        text = path.read_text()
        assert "<svg" in text and text.rstrip().endswith("</svg>"), f"{name} is not a whole SVG file"
        assert os.path.isfile(os.path.join(DOCS, "figures", name)), f"docs/figures/{name} is missing: run {SCRIPT}"


def test_every_figure_a_page_shows_exists():
    image = re.compile(r"!\[[^\]]*\]\(([^)\s]+)")
    missing = []
    for page in glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True):
        with open(page, encoding="utf-8") as f:
            for target in image.findall(f.read()):
                if "://" in target:
                    continue
                if not os.path.isfile(os.path.normpath(os.path.join(os.path.dirname(page), target))):
                    missing.append(f"{os.path.relpath(page, REPO)}: {target}")
    assert not missing, missing


def test_the_profiler_trace_figure_draws_from_a_profile_of_the_package(tmp_path):
    """docs/figures/profiling/draw_trace.py reads the Chrome trace the profiler writes (one rank here) and draws
    its nesting: the step, module ranges, forward and backward ops, the optimizer step."""
    import numpy as np

    import infini_train as it
    from infini_train.models.gpt2 import GPT2, GPT2Config

    sys.path.insert(0, os.path.join(DOCS, "figures", "profiling"))
    try:
        import draw_trace
    finally:
        sys.path.pop(0)
    model = GPT2(GPT2Config(block_size=8, vocab_size=32, n_layer=1, n_head=2, n_embd=16))
    opt = it.optim.AdamW(model.parameters(), lr=1e-3)
    x = it.tensor(np.arange(16).reshape(2, 8) % 32)
    with it.profiler.profile() as prof, it.profiler.module_ranges(model):
        with it.profiler.record_function("ProfilerStep#0"):
            model(x, x)[1].backward()
            opt.step()
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    with open(tmp_path / "trace.json") as f:
        (rank, rows), = draw_trace.rank_events(json.load(f)).items()
    kinds = {kind for _, _, _, kind, _ in rows}
    assert {"forward", "backward", "module", "optimizer"} <= kinds, kinds
    assert min(depth for _, _, depth, _, _ in rows) == 0 and max(depth for _, _, depth, _, _ in rows) >= 2
    draw_trace.draw(str(tmp_path / "trace.json"), str(tmp_path / "trace.svg"))
    assert (tmp_path / "trace.svg").read_text().rstrip().endswith("</svg>")
