"""Runs under ``parallel.zero_stage: 3`` (fully_shard over the data-parallel group) composed with the other layouts
and features: ZeRO-3 x TP2 and PP2 x ZeRO-3 give the one-process losses with accumulation and clipping on, as do
recomputed blocks (sampling text on the way) and a LoRA run (its frozen base sharded too); sharded checkpoints
reshard between ZeRO-3 and other layouts in both directions and continue the uninterrupted run; a damaged shard of a
ZeRO-3 checkpoint is found."""
import os

import numpy as np
import pytest

from infini_train.run_state import list_checkpoints
from tests.distributed.mpi_jobs import needs_mpiexec, output
from tests.training.tiny_run import grad_norms, losses_by_step, run, tiny_args

pytestmark = [needs_mpiexec, pytest.mark.layouts]

SHAPE = ["model.n_head=4", "train.val_loss_every=0", "train.grad_clip=0.5", "train.learning_rate=3e-3",
         "train.total_batch_size=256", "train.save_every=3", "train.num_iterations=6", "train.batch_size=2"]
ZERO3 = "parallel.zero_stage=3"
TEN_STEPS = ["train.num_iterations=10", "train.save_every=0"]


def _train(data_dir, out, ranks, *extra, check=True):
    return run(tiny_args(data_dir, out, *SHAPE, *extra), ranks=ranks, check=check)


@pytest.fixture(scope="module")
def single(data_dir, tmp_path_factory):
    runs = {}
    for name, extra in (("plain", []), ("recompute", ["train.recompute=block"]), ("lora", ["lora.rank=4"])):
        out = tmp_path_factory.mktemp(name)
        _train(data_dir, out, 1, *extra, *TEN_STEPS)
        runs[name] = out
    return runs


@pytest.mark.parametrize("layout,reference", [
    (["parallel.tensor=2"], "plain"),
    (["parallel.tensor=2", "parallel.sequence=true"], "plain"),
    (["parallel.pipeline=2"], "plain"),
    (["train.recompute=block", "train.sample_every=5", "train.sample_length=8"], "recompute"),
    (["lora.rank=4"], "lora")],
    ids=["zero3x2-tp2", "zero3x2-tp2-sp", "pp2-zero3x2", "zero3x4-recompute", "zero3x4-lora"])
def test_zero3_composes_and_gives_the_one_processlosses_by_step(data_dir, single, tmp_path, layout, reference):
    out = tmp_path / "run"
    proc = _train(data_dir, out, 4, ZERO3, *layout, *TEN_STEPS)
    if "train.sample_every=5" in layout:  # every data-parallel rank joins the generation's all-gathers
        assert proc.stdout.count("--- sample at step 5 ---") == proc.stdout.count("--- sample at step 10 ---") == 1
    want, got = losses_by_step(single[reference]), losses_by_step(out)
    assert sorted(got) == sorted(want) == list(range(10))
    np.testing.assert_allclose([got[s] for s in want], [want[s] for s in want], rtol=1e-4)
    np.testing.assert_allclose(grad_norms(out), grad_norms(single[reference]), rtol=1e-4)
    if reference == "lora":
        assert os.path.exists(out / "adapter" / "adapter_model.safetensors")


@pytest.mark.parametrize("first,second", [
    ((4, [ZERO3]), (4, ["parallel.pipeline=2", "parallel.tensor=2"])),
    ((4, ["parallel.pipeline=2", "parallel.tensor=2"]), (4, [ZERO3])),
    ((4, [ZERO3]), (1, ["train.batch_size=8"])),
    ((1, ["train.batch_size=8"]), (2, [ZERO3, "train.batch_size=4"])),
    ((4, [ZERO3]), (2, ["parallel.zero_stage=1", "train.batch_size=4"])),
    ((2, ["parallel.zero_stage=1", "train.batch_size=4"]), (4, [ZERO3])),
    ((4, [ZERO3, "parallel.tensor=2", "train.checkpoint_format=whole"]), (4, [ZERO3, "parallel.pipeline=2"]))],
    ids=["zero3x4->pp2xtp2", "pp2xtp2->zero3x4", "zero3x4->one", "one->zero3x2", "zero3x4->zero1x2",
         "zero1x2->zero3x4", "zero3x2-tp2-whole->pp2-zero3x2"])
def test_a_zero3_checkpoint_reshards_both_ways(data_dir, tmp_path, first, second):
    uninterrupted, resumed = tmp_path / "uninterrupted", tmp_path / "resumed"
    _train(data_dir, uninterrupted, first[0], *first[1])
    proc = _train(data_dir, resumed, second[0], *second[1], f"resume={list_checkpoints(uninterrupted)[0]}")
    assert "at step 3" in proc.stdout, output(proc)
    want, got = losses_by_step(uninterrupted), losses_by_step(resumed)
    assert sorted(got) == [3, 4, 5]
    np.testing.assert_allclose([got[s] for s in got], [want[s] for s in got], rtol=1e-4)


def test_a_damaged_shard_of_a_zero3_checkpoint_is_found(data_dir, tmp_path):
    out = tmp_path / "run"
    _train(data_dir, out, 2, ZERO3, "train.batch_size=4")
    newest = list_checkpoints(out)[-1]
    with open(os.path.join(newest, "shard00000.safetensors"), "r+b") as f:
        f.seek(-4, os.SEEK_END)
        f.write(b"\x00\x01\x02\x03")
    proc = _train(data_dir, out, 2, ZERO3, "train.batch_size=4", "train.num_iterations=7", "resume=auto")
    assert "shard00000.safetensors was modified" in proc.stdout + proc.stderr, output(proc)
    assert "at step 3" in proc.stdout, output(proc)
