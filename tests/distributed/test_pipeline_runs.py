"""Pipeline-parallel training runs of the tiny GPT-2 (4 layers) against the one-process run with the same global
batch, for every schedule: PP2 on 2 ranks, PP2 x DP2 and PP2 x TP2 on 4, with ZeRO, PP4, and PP2 x DP2 x TP2 on 8;
validation and samples during the run; checkpoints that are the one-process files and resume at another pipeline
size; a dropout run that resumes bitwise; the stages against the whole model; the impossible layouts refused."""
import shutil

import numpy as np
import pytest

from infini_train.run_state import list_checkpoints, load_checkpoint
from tests.distributed.mpi_jobs import mpirun, needs_mpiexec, output
from tests.training.tiny_run import metrics, run, same_run, tiny_args

pytestmark = needs_mpiexec

SHAPE = ["model.n_layer=4", "train.total_batch_size=512", "train.grad_clip=0.5", "train.learning_rate=3e-3",
         "train.val_loss_every=5", "train.sample_every=5", "train.sample_length=24"]


def _train(data_dir, out, ranks, *extra, steps=10, check=True):
    return run(tiny_args(data_dir, out, f"train.num_iterations={steps}", *SHAPE, *extra), ranks=ranks, check=check)


def _values(out, key):
    return np.array([r[key] for r in metrics(out) if key in r])


def _samples(stdout):
    return [block.split("---")[1] for block in stdout.split("--- sample at step")[1:]]


