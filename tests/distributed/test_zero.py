"""ZeRO-1, 2 and 3 against plain DDP and against one process: the same losses with gradient accumulation and
clipping on (2, 3 and 4 ranks; 3 gives uneven shards), resume across world sizes and between ZeRO and non-ZeRO
runs, per-rank optimizer state 1/N of DDP's (and under ZeRO-3 parameters and gradients too), parameters no rank got a
gradient for skipped as one process's AdamW skips them, and a stage that does not exist refused."""
import os
import re
import shutil

import numpy as np
import pytest

from tests.distributed.mpi_jobs import assert_every_rank_checked, mpirun, needs_mpiexec, output
from tests.training.tiny_run import metrics, run, tiny_args

pytestmark = needs_mpiexec

CLIPPED = ["train.val_loss_every=0", "train.grad_clip=0.5", "train.learning_rate=3e-3"]
BATCH = {1: 4, 2: 2, 3: 2, 4: 2}  # sequences per rank: 256 or 384 tokens per step in 1-3 accumulation steps


def _losses(out):
    return np.array([r["loss"] for r in metrics(out) if "loss" in r])


def _train(data_dir, out, ranks, stage, steps=10, total=256, *extra):
    return run(tiny_args(data_dir, out, f"train.num_iterations={steps}", f"train.batch_size={BATCH[ranks]}",
                         f"train.total_batch_size={total}", f"parallel.zero_stage={stage}", *CLIPPED, *extra),
               ranks=ranks)


@pytest.fixture(scope="module")
def single(data_dir, tmp_path_factory):
    runs = {}
    for total in (256, 384):
        out = tmp_path_factory.mktemp(f"single{total}")
        _train(data_dir, out, 1, 0, 10, total)
        runs[total] = _losses(out)
    return runs


@pytest.mark.layouts
@pytest.mark.parametrize("ranks,total", [(2, 256), (3, 384), (4, 256)])
def test_stages_0_1_2_3_give_the_losses_of_one_process(data_dir, single, tmp_path, ranks, total):
    gradient_mb, parameter_mb = {}, {}
    for stage in (0, 1, 2, 3):
        out = tmp_path / f"stage{stage}"
        proc = _train(data_dir, out, ranks, stage, 10, total)
        np.testing.assert_allclose(_losses(out), single[total], rtol=1e-5, err_msg=f"stage {stage}, {ranks} ranks")
        line = next(x for x in proc.stdout.splitlines() if x.startswith(f"memory (ZeRO stage {stage},"))
        assert line.count("optimizer state") == ranks
        gradient_mb[stage] = [float(mb) for mb in re.findall(r"gradients ([0-9.]+) MB", line)]
        parameter_mb[stage] = [float(mb) for mb in re.findall(r"parameters ([0-9.]+) MB", line)]
    # ZeRO-1 keeps the whole gradients (in one flat buffer) and nothing more; ZeRO-2 and 3 only their 1/N shard,
    # and ZeRO-3 1/N of the parameters
    assert gradient_mb[1] == gradient_mb[0], gradient_mb
    np.testing.assert_allclose(gradient_mb[2], np.array(gradient_mb[0]) / ranks, atol=0.011)
    np.testing.assert_allclose(gradient_mb[3], np.array(gradient_mb[0]) / ranks, atol=0.011)
    np.testing.assert_allclose(parameter_mb[3], np.array(parameter_mb[0]) / ranks, atol=0.011)


@pytest.mark.layouts
@pytest.mark.parametrize("first,second", [((2, 2), (1, 0)), ((1, 0), (2, 1)), ((2, 2), (4, 2)), ((2, 0), (2, 2)),
                                          ((2, 3), (4, 3))],
                         ids=["2x-zero2->1x", "1x->2x-zero1", "2x-zero2->4x-zero2", "2x-ddp->2x-zero2",
                              "2x-zero3->4x-zero3"])
def test_resume_across_world_sizes_and_zero_stages(data_dir, single, tmp_path, first, second):
    out = tmp_path / "run"
    _train(data_dir, out, first[0], first[1], 10, 256, "train.save_every=5", "train.keep_last=3")
    shutil.rmtree(out / "checkpoints" / "step_000010")  # as if stopped after step 5
    proc = _train(data_dir, out, second[0], second[1], 10, 256, "train.save_every=5", "train.keep_last=3",
                  "resume=auto")
    assert "resumed from" in proc.stdout and "at step 5" in proc.stdout
    # the optimizer state crossed layouts exactly; what differs from the one-process run is float32 summation
    # order in the averaged gradients
    np.testing.assert_allclose(_losses(out), single[256], rtol=1e-5)


@pytest.mark.parametrize("ranks", [2, 3])
def test_each_rank_holds_a_1_over_n_share_of_the_optimizer_state(ranks):
    proc = mpirun(ranks, "worker_zero.py", timeout=120)
    assert proc.returncode == 0, output(proc)
    assert proc.stdout.count("share ok") == ranks, output(proc)


@pytest.mark.parametrize("ranks", [2, 3])
def test_parameters_no_rank_got_a_gradient_for_are_skipped_as_in_one_process(ranks):
    proc = mpirun(ranks, "worker_zero_unused.py", timeout=120)
    assert proc.returncode == 0, output(proc)
    assert_every_rank_checked(proc, "unused skipped", ranks, at_least=4)


def test_a_stage_that_does_not_exist_is_refused_with_what_is_supported(data_dir, tmp_path):
    proc = run(tiny_args(data_dir, tmp_path / "x", "parallel.zero_stage=4"), check=False)
    assert proc.returncode != 0 and os.path.basename(str(tmp_path / "x")) not in os.listdir(tmp_path)
    assert "parallel.zero_stage: expected 0, 1, 2 or 3" in proc.stderr


@pytest.mark.layouts
@pytest.mark.parametrize("precision", ["bf16-mixed", "fp16-mixed"])
def test_mixed_precision_with_zero2_and_3_follows_ddp(data_dir, tmp_path, precision):
    losses = {}
    for stage in (0, 2, 3):
        out = tmp_path / f"stage{stage}"
        _train(data_dir, out, 2, stage, 6, 256, f"precision={precision}")
        losses[stage] = _losses(out)
    # the same bf16/fp16 roundings of the same products; the sharded reduction sums in another order
    np.testing.assert_allclose(losses[2], losses[0], rtol=1e-4)
    np.testing.assert_allclose(losses[3], losses[0], rtol=1e-4)
