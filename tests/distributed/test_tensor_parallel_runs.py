"""Tensor- and sequence-parallel training runs of the tiny GPT-2 against the one-process run with the same global
batch: TP2 on 2 ranks and TP2 x DP2 on 4 (with and without sequence parallelism, with ZeRO-2), dropout runs that
resume bitwise, checkpoints that resume at another tensor size and generate the same greedy text in one process as
under mpirun, and the layout errors."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from infini_train.run_state import list_checkpoints, load_checkpoint
from infini_train.training.config import ConfigError, load_config
from tests.distributed.mpi_jobs import MPIEXEC, REPO, job_env, mpirun, needs_mpiexec, output
from tests.training.tiny_run import CONFIG, metrics, run, same_run, tiny_args

pytestmark = [needs_mpiexec, pytest.mark.layouts]

GENERATE = os.path.join(REPO, "examples", "gpt2", "generate.py")
# 4 heads so that tensor sizes 1, 2 and 4 all divide; clipping on (the global norm must count every shard once)
SHAPE = ["model.n_head=4", "train.val_loss_every=0", "train.grad_clip=0.5", "train.learning_rate=3e-3",
         "train.total_batch_size=256"]


def _train(data_dir, out, ranks, *extra, steps=10, check=True):
    return run(tiny_args(data_dir, out, f"train.num_iterations={steps}", *SHAPE, *extra), ranks=ranks, check=check)


def _values(out, key):
    return np.array([r[key] for r in metrics(out) if key in r])


@pytest.fixture(scope="module")
def single(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("single")
    _train(data_dir, out, 1, "train.save_every=5")
    return out


LAYOUTS = {
    "tp2": (2, ["parallel.tensor=2"]),
    "tp2xdp2": (4, ["parallel.tensor=2"]),
    "tp2xdp2-sp": (4, ["parallel.tensor=2", "parallel.sequence=true"]),
    "tp2xdp2-sp-zero2": (4, ["parallel.tensor=2", "parallel.sequence=true", "parallel.zero_stage=2"]),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layout_gives_the_losses_and_weights_of_one_process(data_dir, single, tmp_path, layout):
    ranks, extra = LAYOUTS[layout]
    out = tmp_path / layout
    proc = _train(data_dir, out, ranks, *extra)
    assert "tensor parallel 2" in proc.stdout and f"data parallel {ranks // 2}" in proc.stdout
    np.testing.assert_allclose(_values(out, "loss"), _values(single, "loss"), rtol=1e-4)
    np.testing.assert_allclose(_values(out, "grad_norm"), _values(single, "grad_norm"), rtol=1e-4)
    # the checkpoint holds whole tensors: the names, shapes and (up to summation order) values of the one-process run
    mine, opt, _ = load_checkpoint(list_checkpoints(out)[-1])
    ref, ref_opt, _ = load_checkpoint(list_checkpoints(single)[-1])
    assert list(mine) == list(ref)
    for name in ref:
        np.testing.assert_allclose(np.asarray(mine[name]), np.asarray(ref[name]), rtol=1e-3, atol=2e-5, err_msg=name)
    # the optimizer state is whole too (ZeRO numbers the parameters in its flat order: pair them group by group)
    assert len(opt["param_groups"]) == len(ref_opt["param_groups"])
    for group, ref_group in zip(opt["param_groups"], ref_opt["param_groups"]):
        for i, j in zip(group["params"], ref_group["params"], strict=True):
            assert opt["state"][i]["step"] == ref_opt["state"][j]["step"]
            for key in ("exp_avg", "exp_avg_sq"):
                np.testing.assert_allclose(np.asarray(opt["state"][i][key]), np.asarray(ref_opt["state"][j][key]),
                                           rtol=1e-2, atol=1e-6, err_msg=f"{key} of parameter {j}")


def test_per_rank_parameters_gradients_and_optimizer_state_halve_at_tp2(data_dir, tmp_path):
    line = {}
    for ranks, extra in ((1, []), (2, ["parallel.tensor=2"])):
        proc = _train(data_dir, tmp_path / str(ranks), ranks, *extra, steps=1)
        line[ranks] = next(x for x in proc.stdout.splitlines() if x.startswith("memory (ZeRO stage 0,"))

    def megabytes(text, what):
        return [float(part.split(f"{what} ")[1].split(" MB")[0]) for part in text.split("rank ")[1:]]

    for what in ("parameters", "gradients", "optimizer state"):
        one, two = megabytes(line[1], what)[0], megabytes(line[2], what)
        assert len(two) == 2 and all(0.4 * one < v < 0.65 * one for v in two), (what, one, two)


def test_dropout_run_is_deterministic_and_resumes_bitwise(data_dir, single, tmp_path):
    dropout = ["parallel.tensor=2", "parallel.sequence=true", "model.dropout=0.1", "train.save_every=4"]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    _train(data_dir, whole, 4, *dropout, steps=8)
    shutil.copytree(whole, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_000008")  # as if stopped after step 4
    proc = _train(data_dir, resumed, 4, *dropout, "resume=auto", steps=8)
    assert "resumed from" in proc.stdout and "at step 4" in proc.stdout
    same_run(whole, resumed)
    # dropout was on: the losses are not those of the dropout-free run
    assert not np.allclose(_values(whole, "loss")[1:], _values(single, "loss")[1:8], rtol=1e-3)


@pytest.mark.parametrize("first,second", [((2, 2), (1, 1)), ((1, 1), (4, 4)), ((4, 2), (2, 2))],
                         ids=["tp2->1", "1->tp4", "tp2xdp2->tp2"])
def test_resume_with_another_tensor_size(data_dir, single, tmp_path, first, second):
    out = tmp_path / "run"
    _train(data_dir, out, first[0], f"parallel.tensor={first[1]}", "train.save_every=5")
    shutil.rmtree(out / "checkpoints" / "step_000010")
    proc = _train(data_dir, out, second[0], f"parallel.tensor={second[1]}", "train.save_every=5", "resume=auto")
    assert "at step 5" in proc.stdout, output(proc)
    np.testing.assert_allclose(_values(out, "loss"), _values(single, "loss"), rtol=1e-4)


def _generate(checkpoint, ranks):
    args = [sys.executable, GENERATE, "--checkpoint", str(checkpoint), "--prompt", "def ", "--temperature", "0",
            "--max-new-tokens", "40"]
    if ranks > 1:
        args = [MPIEXEC, "-n", str(ranks), *args]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120, env=job_env(), cwd=REPO)
    assert proc.returncode == 0, output(proc)
    return proc.stdout


def test_tp_checkpoint_generates_the_same_greedy_text_in_one_process_and_under_mpirun(data_dir, tmp_path):
    out = tmp_path / "tp2"
    _train(data_dir, out, 2, "parallel.tensor=2", "parallel.sequence=true", steps=6)
    one = _generate(out, 1)
    assert one.startswith("def ") and len(one) > len("def \n")
    assert _generate(out, 2) == one  # split over two ranks, rank 0 prints the same text


def test_a_world_the_tensor_size_does_not_divide_is_refused(data_dir, tmp_path):
    proc = _train(data_dir, tmp_path / "x", 3, "parallel.tensor=2", steps=1, check=False)
    assert proc.returncode != 0
    assert "parallel: the world of 3 ranks is not divisible by tensor = 2" in proc.stderr, output(proc)
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("overrides,message", [
    (["parallel.tensor=3"], "parallel.tensor: expected a divisor of model n_head (4; each rank takes n_head / tensor "
                            "heads), got 3; HINT: use one of [1, 2, 4]"),
    (["parallel.sequence=true"], "parallel.sequence: expected parallel.tensor > 1"),
    (["parallel.tensor=2", "parallel.sequence=true", "train.sequence_length=31", "train.total_batch_size=0"],
     "train.sequence_length: expected a multiple of parallel.tensor (2) with parallel.sequence=true"),
    (["parallel.tensor=0"], "parallel.tensor: expected an integer >= 1, got 0"),
])
def test_config_names_the_tensor_parallel_problem(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_config(CONFIG, ["model.n_head=4", *overrides])
    assert message in str(info.value)


def test_the_resolved_config_records_the_layout(data_dir, tmp_path):
    out = tmp_path / "tp2"
    _train(data_dir, out, 2, "parallel.tensor=2", "parallel.sequence=true", steps=1)
    saved = load_config(str(out / "config.yaml"))
    assert (saved.parallel.tensor, saved.parallel.sequence) == (2, True)
    with open(os.path.join(list_checkpoints(out)[-1], "state.json")) as f:
        assert json.load(f)["config"]["parallel"]["tensor"] == 2


def test_mesh_groups_are_laid_out_tensor_fastest():
    proc = mpirun(4, "worker_mesh.py", timeout=120)
    assert proc.returncode == 0, output(proc)
    assert proc.stdout.count("mesh ok") == 4, output(proc)


@pytest.mark.parametrize("ranks,sequence", [(2, False), (2, True), (4, True)])
def test_split_model_gradients_norm_and_state_are_the_whole_models(ranks, sequence):
    proc = mpirun(ranks, "worker_tp_state.py", *(["--sequence-parallel"] if sequence else []), timeout=120)
    assert proc.returncode == 0, output(proc)
    assert proc.stdout.count("tp state ok") == ranks, output(proc)
