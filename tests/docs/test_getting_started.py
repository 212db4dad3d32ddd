"""Every command of the getting-started page (docs/getting-started.md) runs as written, in order, in a fresh
directory, and prints what the page says it prints.

Convention: an HTML comment on the line before a fence says what the block is:

    <!-- getting-started: run -->              a ```bash or ```python block run here (bash -euo pipefail; python in
                                               the same directory, so it sees what the blocks before it wrote)
    <!-- getting-started: install -->          a set-up command (a virtual environment, pip): not run; the extras it
                                               names must exist, and the test command must be .ci/run's
    <!-- getting-started: output of="TEXT" [check=words] -->
                                               a ```text excerpt of the output of the run block whose code contains
                                               TEXT: each line (numbers aside; "..." stands for anything, sampled text
                                               between "--- sample" and "---" is left out) is a line of that output;
                                               check=words: each word is a word of it (``ls`` columns)
    <!-- getting-started: quick train="OVERRIDES" -->
                                               the overrides the page shows for a quick tour, appended here to every
                                               training command so the file runs in about a minute on two cores

Every bash and python block of the page is marked run or install.
"""
import os
import re
import shlex
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE = os.path.join(REPO, "docs", "getting-started.md")
MARKER = re.compile(r"<!-- getting-started: (run|install|output|quick)((?: \w+=(?:\"[^\"]*\"|\S+))*) -->")
BIN = os.path.dirname(sys.executable)


def blocks(text):
    """[(line number, kind, options, language, code)] of the page's fenced blocks, in order; kind None for an
    unmarked block; the quick marker (no block of its own) as ("quick", options, None, None)."""
    lines = text.split("\n")
    found, marker = [], None
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        m = MARKER.fullmatch(line)
        if m:
            options = {k: v.strip('"') for k, v in re.findall(r"(\w+)=(\"[^\"]*\"|\S+)", m.group(2))}
            if m.group(1) == "quick":
                found.append((i + 1, "quick", options, None, None))
            else:
                marker = (m.group(1), options)
        elif line.startswith("```") and len(line) > 3:
            end = lines.index("```", i + 1)
            kind, options = marker or (None, {})
            found.append((i + 1, kind, options, line[3:], "\n".join(lines[i + 1:end]) + "\n"))
            marker, i = None, end
        i += 1
    return found


with open(PAGE) as f:
    TEXT = f.read()
BLOCKS = blocks(TEXT)


def _normal(line):
    """A line with every number (1,234 / 5.4e-05 / 0.1) as N and runs of blanks as one."""
    return " ".join(re.sub(r"\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?", "N", line).split())


def check_excerpt(excerpt, output, words=False):
    """The excerpt's lines (or words) that the output does not have."""
    got = [_normal(line) for line in output.splitlines()]
    missing, in_sample = [], False
    for line in excerpt.splitlines():
        if in_sample:
            in_sample = line.strip() != "---"
            continue
        if line.startswith("--- sample"):
            in_sample = True
        if not line.strip() or line.strip() == "...":
            continue
        if words:
            have = {w for g in got for w in g.split()}
            missing += [w for w in _normal(line).split() if w not in have]
            continue
        pattern = re.compile(".*".join(re.escape(part) for part in _normal(line).split("...")))
        if not any(pattern.fullmatch(g) for g in got):
            missing.append(line)
    return missing


def test_the_page_marks_every_command():
    unmarked = [n for n, kind, _, lang, _ in BLOCKS if lang in ("bash", "python", "sh", "console") and kind is None]
    assert not unmarked, f"getting-started.md: blocks at lines {unmarked} are neither run nor install"
    kinds = [kind for _, kind, *_ in BLOCKS]
    assert kinds.count("run") >= 5 and kinds.count("quick") == 1 and kinds.count("install") >= 1, kinds


def test_the_install_commands_name_real_extras_and_ci_s_test_command():
    with open(os.path.join(REPO, "pyproject.toml")) as f:
        table = f.read().split("[project.optional-dependencies]")[1].split("\n[")[0]
    extras = set(re.findall(r"^([\w-]+) = \[", table, re.M))
    assert {"mpi", "plot", "test", "docs"} <= extras, extras
    with open(os.path.join(REPO, ".ci", "run")) as f:
        ci = f.read()
    for n, kind, _, _, code in BLOCKS:
        if kind != "install":
            continue
        for named in re.findall(r"pip install -e '\.\[([\w,-]+)\]'", code):
            assert set(named.split(",")) <= extras, f"getting-started.md:{n}: unknown extra in [{named}]"
        if "pytest" in code:
            install = re.search(r"pip install -e '[^']+'", code).group(0)
            assert install in ci, f"getting-started.md:{n}: the test set-up {install!r} is not .ci/run's"


def _quick(command, overrides):
    """``command`` with the quick tour's overrides after each training command."""
    return "\n".join(f"{line} {overrides}" if "examples/gpt2/train.py" in line else line
                     for line in command.split("\n"))


@pytest.mark.slow
def test_every_command_of_the_page_runs_as_written(tmp_path):
    if not os.path.exists(os.path.join(BIN, "mpirun")):
        pytest.skip("no mpirun next to this python (pip install -e '.[mpi]')")
    quick = next(options["train"] for _, kind, options, _, _ in BLOCKS if kind == "quick")
    assert f"`{quick}`" in TEXT, "the quick tour's overrides are not shown on the page"
    for name in ("configs", "examples"):
        os.symlink(os.path.join(REPO, name), tmp_path / name)
    # the page's runs are on CPU ranks, as its excerpts; with a GPU, device auto would put both ranks on it
    env = dict(os.environ, PATH=BIN + os.pathsep + os.environ.get("PATH", ""), PYTHONPATH=REPO, CUDA_VISIBLE_DEVICES="",
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    outputs = []
    for n, kind, options, lang, code in BLOCKS:
        if kind == "run":
            if lang == "python":
                (tmp_path / "block.py").write_text(code)
                command = [sys.executable, "block.py"]
            else:
                command = ["bash", "-euo", "pipefail", "-c", _quick(code, quick)]
            proc = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
            assert proc.returncode == 0, (f"getting-started.md:{n} failed ({shlex.join(command)}):\n--- stdout\n"
                                          f"{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}")
            outputs.append((code, proc.stdout + proc.stderr))
        elif kind == "output":
            code_of, output = next((c, o) for c, o in reversed(outputs) if options["of"] in c)
            missing = check_excerpt(code, output, words=options.get("check") == "words")
            assert not missing, (f"getting-started.md:{n}: the excerpt's lines {missing} are not in the output of "
                                 f"{code_of.strip()!r}:\n{output[-4000:]}")
    run = tmp_path / "runs" / "gpt2_tiny_ddp"
    assert sorted(os.listdir(run)) == ["checkpoints", "config.yaml", "loss.png", "metrics.jsonl"]
    assert os.listdir(run / "checkpoints") == ["step_000010"]
