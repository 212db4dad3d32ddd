"""Qwen3-MoE runs with expert parallelism (``parallel.expert``): EP2 on 2 ranks, EP2 x DP2 and EP4 on 4 ranks give the
one process's losses, gradient norms, router statistics and final weights with the same global batch; checkpoints
(sharded: each rank writes its experts) assemble to the one-process state, so an EP2 checkpoint resumes on one process
and a one-process checkpoint (or a data-parallel run's sharded one) at EP2; what expert parallelism cannot do is
refused by the config, by message."""
import os
import shutil

import numpy as np
import pytest

from infini_train.run_state import list_checkpoints, load_checkpoint
from infini_train.training.config import ConfigError, load_config
from tests.distributed.mpi_jobs import needs_mpiexec
from tests.training.tiny_run import REPO, metrics, run, tiny_args

pytestmark = pytest.mark.layouts

CONFIG = os.path.join(REPO, "configs", "qwen3_moe_tiny.yaml")
MOE_KEYS = ("aux_loss", "expert_load_max", "experts_idle")
# top-1 of 16 experts leaves some experts without a token in some steps (their gradients stay None, as in one
# process); 4 micro-batches of B=2 per step: one process accumulates 4, each of 2 ranks 2, each of 4 ranks 1
COMMON = ["train.total_batch_size=256", "train.batch_size=2", "train.val_loss_every=0", "train.learning_rate=3e-3",
          "model.num_experts=16", "model.num_experts_per_tok=1", "model.moe_intermediate_size=32",
          "model.intermediate_size=128"]


