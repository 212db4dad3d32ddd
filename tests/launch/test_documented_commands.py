"""The training commands the documentation (README.md and the docs/ pages) and the shipped configs document: each
one's config resolves and its batch arithmetic divides for the ranks it starts, and the GPU config on CPU ranks is
one error printed once."""
import glob
import os
import re
import shlex
import subprocess
import sys

import pytest

from infini_train.backend import cuda_available
from infini_train.training.config import load_config
from tests.launch.jobs import MPIEXEC, REPO, needs_mpiexec
from tests.training.tiny_run import job_env

LAUNCHERS = ("mpirun", "mpiexec", "launch/run.sh")
READERS_FILES = ("model.pretrained=", "lora.init_from=")  # weights the reader downloads or trains first
DEFAULT_CONFIG = "configs/gpt2_tiny.yaml"  # train.py's --config when none is given


def _joined(lines):
    """Lines with shell continuations (a trailing backslash) joined."""
    out = []
    for line in lines:
        if out and out[-1].endswith("\\"):
            out[-1] = out[-1][:-1] + " " + line.strip()
        else:
            out.append(line)
    return out


OUTPUT_BLOCKS = ("text", "json")  # fenced blocks that show what a command printed or wrote, not commands


def _fenced_and_inline(text):
    """The commands of a Markdown text: the lines of its fenced blocks (but output: ```text, ```json) and its inline
    code spans (a span may wrap onto the next line)."""
    fenced, prose, inside, output = [], [], False, False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
            output = inside and line[3:].strip() in OUTPUT_BLOCKS
        elif not output:
            (fenced if inside else prose).append(line)
    inline = [span.replace("\n", " ") for paragraph in "\n".join(prose).split("\n\n")
              for span in re.findall(r"`([^`]+)`", paragraph)]
    return _joined(fenced) + inline


def _config_comments(path):
    """The commands in a YAML file's comments."""
    with open(path) as f:
        return _joined([line[1:].strip() for line in f if line.startswith("#")])


def documented_commands():
    """[(where, ranks, config, overrides)] of every documented train.py command with a shipped --config, or none (the
    default config); a command elided with "..." is left out."""
    sources = []
    for page in ["README.md"] + sorted(glob.glob("docs/**/*.md", root_dir=REPO, recursive=True)):
        with open(os.path.join(REPO, page), encoding="utf-8") as f:
            sources += [(page, c) for c in _fenced_and_inline(f.read())]
    for path in sorted(glob.glob(os.path.join(REPO, "configs", "*.yaml"))):
        sources += [(os.path.relpath(path, REPO), c) for c in _config_comments(path)]
    found = []
    for where, text in sources:
        for part in text.split("&&"):
            if "examples/gpt2/train.py" not in part:
                continue
            words = shlex.split(part, comments=True)
            if "examples/gpt2/train.py" not in words or "..." in words:
                continue
            script = words.index("examples/gpt2/train.py")
            launcher = [w for w in words[:script] if w.endswith(LAUNCHERS)]
            ranks = int(words[words.index("-n") + 1]) if launcher else 1
            args = words[script + 1:]
            config = args[args.index("--config") + 1] if "--config" in args else DEFAULT_CONFIG
            if config.startswith("configs/"):
                found.append((where, ranks, config, [a for a in args if "=" in a and not a.startswith("-")]))
    return found


def test_the_documented_commands_resolve_and_their_batches_divide():
    commands = documented_commands()
    assert ("docs/guides/multi-process.md", 16, "configs/gpt2_124m_ddp.yaml", ["train.batch_size=32"]) in commands
    assert ("configs/gpt2_124m_ddp.yaml", 16, "configs/gpt2_124m_ddp.yaml", ["train.batch_size=32"]) in commands
    assert ("README.md", 2, "configs/gpt2_tiny_ddp.yaml", []) in commands
    assert ("README.md", 4, "configs/gpt2_tiny_ddp.yaml", ["parallel.zero_stage=3", "train.batch_size=8"]) in commands
    for where, ranks, config, overrides in commands:
        if any(o.startswith(READERS_FILES) for o in overrides):
            continue
        cfg = load_config(os.path.join(REPO, config), overrides)
        p = cfg.parallel
        split = p.tensor * p.pipeline * p.context
        assert ranks % split == 0, (where, ranks, config, overrides)
        cfg.grad_accum_steps(ranks // split)  # raises a ConfigError when the batch does not divide
    ddp_16 = load_config(os.path.join(REPO, "configs/gpt2_124m_ddp.yaml"), ["train.batch_size=32"])
    assert ddp_16.train.grad_accum_steps(16) == 1  # 16 x 32 x 1024 = 524,288 tokens


def test_the_gpu_config_without_the_batch_override_says_which_batch_size_fits():
    cfg = load_config(os.path.join(REPO, "configs/gpt2_124m_ddp.yaml"))
    with pytest.raises(ValueError) as info:
        cfg.grad_accum_steps(16)
    assert str(info.value).endswith(
        "HINT: set train.total_batch_size=1048576 (or 2097152), or train.batch_size=32 (the same total in 1 "
        "micro-batch), or change batch_size / the number of ranks")


@needs_mpiexec
@pytest.mark.skipif(cuda_available(), reason="with GPUs the NCCL config would start training")
def test_nccl_on_cpu_ranks_is_one_config_error_printed_once_by_rank_0(tmp_path):
    proc = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "examples/gpt2/train.py", "--config",
                           "configs/gpt2_124m_ddp.yaml", f"out_dir={tmp_path}/run"], capture_output=True,
                          text=True, timeout=120, cwd=REPO, env=job_env())
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr and "[rank" not in proc.stderr, proc.stderr
    assert proc.stderr == (
        "error: invalid run configuration, 1 problem:\n  backend: expected 'auto' or 'mpi' on ranks without a GPU "
        "(NCCL runs between GPUs; this rank has no GPU CuPy can use), got 'nccl' with device 'auto'; HINT: set "
        "backend=auto (NCCL where every rank has a GPU, else MPI) or backend=mpi\n")
    assert not os.path.exists(tmp_path / "run")
