"""train.py with ``train.optimizer_offload: disk``: the same run as in memory, bit for bit (losses, gradient norms,
every checkpoint file), in one process and under ZeRO-2 and ZeRO-3 on 2 ranks, in both checkpoint formats; a run
resumes across the setting (offloaded to in memory and back); bad values and an unusable offload directory are clear
errors at start."""
import json
import os
import shutil

import pytest

from tests.distributed.mpi_jobs import needs_mpiexec
from tests.training.tiny_run import run, same_run, tiny_args

COMMON = ["train.num_iterations=6", "train.save_every=3", "train.keep_last=0", "train.weight_decay=0.1",
          "train.val_loss_every=3"]
TWO_RANKS = ["train.total_batch_size=256"]


def _files(out):
    """{(step, file): sha256} of every checkpoint file but state.json (whose run id and config differ)."""
    found = {}
    root = os.path.join(out, "checkpoints")
    for step in sorted(os.listdir(root)):
        with open(os.path.join(root, step, "state.json")) as f:
            found.update({(step, name): info["sha256"] for name, info in json.load(f)["files"].items()})
    return found


def _same(a, b):
    same_run(a, b)
    assert _files(a) == _files(b) and len(_files(a)) >= 4


@pytest.fixture(scope="module")
def runs(data_dir, tmp_path_factory):
    made, stdout = {}, {}

    def train(name, *extra, ranks=1):
        """The output directory of run ``name`` (made once per module; its output in ``train.stdout[name]``)."""
        if name not in made:
            made[name] = tmp_path_factory.mktemp(name)
            stdout[name] = run(tiny_args(data_dir, made[name], *COMMON, *extra), ranks=ranks).stdout
        return made[name]
    train.stdout = stdout
    return train


def test_one_process_on_disk_is_the_in_memory_run_and_resumes_across_the_setting(data_dir, runs, tmp_path):
    memory, disk = runs("memory"), runs("disk", "train.optimizer_offload=disk")
    _same(disk, memory)
    assert not os.path.exists(os.path.join(disk, "offload"))
    for first, then in (("memory", "disk"), ("disk", "none")):
        out = tmp_path / f"{first}_then_{then}"
        shutil.copytree(runs(first), out)
        shutil.rmtree(out / "checkpoints" / "step_000006")
        proc = run(tiny_args(data_dir, out, *COMMON, f"train.optimizer_offload={then}", "resume=auto"))
        assert "at step 3" in proc.stdout
        _same(out, memory)


@needs_mpiexec
def test_zero3_on_two_ranks_on_disk_is_the_in_memory_run_in_both_formats(data_dir, runs, tmp_path):
    memory = runs("zero3", "parallel.zero_stage=3", *TWO_RANKS, ranks=2)
    disk = runs("zero3_disk", "parallel.zero_stage=3", *TWO_RANKS, "train.optimizer_offload=disk", ranks=2)
    _same(disk, memory)
    assert runs.stdout["zero3_disk"].count("optimizer state 0.00 MB + 0.45 MB offloaded (disk)") == 2
    assert runs.stdout["zero3"].count("optimizer state 0.45 MB, peak RSS") == 2
    out = tmp_path / "disk_then_memory"
    shutil.copytree(disk, out)
    shutil.rmtree(out / "checkpoints" / "step_000006")
    proc = run(tiny_args(data_dir, out, *COMMON, "parallel.zero_stage=3", *TWO_RANKS, "resume=auto"), ranks=2)
    assert "at step 3" in proc.stdout and "train.optimizer_offload: checkpoint 'disk', config 'none'" in proc.stdout
    _same(out, memory)
    whole = runs("zero3_whole", "parallel.zero_stage=3", *TWO_RANKS, "train.checkpoint_format=whole", ranks=2)
    whole_disk = runs("zero3_whole_disk", "parallel.zero_stage=3", *TWO_RANKS, "train.checkpoint_format=whole",
                      "train.optimizer_offload=disk", ranks=2)
    _same(whole_disk, whole)


@needs_mpiexec
def test_zero2_on_two_ranks_on_disk_is_the_in_memory_run(runs):
    _same(runs("zero2_disk", "parallel.zero_stage=2", *TWO_RANKS, "train.optimizer_offload=disk", ranks=2),
          runs("zero2", "parallel.zero_stage=2", *TWO_RANKS, ranks=2))


def test_bad_values_and_an_unusable_offload_directory_are_errors_at_start(data_dir, tmp_path):
    proc = run(tiny_args(data_dir, tmp_path / "a", "train.optimizer_offload=nvme"), check=False)
    assert proc.returncode == 1
    assert "train.optimizer_offload: expected one of ('none', 'disk', 'host')" in proc.stderr, proc.stderr
    proc = run(tiny_args(data_dir, tmp_path / "b", "train.optimizer_offload=host"), check=False)
    assert proc.returncode == 1
    assert ("train.optimizer_offload: expected 'none' or 'disk' with device 'cpu'" in proc.stderr
            and "HINT: set train.optimizer_offload=disk" in proc.stderr), proc.stderr
    out = tmp_path / "c"
    out.mkdir()
    (out / "offload").write_text("a file where the offload directory goes")
    proc = run(tiny_args(data_dir, out, "train.optimizer_offload=disk", "train.num_iterations=1"), check=False)
    assert proc.returncode == 1
    assert "error: train.optimizer_offload: expected a writable directory for the optimizer state" in proc.stderr, \
        proc.stderr
    assert "Traceback" not in proc.stderr