@pytest.fixture(scope="module")
def one_process(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("one")
    _train(data_dir, out, "train.save_every=5")
    return out


def _train(data_dir, out, *extra, steps=10, ranks=1):
    return run(tiny_args(data_dir, out, f"train.num_iterations={steps}", *COMMON, *extra), ranks=ranks, config=CONFIG)


def _values(out, key):
    return np.array([r[key] for r in metrics(out) if key in r and "loss" in r])


def _same_as(out, ref, rtol):
    for key in ("loss", "grad_norm") + MOE_KEYS:
        np.testing.assert_allclose(_values(out, key), _values(ref, key), rtol=rtol, err_msg=key)


@needs_mpiexec
@pytest.mark.parametrize("ranks,expert,checkpoint", [(2, 2, "whole"), (4, 2, "auto"), (4, 4, "auto")],
                         ids=["ep2", "ep2xdp2", "ep4"])
def test_expert_parallel_equals_one_process(data_dir, one_process, tmp_path, ranks, expert, checkpoint):
    out = tmp_path / "ep"
    # validation and samples run the expert-parallel layers on every rank of an expert group too; the whole format
    # gathers the experts on rank 0, the sharded one (auto) has each rank write its own
    proc = _train(data_dir, out, f"parallel.expert={expert}", "train.val_loss_every=5", "train.sample_every=5",
                  "train.sample_length=8", f"train.checkpoint_format={checkpoint}", ranks=ranks)
    assert os.path.isfile(list_checkpoints(out)[-1] + "/model.safetensors") == (checkpoint == "whole")
    assert "--- sample at step 5 ---" in proc.stdout and "step 10: val loss" in proc.stdout
    assert f"expert parallel {expert}" in proc.stdout
    assert len(_values(out, "loss")) == 10 and _values(one_process, "experts_idle").max() > 0
    _same_as(out, one_process, rtol=1e-4)
    mine, opt, _ = load_checkpoint(list_checkpoints(out)[-1])  # the one-process layout: every expert, by name
    ref, ref_opt, _ = load_checkpoint(list_checkpoints(one_process)[-1])
    assert sorted(mine) == sorted(ref)
    for name in ref:
        np.testing.assert_allclose(np.asarray(mine[name]), np.asarray(ref[name]), rtol=1e-4, atol=5e-5, err_msg=name)
    assert [g["params"] for g in opt["param_groups"]] == [g["params"] for g in ref_opt["param_groups"]]
    assert sorted(opt["state"]) == sorted(ref_opt["state"])  # experts never reached have no AdamW state in both
    for i, st in ref_opt["state"].items():
        assert opt["state"][i]["step"] == st["step"]
        for key in ("exp_avg", "exp_avg_sq"):
            np.testing.assert_allclose(np.asarray(opt["state"][i][key]), np.asarray(st[key]), rtol=1e-3, atol=1e-7,
                                       err_msg=f"{i} {key}")


@needs_mpiexec
def test_expert_parallel_checkpoints_resume_on_one_process_and_back(data_dir, one_process, tmp_path):
    ep2, resumed = tmp_path / "ep2", tmp_path / "resumed"
    _train(data_dir, ep2, "parallel.expert=2", "train.save_every=5", ranks=2)
    shutil.copytree(ep2, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_000010")
    proc = _train(data_dir, resumed, "train.save_every=5", "resume=auto")  # EP2's checkpoint, one process
    assert "resumed from" in proc.stdout
    _same_as(resumed, ep2, rtol=1e-5)

    back = tmp_path / "back"  # the one process's checkpoint at EP2
    shutil.copytree(one_process, back)
    shutil.rmtree(back / "checkpoints" / "step_000010")
    proc = _train(data_dir, back, "parallel.expert=2", "train.save_every=5", "resume=auto", ranks=2)
    assert "resumed from" in proc.stdout
    _same_as(back, one_process, rtol=1e-4)

    dp2, sharded = tmp_path / "dp2", tmp_path / "sharded"  # a data-parallel run's sharded checkpoint at EP2
    _train(data_dir, dp2, "train.save_every=5", ranks=2)
    assert (dp2 / "checkpoints" / "step_000005" / "state.json").exists()
    shutil.copytree(dp2, sharded)
    shutil.rmtree(sharded / "checkpoints" / "step_000010")
    proc = _train(data_dir, sharded, "parallel.expert=2", "train.save_every=5", "resume=auto", ranks=2)
    assert "resumed from" in proc.stdout
    _same_as(sharded, dp2, rtol=1e-4)


def _errors(*overrides, config=CONFIG):
    with pytest.raises(ConfigError) as info:
        load_config(config, list(overrides))
    return info.value.errors


def test_expert_parallel_refusals_are_config_errors(data_dir, tmp_path):
    assert load_config(CONFIG, ["parallel.expert=4"]).parallel.expert == 4
    assert load_config(CONFIG).parallel.expert == 1
    assert _errors("parallel.expert=0") == ["parallel.expert: expected an integer >= 1 (1: no expert parallelism), "
                                            "got 0"]
    assert _errors("parallel.expert=3") == [
        "parallel.expert: expected a divisor of model.num_experts (8: each rank of an expert group keeps num_experts "
        "/ expert of them), got 3; HINT: choose parallel.expert among [1, 2, 4, 8]"]
    qwen3 = os.path.join(REPO, "configs", "qwen3_tiny.yaml")
    assert _errors("parallel.expert=2", config=qwen3) == [
        "parallel.expert: expected 1 for model.arch=qwen3 (expert parallelism splits the experts of a "
        "mixture-of-experts model; this model has none), got 2; HINT: set parallel.expert=1, or "
        "model.arch=qwen3_moe | mixtral | deepseek_v3"]
    refused = _errors("parallel.expert=2", "lora.rank=4", "lora.target_modules=q_proj,v_proj")
    assert [e.split(":")[0] for e in refused] == ["lora.rank"]
    assert "LoRA runs with expert parallelism are not supported yet" in refused[0] and "HINT" in refused[0]
    assert load_config(CONFIG, ["parallel.expert=2", "train.checkpoint_format=sharded"]).parallel.expert == 2
    # what MoE runs refuse whatever the expert size: context parallelism; ZeRO 1-3 are fine
    # (tests/training/test_moe_zero_runs.py: ZeRO-3 shards the experts over their expert-data group)
    for stage in (1, 2, 3):
        assert load_config(CONFIG, ["parallel.expert=2", f"parallel.zero_stage={stage}"]).parallel.zero_stage == stage
    refused = _errors("parallel.expert=2", "parallel.zero_stage=3", "parallel.context=2")
    assert [e.split(":")[0] for e in refused] == ["parallel.context"]
    refused = _errors("parallel.expert=2", "parallel.zero_stage=3", "parallel.data_replicate=2")  # (HSDP)
    assert refused[0].startswith("parallel.data_replicate: expected 1 with parallel.expert=2 (")
    assert "HINT" in refused[0]
    # the data-parallel size is known when the run starts: one process is no multiple of 2
    proc = run(tiny_args(data_dir, tmp_path / "one", "train.num_iterations=1", *COMMON, "parallel.expert=2"),
               check=False, config=CONFIG)
    assert proc.returncode != 0
    assert ("parallel.expert: expected a divisor of the data-parallel size (1 ranks: expert groups of consecutive "
            "data-parallel ranks), got 2") in proc.stdout + proc.stderr
