"""Qwen3-MoE and Mixtral runs in every model-parallel layout with and without expert parallelism: pipeline stages
(PP2), EP2 x PP2 (each stage's experts split over an expert group of its two data-parallel ranks; under ZeRO 1 and 3
too), tensor parallelism of the attention (the experts whole on every tensor rank; Qwen3-MoE with sequence
parallelism, each rank routing its slice of the sequence) and TP2 x EP2. Over 10 steps each gives the one process's
losses, gradient norms and router statistics with the same global batch -- the auxiliary loss pools every stage's and
every slice's sparse layers, its gradient reaching the first stage's routers through the pipeline -- and its
checkpoint holds the one process's weights and AdamW state and resumes on one process; a one-process checkpoint
resumes in the split layouts."""
import os
import re
import shutil

import numpy as np
import pytest

from infini_train.run_state import list_checkpoints, load_checkpoint
from infini_train.training.config import ConfigError, load_config
from tests.distributed.mpi_jobs import needs_mpiexec
from tests.training.tiny_run import REPO, metrics, run, tiny_args

pytestmark = pytest.mark.layouts

CONFIG = os.path.join(REPO, "configs", "qwen3_moe_tiny.yaml")
# every layer sparse (two per stage), top-1 of 16 experts: some experts get no token in some steps
COMMON = ["model.n_layer=4", "model.mlp_only_layers=[]", "train.total_batch_size=256", "train.batch_size=2",
          "train.val_loss_every=0", "train.learning_rate=3e-3", "model.num_experts=16", "model.num_experts_per_tok=1",
          "model.moe_intermediate_size=32", "model.intermediate_size=128", "train.save_every=5"]
KEYS = ("loss", "grad_norm", "aux_loss", "expert_load_max", "experts_idle")


def _train(data_dir, out, *extra, ranks=1):
    return run(tiny_args(data_dir, out, "train.num_iterations=10", *COMMON, *extra), ranks=ranks, config=CONFIG)


def _values(out, key):
    return np.array([r[key] for r in metrics(out) if key in r and "loss" in r])


def _same_as(out, ref, rtol):
    for key in KEYS:
        np.testing.assert_allclose(_values(out, key), _values(ref, key), rtol=rtol, err_msg=key)


def _same_checkpoint(path, ref_path):
    """The same names, weights and AdamW state (experts no token reached have none in both). Weights within 2e-4:
    AdamW's steps are about the learning rate whatever the gradient's size, so a near-zero gradient summed in
    another order moves its element by up to ~lr x steps differently."""
    mine, opt, _ = load_checkpoint(path)
    ref, ref_opt, _ = load_checkpoint(ref_path)
    assert sorted(mine) == sorted(ref)
    for name in ref:
        np.testing.assert_allclose(np.asarray(mine[name]), np.asarray(ref[name]), rtol=1e-4, atol=2e-4, err_msg=name)
    assert [g["params"] for g in opt["param_groups"]] == [g["params"] for g in ref_opt["param_groups"]]
    assert sorted(opt["state"]) == sorted(ref_opt["state"])
    for i, st in ref_opt["state"].items():
        assert opt["state"][i]["step"] == st["step"]
        for key in ("exp_avg", "exp_avg_sq"):
            np.testing.assert_allclose(np.asarray(opt["state"][i][key]), np.asarray(st[key]), rtol=1e-3, atol=1e-7,
                                       err_msg=f"{i} {key}")


