"""Hybrid sharded data parallelism (``parallel.data_replicate`` with ZeRO-3) in training runs of the tiny GPT-2 and
LLaMA: HSDP 2 x 2, and 2 x 1 with TP2 + SP, PP2, CP2 and recomputation give the one-process losses, gradient norms and
final weights over 10 steps (rtol 1e-4); its steps move only the reduced gradient shards over the replicate group
(train.log_communication's counters) where ZeRO-3 x 4 gathers over all four ranks; checkpoints reshard to and from
one process and ZeRO-3 x 4; impossible sizes are refused naming the numbers."""
import shutil

import numpy as np
import pytest

from tests.distributed.mpi_jobs import needs_mpiexec, output
from tests.training.tiny_run import assert_close_weights, metrics, reference_runs, run, tiny_args, values

pytestmark = needs_mpiexec

SHAPE = ["model.n_layer=4", "train.total_batch_size=512", "train.grad_clip=0.5", "train.learning_rate=3e-3",
         "train.val_loss_every=5", "train.save_every=5"]
LLAMA = ["model.arch=llama3", "model.n_head=4", "model.n_kv_head=2", "model.rope_scaling_factor=0"]
HSDP = ["parallel.zero_stage=3", "parallel.data_replicate=2"]


def _train(data_dir, out, ranks, *extra, check=True):
    return run(tiny_args(data_dir, out, "train.num_iterations=10", *SHAPE, *extra), ranks=ranks, check=check)


@pytest.fixture(scope="module")
def single(data_dir, tmp_path_factory):
    return reference_runs(lambda: tmp_path_factory.mktemp("single"),
                          lambda out, *extra: _train(data_dir, out, 1, *extra))


LAYOUTS = {
    "hsdp2x2": ((), []),
    "hsdp2x1-tp2-sp": ((), ["parallel.tensor=2", "parallel.sequence=true"]),
    "hsdp2x1-pp2": ((), ["parallel.pipeline=2"]),
    "hsdp2x1-cp2-llama": (tuple(LLAMA), ["parallel.context=2"]),
    "hsdp2x2-recompute-llama": (tuple(LLAMA), ["train.recompute=block"]),
}


@pytest.mark.parametrize("layout", [pytest.param(k, marks=pytest.mark.layouts) if k == "hsdp2x2" else k
                                    for k in LAYOUTS])
def test_hsdp_layout_equals_one_process(data_dir, single, tmp_path, layout):
    model, extra = LAYOUTS[layout]
    out = tmp_path / layout
    proc = _train(data_dir, out, 4, *model, *HSDP, *extra)
    assert "(HSDP: 2 replicas x shards of" in proc.stdout, output(proc)
    one = single(*model)
    for key in ("loss", "grad_norm"):
        got, want = values(out, key), values(one, key)
        assert len(got) == len(want) == 10
        np.testing.assert_allclose(got, want, rtol=1e-4, err_msg=key)
    assert_close_weights(out, one, rtol=1e-3, atol=2e-5)


def _comm(out):
    return [r["comm_bytes"] for r in metrics(out) if "comm_bytes" in r]


def test_only_the_reduced_gradient_shards_cross_replicas(data_dir, tmp_path):
    hsdp, zero3 = tmp_path / "hsdp", tmp_path / "zero3"
    _train(data_dir, hsdp, 4, *HSDP, "train.log_communication=true", "train.save_every=0")
    _train(data_dir, zero3, 4, "parallel.zero_stage=3", "train.log_communication=true", "train.save_every=0")
    steps = _comm(hsdp)
    assert len(steps) == 10 and all(step == steps[0] for step in steps[1:])  # the same traffic every step
    crossing = {k: v for k, v in steps[0].items() if k.endswith("@replicate")}
    assert list(crossing) == ["all_reduce@replicate"], steps[0]
    shards = {k.split("@")[0]: v for k, v in steps[0].items() if k.endswith("@shard")}
    assert shards["all_gather_into_tensor"] > 0 and shards["reduce_scatter_tensor"] > 0
    # the gradient shard crosses once: its bytes are what a rank reduce-scatters over its replica, halved
    assert crossing["all_reduce@replicate"] * 2 == shards["reduce_scatter_tensor"]
    whole = _comm(zero3)[0]
    assert not any(k.endswith(("@shard", "@replicate")) for k in whole), whole
    assert whole["reduce_scatter_tensor@data"] == shards["reduce_scatter_tensor"]  # every gradient, once
    assert whole["all_gather_into_tensor@data"] * 2 == shards["all_gather_into_tensor"]  # four shards, not two


RESUMES = {"hsdp2x2->one-process": ((4, HSDP), (1, [])),
           "one-process->hsdp2x2": ((1, []), (4, HSDP)),
           "hsdp2x2->zero3x4-whole": ((4, HSDP), (4, ["parallel.zero_stage=3", "train.checkpoint_format=whole"]))}


@pytest.mark.parametrize("case", list(RESUMES))
def test_resume_across_hsdp(data_dir, single, tmp_path, case):
    first, second = RESUMES[case]
    out = tmp_path / "run"
    _train(data_dir, out, first[0], *first[1])
    shutil.rmtree(out / "checkpoints" / "step_000010")
    proc = _train(data_dir, out, second[0], *second[1], "resume=auto")
    assert "at step 5" in proc.stdout, output(proc)
    np.testing.assert_allclose(values(out, "loss"), values(single(), "loss"), rtol=1e-4)


@pytest.mark.parametrize("ranks,extra,message", [
    (4, ["parallel.data_replicate=2"], "parallel.data_replicate: expected 1 with parallel.zero_stage=0 (replicas of "
                                       "sharded groups are hybrid sharding, ZeRO-3's), got 2"),
    (4, ["parallel.zero_stage=3", "parallel.data_replicate=3"],
     "parallel.data_replicate: expected a divisor of the data-parallel size (4), got 3"),
])
def test_impossible_hsdp_layouts_are_refused(data_dir, tmp_path, ranks, extra, message):
    proc = _train(data_dir, tmp_path / "x", ranks, *extra, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, output(proc)
    assert "Traceback" not in proc.stderr
