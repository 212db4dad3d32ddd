"""Qwen3-MoE runs under ZeRO: data parallelism with ZeRO 1, 2 and 3 on 2 ranks, expert parallelism x data parallelism
(EP2 x DP2) with ZeRO 1, 2 and 3, ZeRO-3 with tensor and sequence parallelism (TP2 x DP2, TP2 x EP2) and hybrid
sharding (2 replicas of 2) on 4 ranks, give the one process's losses, gradient norms and router statistics with the
same global batch, and checkpoints holding its weights and AdamW state: top-1 of 16 experts leaves some experts
without a token in some steps, which AdamW skips in one process (their .grad is None), so the experts' step counts
differ and an expert no token has reached yet has no state, under ZeRO as in one process. Under ZeRO-3 with EP2 the
experts are sharded over their expert-data group, the rest over the data-parallel group. The EP2 x DP2 checkpoints
resume across layouts: ZeRO-1's whole one on one process, the one process's at EP2 x DP2 under ZeRO-1 and at ZeRO-3 x
EP2, ZeRO-2's sharded one at EP4 under ZeRO-1, ZeRO-3's sharded one on one process and at EP2 x DP2 under ZeRO-1
(ZeRO-3's whole one holds the one process's state as well)."""
import os
import re
import shutil

import numpy as np
import pytest

from infini_train.run_state import list_checkpoints, load_checkpoint
from tests.distributed.mpi_jobs import needs_mpiexec
from tests.training.test_expert_parallel_runs import COMMON, CONFIG, MOE_KEYS
from tests.training.tiny_run import metrics, run, tiny_args

pytestmark = pytest.mark.layouts

SAVES = ["train.save_every=2", "train.keep_last=0"]  # step 2's checkpoint: some experts have no state yet