@pytest.fixture(scope="module")
def one_process(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("one")
    (out / "stdout.txt").write_text(_train(data_dir, out).stdout)
    return out


def _parameters(stdout):
    """The parameter count of the run's first line."""
    return re.search(r"parameters: ([\d,]+)", stdout).group(1)


LAYOUTS = {"pp2": (2, ["parallel.pipeline=2"], "pipeline 2 (1f1b) x data parallel 1"),
           "ep2xpp2": (4, ["parallel.pipeline=2", "parallel.expert=2"],
                       "pipeline 2 (1f1b) x data parallel 2 x expert parallel 2"),
           "tp2": (2, ["parallel.tensor=2", "parallel.sequence=true"],
                   "data parallel 1 x tensor parallel 2 with sequence parallel"),
           "tp2xep2": (4, ["parallel.tensor=2", "parallel.sequence=true", "parallel.expert=2"],
                       "data parallel 2 x expert parallel 2 x tensor parallel 2 with sequence parallel"),
           # ZeRO skips an expert no rank of the data group (and, under sequence parallelism, of the tensor group)
           # reached, as one process's AdamW skips its gradient of None
           "ep2xpp2-zero1": (4, ["parallel.pipeline=2", "parallel.expert=2", "parallel.zero_stage=1"],
                             "pipeline 2 (1f1b) x data parallel 2 x expert parallel 2"),
           "tp2xdp2-zero2": (4, ["parallel.tensor=2", "parallel.sequence=true", "parallel.zero_stage=2"],
                             "data parallel 2 x tensor parallel 2 with sequence parallel"),
           # ZeRO-3: each stage's experts sharded over their expert-data group within their blocks' units
           "ep2xpp2-zero3": (4, ["parallel.pipeline=2", "parallel.expert=2", "parallel.zero_stage=3"],
                             "pipeline 2 (1f1b) x data parallel 2 x expert parallel 2"),
           # zero-bubble schedules: split backwards, the router statistics and aux losses through a V of chunks
           "pp2-dualpipev": (2, ["parallel.pipeline=2", "parallel.pipeline_schedule=dualpipev",
                                 "parallel.virtual_pipeline=2"], "pipeline 2 (dualpipev, 2 chunks per stage)"),
           "ep2xpp2-zbv": (4, ["parallel.pipeline=2", "parallel.expert=2", "parallel.pipeline_schedule=zbv",
                               "parallel.virtual_pipeline=2"], "pipeline 2 (zbv, 2 chunks per stage) x data parallel 2 "
                                                              "x expert parallel 2")}


@needs_mpiexec
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_split_moe_equals_one_process_and_resumes_there(data_dir, one_process, tmp_path, layout):
    ranks, extra, described = LAYOUTS[layout]
    out = tmp_path / "run"
    proc = _train(data_dir, out, *extra, "train.sample_every=5", "train.sample_length=8", ranks=ranks)
    assert described in proc.stdout and "--- sample at step 5 ---" in proc.stdout
    assert _parameters(proc.stdout) == _parameters((one_process / "stdout.txt").read_text())  # the whole model's
    assert len(_values(out, "loss")) == 10 and _values(one_process, "experts_idle").max() > 0
    _same_as(out, one_process, rtol=1e-4)
    _same_checkpoint(list_checkpoints(out)[-1], list_checkpoints(one_process)[-1])

    resumed = tmp_path / "resumed"  # its step-5 checkpoint continued by one process
    shutil.copytree(out, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_000010")
    proc = _train(data_dir, resumed, "resume=auto")
    assert "resumed from" in proc.stdout
    _same_as(resumed, out, rtol=1e-4)


@needs_mpiexec
@pytest.mark.parametrize("layout", ["ep2xpp2", "tp2xep2"])
def test_one_process_checkpoint_resumes_split(data_dir, one_process, tmp_path, layout):
    ranks, extra, _ = LAYOUTS[layout]
    back = tmp_path / "back"
    shutil.copytree(one_process, back)
    shutil.rmtree(back / "checkpoints" / "step_000010")
    proc = _train(data_dir, back, *extra, "resume=auto", ranks=ranks)
    assert "resumed from" in proc.stdout
    _same_as(back, one_process, rtol=1e-4)
    _same_checkpoint(list_checkpoints(back)[-1], list_checkpoints(one_process)[-1])


def test_whole_checkpoints_of_expert_and_model_parallel_runs_are_refused():
    with pytest.raises(ConfigError) as info:
        load_config(CONFIG, ["parallel.expert=2", "parallel.pipeline=2", "train.checkpoint_format=whole"])
    assert info.value.errors == [
        "train.checkpoint_format: expected 'sharded' or 'auto' with parallel.expert=2 and parallel.pipeline=2 (each "
        "rank writes its experts and its part of the rest; the whole format gathers experts over data-parallel ranks "
        "only), got 'whole'; HINT: set train.checkpoint_format=auto -- a sharded checkpoint resumes under any "
        "layout, one process included"]
    assert load_config(CONFIG, ["parallel.expert=2", "parallel.pipeline=2"]).parallel.pipeline == 2
    refused = load_config_errors(["parallel.expert=2", "parallel.tensor=2", "parallel.sequence=true",
                                  "train.checkpoint_format=whole"])
    assert refused[0].startswith("train.checkpoint_format: expected 'sharded' or 'auto' with parallel.expert=2 and "
                                 "parallel.tensor=2 (")
    assert load_config_errors(["parallel.tensor=2"]) == [  # Qwen3's per-head norms need the sequence-parallel sum
        "parallel.sequence: expected true for model.arch=qwen3_moe with parallel.tensor=2 (the gradients of the "
        "per-head q_norm / k_norm weights are partial sums over the tensor group, which the sequence-parallel gradient "
        "sum completes), got false; HINT: add parallel.sequence=true"]


def load_config_errors(overrides, config=CONFIG):
    with pytest.raises(ConfigError) as info:
        load_config(config, overrides)
    return info.value.errors


@needs_mpiexec
@pytest.mark.parametrize("precision", ["bf16-mixed", "fp16-mixed"])
def test_mixed_precision_ep2_x_pp2_follows_one_process(data_dir, tmp_path, precision):
    """Under autocast the experts' results travel back in the low dtype: a rank whose experts got no token must send
    (nothing) in that dtype too, or the exchange mixes buffers of two dtypes (the gradient norm went NaN). Low
    precision rounds the stages' and ranks' sums in another order, and a near-tie of the router can go the other way
    (so idle experts are not compared): the losses agree to 2e-3, the norms and auxiliary losses to 1e-2."""
    one, split = tmp_path / "one", tmp_path / "split"
    _train(data_dir, one, f"precision={precision}", "train.save_every=0")
    _train(data_dir, split, f"precision={precision}", "train.save_every=0", "parallel.pipeline=2",
           "parallel.expert=2", ranks=4)
    assert np.isfinite(_values(split, "grad_norm")).all()
    np.testing.assert_allclose(_values(split, "loss"), _values(one, "loss"), rtol=2e-3)
    for key in ("grad_norm", "aux_loss"):
        np.testing.assert_allclose(_values(split, key), _values(one, key), rtol=1e-2, err_msg=key)


MIXTRAL = os.path.join(REPO, "configs", "mixtral_tiny.yaml")
MIXTRAL_SHAPE = ["model.n_layer=2", "model.n_kv_head=2", "train.total_batch_size=256", "train.batch_size=2",
                 "train.val_loss_every=0", "train.learning_rate=3e-3", "model.num_experts=8",
                 "model.intermediate_size=32", "train.save_every=0", "train.num_iterations=8"]


@needs_mpiexec
def test_mixtral_tensor_and_expert_parallel_equal_one_process(data_dir, tmp_path):
    """Mixtral (no per-head norms) splits its attention without sequence parallelism: every tensor rank runs the
    experts on the same tokens."""
    def train(out, *extra, ranks=1):
        return run(tiny_args(data_dir, out, *MIXTRAL_SHAPE, *extra), ranks=ranks, config=MIXTRAL)

    train(tmp_path / "one")
    for name, ranks, extra in (("tp2", 2, ["parallel.tensor=2"]),
                               ("tp2xep2", 4, ["parallel.tensor=2", "parallel.expert=2"])):
        proc = train(tmp_path / name, *extra, ranks=ranks)
        assert "tensor parallel 2" in proc.stdout and "sequence" not in proc.stdout.split("tensor parallel 2")[1][:20]
        _same_as(tmp_path / name, tmp_path / "one", rtol=1e-4)
