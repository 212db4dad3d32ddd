"""docs/figures/make_figures.py draws every figure it lists, from the package as it is (a renamed schedule function, a
changed mesh order or graph node breaks it here), and the pages' figures are the committed files."""
import glob
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
