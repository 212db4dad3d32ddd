"""DeepSeek-V3 runs (configs/deepseek_v3_tiny.yaml, shrunk) under the layouts Qwen3-MoE runs: EP2, EP2 x DP2 with
ZeRO-1 and ZeRO-2, TP2 x EP2 with and without sequence parallelism (and with it under ZeRO-3), and two pipeline stages
give the one process's
losses, gradient norms, sequence-wise balance losses, expert loads and correction biases over 10 steps with the same
global batch (rtol 1e-4), and its final weights and biases; the auxiliary-loss-free bias moves (rate 0.01), the
optimizer keeps no state for it, and an EP2 checkpoint resumes on one process with the same biases and run."""
import os
import shutil

import numpy as np
import pytest

from infini_train.models import registry
from infini_train.run_state import list_checkpoints, load_checkpoint
from tests.distributed.mpi_jobs import needs_mpiexec
from tests.training.tiny_run import REPO, metrics, run, tiny_args

CONFIG = os.path.join(REPO, "configs", "deepseek_v3_tiny.yaml")
pytestmark = [pytest.mark.layouts,
              pytest.mark.skipif(not os.path.exists(CONFIG) or "deepseek_v3" not in registry.ARCH_SECTIONS,
                                 reason="the deepseek_v3 arch is not registered")]

# 4 layers, the first dense: MoE layers on both pipeline stages; 8 experts in 2 groups, top-2 from 1 group;
# 4 micro-batches of B=2 per step: one process accumulates 4, each of 2 ranks 2, each of 4 data ranks 1
COMMON = ["model.n_layer=4", "train.total_batch_size=256", "train.batch_size=2", "train.val_loss_every=0",
          "train.learning_rate=3e-3", "model.num_experts=8", "model.num_experts_per_tok=2", "model.n_group=2",
          "model.topk_group=1", "model.moe_intermediate_size=32", "model.intermediate_size=96",
          "model.first_k_dense_replace=1", "model.bias_update_rate=0.01", "model.seq_aux_loss_alpha=0.01"]
KEYS = ("loss", "grad_norm", "aux_loss", "expert_load_max", "experts_idle", "correction_bias_absmax",
        "correction_bias_mean_abs")
BIAS = "e_score_correction_bias"


def _train(data_dir, out, *extra, steps=10, ranks=1):
    return run(tiny_args(data_dir, out, f"train.num_iterations={steps}", *COMMON, *extra), ranks=ranks, config=CONFIG)


def _values(out, key):
    return np.array([r[key] for r in metrics(out) if key in r and "loss" in r])


def _same_as(out, ref, rtol):
    for key in KEYS:
        np.testing.assert_allclose(_values(out, key), _values(ref, key), rtol=rtol, atol=1e-12, err_msg=key)


@pytest.fixture(scope="module")
def one_process(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("one")
    _train(data_dir, out, "train.save_every=5")
    return out


def test_one_process_moves_the_biases_and_keeps_them_out_of_the_optimizer(one_process):
    bias = _values(one_process, "correction_bias_absmax")
    assert len(bias) == 10 and bias[0] == pytest.approx(0.01) and bias.max() > 0.01  # one step's rate, then more
    assert (_values(one_process, "aux_loss") > 0).all()
    weights, opt, _ = load_checkpoint(list_checkpoints(one_process)[-1])
    biases = [name for name in weights if name.endswith(BIAS)]
    assert len(biases) == 3 and all(np.abs(np.asarray(weights[n])).max() > 0 for n in biases)
    # every other entry is a parameter the optimizer steps (untied), the biases are not
    assert sum(len(g["params"]) for g in opt["param_groups"]) == len(weights) - len(biases)


@needs_mpiexec
@pytest.mark.parametrize("ranks,layout", [
    (2, ["parallel.expert=2"]),
    (4, ["parallel.expert=2", "parallel.zero_stage=1"]),
    (4, ["parallel.expert=2", "parallel.zero_stage=2"]),
    (4, ["parallel.tensor=2", "parallel.expert=2"]),
    (4, ["parallel.tensor=2", "parallel.sequence=true", "parallel.expert=2"]),
    # the experts sharded within each block's unit, which reduces at the end of backward: the tensor ranks route
    # different slices, so a unit reducing once its gradients were in did so at different points (and hung)
    (4, ["parallel.tensor=2", "parallel.sequence=true", "parallel.expert=2", "parallel.zero_stage=3"]),
    (2, ["parallel.pipeline=2"]),
], ids=["ep2", "ep2xdp2-zero1", "ep2xdp2-zero2", "tp2-ep2", "tp2sp-ep2", "tp2sp-ep2-zero3", "pp2"])
def test_layout_equals_one_process(data_dir, one_process, tmp_path, ranks, layout):
    out = tmp_path / "run"
    _train(data_dir, out, *layout, ranks=ranks)
    _same_as(out, one_process, rtol=1e-4)
    mine, _, _ = load_checkpoint(list_checkpoints(out)[-1])
    ref, _, _ = load_checkpoint(list_checkpoints(one_process)[-1])
    assert sorted(mine) == sorted(ref)
    for name in ref:
        np.testing.assert_allclose(np.asarray(mine[name]), np.asarray(ref[name]), rtol=1e-4, atol=5e-5, err_msg=name)
        if name.endswith(BIAS):  # multiples of the rate: equal
            np.testing.assert_allclose(np.asarray(mine[name]), np.asarray(ref[name]), rtol=0, atol=1e-6)


@needs_mpiexec
def test_expert_parallel_checkpoint_resumes_on_one_process(data_dir, one_process, tmp_path):
    ep2, resumed = tmp_path / "ep2", tmp_path / "resumed"
    _train(data_dir, ep2, "parallel.expert=2", "train.save_every=5", ranks=2)
    shutil.copytree(ep2, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_000010")
    saved, _, _ = load_checkpoint(list_checkpoints(resumed)[-1])
    assert any(name.endswith(BIAS) and np.abs(np.asarray(v)).max() > 0 for name, v in saved.items())
    proc = _train(data_dir, resumed, "train.save_every=5", "resume=auto")
    assert "resumed from" in proc.stdout
    _same_as(resumed, ep2, rtol=1e-5)


@needs_mpiexec
def test_bf16_mixed_ep2_x_pp2_follows_one_process(data_dir, tmp_path):
    """As Qwen3-MoE's: low precision rounds the stages' and ranks' sums in another order (the router runs in float32,
    autocast off), so the losses agree to 2e-3, the norms and balance losses to 3e-2 (a near-tie in the routing can
    send a token elsewhere: 1.2 % on one step's norm under another BLAS kernel family); the biases stay finite."""
    one, split = tmp_path / "one", tmp_path / "split"
    _train(data_dir, one, "precision=bf16-mixed", "train.save_every=0")
    _train(data_dir, split, "precision=bf16-mixed", "train.save_every=0", "parallel.pipeline=2", "parallel.expert=2",
           ranks=4)
    assert np.isfinite(_values(split, "grad_norm")).all()
    np.testing.assert_allclose(_values(split, "loss"), _values(one, "loss"), rtol=2e-3)
    for key in ("grad_norm", "aux_loss"):
        np.testing.assert_allclose(_values(split, key), _values(one, key), rtol=3e-2, err_msg=key)
    assert _values(split, "correction_bias_absmax").max() > 0.01