@pytest.fixture(scope="module")
def one_process(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("one")
    _train(data_dir, out, *SAVES)
    return out


def _train(data_dir, out, *extra, ranks=1):
    return run(tiny_args(data_dir, out, "train.num_iterations=10", *COMMON, *extra), ranks=ranks, config=CONFIG)


def _values(out, key):
    return np.array([r[key] for r in metrics(out) if key in r and "loss" in r])


def _checkpoint(out, step):
    path = next(p for p in list_checkpoints(out) if os.path.basename(p) == f"step_{step:06d}")
    weights, optimizer, _ = load_checkpoint(path)
    # each parameter's AdamW state (None: it has none) in the param groups' order, the same in every layout
    return weights, [optimizer["state"].get(i) for g in optimizer["param_groups"] for i in g["params"]]


def _same_as(out, ref, steps=(2, 10)):
    for key in ("loss", "grad_norm") + MOE_KEYS:
        np.testing.assert_allclose(_values(out, key), _values(ref, key), rtol=1e-4, err_msg=key)
    for step in steps:
        mine, states = _checkpoint(out, step)
        ref_weights, ref_states = _checkpoint(ref, step)
        assert list(mine) == list(ref_weights)
        for name in ref_weights:
            np.testing.assert_allclose(np.asarray(mine[name]), np.asarray(ref_weights[name]), rtol=1e-4, atol=5e-5,
                                       err_msg=f"step {step} {name}")
        assert [st is None for st in states] == [st is None for st in ref_states], f"step {step}"
        for k, (st, ref_st) in enumerate(zip(states, ref_states)):
            if ref_st is None:
                continue
            assert st["step"] == ref_st["step"], (step, k, st["step"], ref_st["step"])
            for key in ("exp_avg", "exp_avg_sq"):
                np.testing.assert_allclose(np.asarray(st[key]), np.asarray(ref_st[key]), rtol=1e-3, atol=1e-7,
                                           err_msg=f"step {step} parameter {k} {key}")


def test_one_process_leaves_experts_unstepped(one_process):
    """What the comparisons below pin: experts idle in some steps, none of AdamW's state for the experts not reached
    by step 2, and step counts below 10 for those skipped later."""
    assert _values(one_process, "experts_idle").max() > 0
    _, early = _checkpoint(one_process, 2)
    _, final = _checkpoint(one_process, 10)
    assert 0 < sum(st is None for st in early) < len(early)
    steps = [st["step"] for st in final if st is not None]
    assert max(steps) == 10 and min(steps) < 10


@needs_mpiexec
@pytest.mark.parametrize("stage,fmt", [(1, "whole"), (2, "auto"), (3, "auto")], ids=["zero1", "zero2", "zero3"])
def test_data_parallel_zero_equals_one_process(data_dir, one_process, tmp_path, stage, fmt):
    out = tmp_path / "dp2"  # ZeRO-1 writes the whole (consolidated) checkpoint, 2 and 3 the sharded one
    proc = _train(data_dir, out, f"parallel.zero_stage={stage}", f"train.checkpoint_format={fmt}", *SAVES, ranks=2)
    assert f"memory (ZeRO stage {stage}" in proc.stdout
    _same_as(out, one_process)


EP_RESUMES = {  # (source: the run itself or one process, ranks, the layout it resumes in)
    (1, "whole"): [("run", 1, ()), ("one", 4, ("parallel.expert=2", "parallel.zero_stage=1"))],
    (2, "auto"): [("run", 1, ()), ("run", 4, ("parallel.expert=4", "parallel.zero_stage=1"))],  # 4 experts a rank
    (3, "auto"): [("run", 1, ()), ("run", 4, ("parallel.expert=2", "parallel.zero_stage=1")),
                  ("one", 4, ("parallel.expert=2", "parallel.zero_stage=3"))],
    (3, "whole"): []}


@needs_mpiexec
@pytest.mark.parametrize("stage,fmt", list(EP_RESUMES), ids=["zero1", "zero2", "zero3", "zero3-whole"])
def test_expert_parallel_zero_equals_one_process_and_resumes_across_layouts(data_dir, one_process, tmp_path, stage,
                                                                            fmt):
    out = tmp_path / "ep2xdp2"  # the whole format gathers the experts on rank 0, the sharded one has each rank write
    samples = ["train.val_loss_every=5", "train.sample_every=5", "train.sample_length=8"] if stage == 3 else []
    proc = _train(data_dir, out, "parallel.expert=2", f"parallel.zero_stage={stage}", f"train.checkpoint_format={fmt}",
                  *SAVES, *samples, ranks=4)
    assert "expert parallel 2" in proc.stdout and f"memory (ZeRO stage {stage}" in proc.stdout
    if stage == 3:  # a quarter of the model a rank: the dense parameters over 4 ranks, its experts over 2; validation
        # and samples gather every block on every rank
        assert "--- sample at step 5 ---" in proc.stdout and "step 10: val loss" in proc.stdout
        whole, per_rank = re.search(r"parameters: ([\d,]+) .*; per rank ([\d,]+)", proc.stdout).groups()
        assert int(per_rank.replace(",", "")) == int(whole.replace(",", "")) // 4
    _same_as(out, one_process)
    for k, (source, ranks, extra) in enumerate(EP_RESUMES[(stage, fmt)]):  # the step-6 checkpoint, continued
        source = out if source == "run" else one_process
        resumed = tmp_path / f"resumed{k}"
        shutil.copytree(source, resumed)
        for step in (8, 10):
            shutil.rmtree(resumed / "checkpoints" / f"step_{step:06d}")
        proc = _train(data_dir, resumed, *SAVES, *extra, "resume=auto", ranks=ranks)
        assert "resumed from" in proc.stdout and "at step 6" in proc.stdout
        _same_as(resumed, source, steps=(10,))


@needs_mpiexec
@pytest.mark.parametrize("layout", [["parallel.tensor=2", "parallel.sequence=true"],
                                    ["parallel.tensor=2", "parallel.sequence=true", "parallel.expert=2"]],
                         ids=["tp2sp-x-dp2", "tp2sp-x-ep2"])
def test_zero3_with_tensor_parallelism_equals_one_process(data_dir, one_process, tmp_path, layout):
    """The tensor ranks route their own slices of the sequence: the experts' gradient shards are summed over the
    tensor group, and AdamW skips an expert only where no rank of the data and tensor groups got a gradient for it."""
    out = tmp_path / "tp2"
    proc = _train(data_dir, out, *layout, "parallel.zero_stage=3", *SAVES, ranks=4)
    assert "tensor parallel 2 with sequence parallel" in proc.stdout and "memory (ZeRO stage 3" in proc.stdout
    _same_as(out, one_process)


@needs_mpiexec
def test_hybrid_sharding_skips_the_experts_no_replica_reached(data_dir, one_process, tmp_path):
    """HSDP (2 replicas of 2 ranks): the replicas read different batches, so the experts no rank got a gradient for
    are agreed over the replicate group too (a replica that skipped an expert the other stepped drifted from it)."""
    out = tmp_path / "hsdp"
    _train(data_dir, out, "parallel.zero_stage=3", "parallel.data_replicate=2", *SAVES, ranks=4)
    _same_as(out, one_process)


# top-2 of 8: a block's experts all get tokens on one rank in some micro-batches and not on the other, so a unit that
# reduced its gradients as soon as they were all in would start its reduce-scatter at a different point on each rank
TOP2 = ["model.num_experts=8", "model.num_experts_per_tok=2", "train.num_iterations=6"]


@needs_mpiexec
def test_zero3_reduces_expert_units_in_the_same_order_on_every_rank(data_dir, tmp_path):
    one = tmp_path / "one"
    _train(data_dir, one, *TOP2)
    for k in range(2):  # (the collectives once matched differently from run to run: twice, each equal)
        out = tmp_path / f"zero3_{k}"
        _train(data_dir, out, *TOP2, "parallel.zero_stage=3", ranks=2)
        for key in ("loss", "grad_norm") + MOE_KEYS:
            np.testing.assert_allclose(_values(out, key), _values(one, key), rtol=1e-5, err_msg=key)