@pytest.fixture(scope="module")
def single(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("single")
    proc = _train(data_dir, out, 1, "train.save_every=5")
    return out, _samples(proc.stdout)


def _pp(schedule):
    return ["parallel.pipeline=2", f"parallel.pipeline_schedule={schedule}",
            f"parallel.virtual_pipeline={2 if schedule == 'interleaved' else 1}"]


LAYOUTS = {f"pp2-{s}": (2, _pp(s)) for s in ("gpipe", "1f1b", "interleaved")}
LAYOUTS.update({f"pp2xdp2-{s}": (4, _pp(s)) for s in ("gpipe", "1f1b", "interleaved")})
LAYOUTS.update({f"pp2xtp2-{s}": (4, _pp(s) + ["parallel.tensor=2"]) for s in ("gpipe", "1f1b", "interleaved")})
LAYOUTS["pp2xdp2-1f1b-zero2"] = (4, _pp("1f1b") + ["parallel.zero_stage=2"])
LAYOUTS["pp2xtp2-sp-1f1b"] = (4, _pp("1f1b") + ["parallel.tensor=2", "parallel.sequence=true"])
LAYOUTS["pp2xdp2-gpipe-zero1"] = (4, _pp("gpipe") + ["parallel.zero_stage=1"])
LAYOUTS["pp4-1f1b"] = (4, ["parallel.pipeline=4"])
LAYOUTS["pp2xdp2xtp2-sp-interleaved-zero1"] = (8, _pp("interleaved") + ["parallel.tensor=2", "parallel.sequence=true",
                                                                       "parallel.zero_stage=1"])


@pytest.mark.layouts
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layout_gives_the_losses_samples_and_weights_of_one_process(data_dir, single, tmp_path, layout):
    ranks, extra = LAYOUTS[layout]
    out = tmp_path / layout
    proc = _train(data_dir, out, ranks, *extra)
    world_line = next(line for line in proc.stdout.splitlines() if line.startswith("world "))
    assert world_line.startswith(f"world {ranks} = PP"), world_line
    one, one_samples = single
    # (with two data-parallel replicas each validates on its own half of the batches)
    for key in ("loss", "grad_norm") + (() if "dp2" in layout else ("val_loss",)):
        np.testing.assert_allclose(_values(out, key), _values(one, key), rtol=1e-4, err_msg=key)
    assert _samples(proc.stdout) == one_samples and len(one_samples) == 2  # generated through the stages
    mine, opt, _ = load_checkpoint(list_checkpoints(out)[-1])
    ref, ref_opt, _ = load_checkpoint(list_checkpoints(one)[-1])
    assert list(mine) == list(ref)
    for name in ref:
        np.testing.assert_allclose(np.asarray(mine[name]), np.asarray(ref[name]), rtol=1e-3, atol=2e-5, err_msg=name)
    assert [len(g["params"]) for g in opt["param_groups"]] == [len(g["params"]) for g in ref_opt["param_groups"]]
    for group, ref_group in zip(opt["param_groups"], ref_opt["param_groups"]):
        for i, j in zip(group["params"], ref_group["params"]):
            for key in ("exp_avg", "exp_avg_sq"):
                np.testing.assert_allclose(np.asarray(opt["state"][i][key]), np.asarray(ref_opt["state"][j][key]),
                                           rtol=1e-2, atol=1e-6, err_msg=f"{key} of parameter {j}")


@pytest.mark.layouts
@pytest.mark.parametrize("first,second", [((2, ["parallel.pipeline=2"]), (1, [])),
                                          ((1, []), (2, _pp("interleaved"))),
                                          ((4, _pp("1f1b") + ["parallel.tensor=2"]), (4, ["parallel.pipeline=4"]))],
                         ids=["pp2->1", "1->pp2-interleaved", "pp2xtp2->pp4"])
def test_resume_with_another_pipeline_size(data_dir, single, tmp_path, first, second):
    out = tmp_path / "run"
    _train(data_dir, out, first[0], *first[1], "train.save_every=5")
    shutil.rmtree(out / "checkpoints" / "step_000010")
    proc = _train(data_dir, out, second[0], *second[1], "train.save_every=5", "resume=auto")
    assert "at step 5" in proc.stdout, output(proc)
    np.testing.assert_allclose(_values(out, "loss"), _values(single[0], "loss"), rtol=1e-4)


def test_dropout_run_resumes_bitwise(data_dir, tmp_path):
    dropout = _pp("interleaved") + ["model.dropout=0.1", "train.save_every=4", "train.sample_every=0"]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    _train(data_dir, whole, 2, *dropout, steps=8)
    shutil.copytree(whole, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_000008")
    proc = _train(data_dir, resumed, 2, *dropout, "resume=auto", steps=8)
    assert "at step 4" in proc.stdout
    same_run(whole, resumed)


@pytest.mark.layouts
@pytest.mark.parametrize("ranks", [2, 4])
def test_pipeline_stages_equal_the_whole_model_for_every_schedule(ranks):
    proc = mpirun(ranks, "worker_pipeline.py", timeout=180)
    assert proc.returncode == 0, output(proc)
    assert proc.stdout.count("pipeline ok") == ranks, output(proc)


def test_data_parallel_pipeline_chunks_reduce_once_per_step_in_their_last_backward():
    proc = mpirun(4, "worker_pipeline_ddp.py", timeout=240)
    assert proc.returncode == 0, output(proc)
    assert proc.stdout.count("pipeline ddp ok") == 4, output(proc)


@pytest.mark.parametrize("ranks,extra,message", [
    (2, ["parallel.pipeline=2", "parallel.pipeline_schedule=interleaved", "parallel.virtual_pipeline=2",
         "train.total_batch_size=384"],
     "interleaved needs the micro-batches per step (gradient-accumulation steps, 3) to be a multiple of "
     "parallel.pipeline (2)"),
    (1, ["parallel.pipeline=3"], "model.n_layer: expected a multiple of parallel.pipeline x parallel.virtual_pipeline"
                                 " = 3 x 1 = 3 (equal model chunks), got 4"),
    (1, ["parallel.virtual_pipeline=2"], "parallel.virtual_pipeline: expected 1 with parallel.pipeline_schedule="
                                         "'1f1b' (only interleaved, zbv and dualpipev run several chunks per stage), "
                                         "got 2"),
    (1, ["parallel.pipeline_schedule=1fb1"], "parallel.pipeline_schedule: expected one of ('gpipe', '1f1b', "
                                             "'interleaved', 'zb1p', 'zbv', 'dualpipev') (did you mean '1f1b'?)"),
    (2, ["parallel.pipeline=2", "parallel.pipeline_schedule=zbv"],
     "parallel.virtual_pipeline: expected 2 with parallel.pipeline_schedule=zbv (two model chunks per stage, in a V), "
     "got 1"),
    (2, ["parallel.pipeline=2", "parallel.pipeline_schedule=dualpipev", "parallel.virtual_pipeline=2",
         "train.total_batch_size=256"],
     "parallel.pipeline_schedule: dualpipev needs at least 2 x parallel.pipeline (2) - 1 = 3 micro-batches per step "
     "(gradient-accumulation steps), got 2"),
    (3, ["parallel.pipeline=2"], "parallel: the world of 3 ranks is not divisible by tensor x pipeline = 1 x 2 = 2"),
])
def test_impossible_pipeline_layouts_are_refused(data_dir, tmp_path, ranks, extra, message):
    proc = _train(data_dir, tmp_path / "x", ranks, *extra, steps=1, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, output(proc)
    assert "Traceback" not in proc.stderr
