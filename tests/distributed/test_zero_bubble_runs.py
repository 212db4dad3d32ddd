"""Zero-bubble pipeline schedules in training runs of the tiny GPT-2: zb1p, zbv and dualpipev, whose backwards split
into input and weight halves, against the one-process run with the same global batch over 10 steps (losses, gradient
norms, validation, final weights): PP2 and PP4, with DP2 and ZeRO 1 / 2 / 3, TP2 + SP, recomputation, bf16-mixed
(against 1F1B's bf16 run); checkpoints resume under another schedule (and on one process). The MoE model's runs are in
tests/training/test_moe_layout_runs.py."""
import shutil

import numpy as np
import pytest

from tests.distributed.mpi_jobs import needs_mpiexec, output
from tests.training.tiny_run import assert_close_weights, reference_runs, run, tiny_args, values

pytestmark = needs_mpiexec

SHAPE = ["model.n_layer=4", "train.total_batch_size=512", "train.grad_clip=0.5", "train.learning_rate=3e-3",
         "train.val_loss_every=5", "train.save_every=5"]
# eight one-layer chunks for a V over four stages, and the global batch of 8 micro-batches dualpipev needs at DP2
DEEP = ["model.n_layer=8", "model.n_embd=32", "train.total_batch_size=1024"]


def _train(data_dir, out, ranks, *extra, steps=10):
    return run(tiny_args(data_dir, out, f"train.num_iterations={steps}", *SHAPE, *extra), ranks=ranks)


def _schedule(name, stages=2):
    return [f"parallel.pipeline={stages}", f"parallel.pipeline_schedule={name}",
            f"parallel.virtual_pipeline={2 if name in ('zbv', 'dualpipev', 'interleaved') else 1}"]


@pytest.fixture(scope="module")
def single(data_dir, tmp_path_factory):
    return reference_runs(lambda: tmp_path_factory.mktemp("single"),
                          lambda out, *extra: _train(data_dir, out, 1, *extra))


LAYOUTS = {f"pp2-{s}": (2, _schedule(s), ()) for s in ("zb1p", "zbv", "dualpipev")}
LAYOUTS.update({
    "pp4-zb1p": (4, _schedule("zb1p", 4), ()),
    "pp4-zbv": (4, _schedule("zbv", 4), DEEP),
    "pp4-dualpipev": (4, _schedule("dualpipev", 4), DEEP),
    "pp2xdp2-zbv": (4, _schedule("zbv"), ()),
    "pp2xdp2-zb1p-zero1": (4, _schedule("zb1p") + ["parallel.zero_stage=1"], ()),
    "pp2xdp2-zbv-zero2": (4, _schedule("zbv") + ["parallel.zero_stage=2"], ()),
    "pp2xdp2-dualpipev-zero1": (4, _schedule("dualpipev") + ["parallel.zero_stage=1"], DEEP),
    "pp2xdp2-dualpipev-zero3-recompute": (4, _schedule("dualpipev") + ["parallel.zero_stage=3",
                                                                       "train.recompute=block"], DEEP),
    "pp2xtp2-sp-zbv": (4, _schedule("zbv") + ["parallel.tensor=2", "parallel.sequence=true"], ()),
    "pp2xtp2-sp-dualpipev": (4, _schedule("dualpipev") + ["parallel.tensor=2", "parallel.sequence=true"], ()),
    "pp2-zb1p-recompute": (2, _schedule("zb1p") + ["train.recompute=block"], ()),
})
FAST = {"pp2-zbv", "pp2xdp2-zbv-zero2"}  # also in the layouts pass


@pytest.mark.parametrize("layout", [pytest.param(k, marks=pytest.mark.layouts) if k in FAST else k for k in LAYOUTS])
def test_zero_bubble_layout_equals_one_process(data_dir, single, tmp_path, layout):
    ranks, extra, shape = LAYOUTS[layout]
    out = tmp_path / layout
    proc = _train(data_dir, out, ranks, *shape, *extra)
    world = next(line for line in proc.stdout.splitlines() if line.startswith("world "))
    assert f"PP{extra[0].split('=')[1]} ({extra[1].split('=')[1]}" in world, world
    one = single(*shape)
    for key in ("loss", "grad_norm") + (() if "dp2" in layout else ("val_loss",)):
        got, want = values(out, key), values(one, key)
        assert len(got) == len(want) > 1
        np.testing.assert_allclose(got, want, rtol=1e-4, err_msg=key)
    assert_close_weights(out, one, rtol=1e-3, atol=2e-5)


def test_bf16_mixed_zbv_equals_1f1b(data_dir, tmp_path):
    runs = {}
    for name in ("1f1b", "zbv"):
        runs[name] = tmp_path / name
        _train(data_dir, runs[name], 2, *_schedule(name), "precision=bf16-mixed")
    for key in ("loss", "grad_norm", "val_loss"):
        np.testing.assert_allclose(values(runs["zbv"], key), values(runs["1f1b"], key), rtol=1e-4, err_msg=key)


RESUMES = {"zbv->one-process": ((2, _schedule("zbv")), (1, [])),
           "1f1b->dualpipev": ((2, _schedule("1f1b")), (2, _schedule("dualpipev"))),
           "zb1p-pp4->zbv-pp2": ((4, _schedule("zb1p", 4)), (2, _schedule("zbv")))}


@pytest.mark.parametrize("case", list(RESUMES))
def test_resume_under_another_schedule(data_dir, single, tmp_path, case):
    first, second = RESUMES[case]
    out = tmp_path / "run"
    _train(data_dir, out, first[0], *first[1])
    shutil.rmtree(out / "checkpoints" / "step_000010")
    proc = _train(data_dir, out, second[0], *second[1], "resume=auto")
    assert "at step 5" in proc.stdout, output(proc)
    np.testing.assert_allclose(values(out, "loss"), values(single(), "loss"), rtol=1e-4)
