"""The auxiliary-loss-free bias update (models/expert_bias.py): the biases after several steps of several
micro-batches against a NumPy transcription of DeepSeek-V3's rule (routing included), the loads restarting each step,
a rate of 0 or None leaving the bias alone, evaluation forwards not counted, the bias saved and loaded with the state
dict and a RunState checkpoint of either format and never a parameter, and the step among the gradient finaliser's."""
from types import SimpleNamespace

import numpy as np

import infini_train as it
from infini_train.models.expert_bias import update_expert_biases
from infini_train.models.finalize_grads import FINALIZE_STEPS, update_correction_biases
from infini_train.nn.moe_routing import DeepSeekMoE

DIM, E, K, GROUPS, KEEP = 6, 8, 2, 4, 2


def layer(rate=0.05, seed=0):
    it.manual_seed(seed)
    return DeepSeekMoE(DIM, 3, E, K, n_group=GROUPS, topk_group=KEEP, bias_update_rate=rate, dtype=it.float64)


def reference_choice(gate, bias, x):
    """NumPy: sigmoid scores + bias, the KEEP best groups by their top-2 sums, then the top K experts."""
    scores = 1 / (1 + np.exp(-(x @ gate.T))) + bias
    grouped = np.sort(scores.reshape(len(x), GROUPS, E // GROUPS), -1)
    best = np.argsort(-(grouped[..., -1] + grouped[..., -2]), 1, kind="stable")[:, :KEEP]
    mask = np.zeros((len(x), GROUPS), bool)
    np.put_along_axis(mask, best, True, 1)
    masked = np.where(np.repeat(mask, E // GROUPS, 1), scores, -np.inf)
    return np.argsort(-masked, 1, kind="stable")[:, :K]


def test_bias_after_steps_matches_numpy():
    moe, rate = layer(), 0.05
    gate = moe.gate.weight.numpy().copy()
    bias = np.zeros(E)
    rng = np.random.default_rng(0)
    for _step in range(6):
        load = np.zeros(E)
        for _micro in range(3):
            x = rng.normal(size=(2, 4, DIM)) + 0.5  # skewed, so some experts are over- and some under-loaded
            moe(it.tensor(x))
            load += np.bincount(reference_choice(gate, bias, x.reshape(-1, DIM)).ravel(), minlength=E)
        np.testing.assert_array_equal(moe.expert_load, load)
        used = update_expert_biases(moe)
        np.testing.assert_array_equal(used[0], load)
        bias = bias + rate * np.sign(load.mean() - load)
        np.testing.assert_allclose(moe.gate.e_score_correction_bias.numpy(), bias, rtol=0, atol=1e-15)
        assert (moe.expert_load == 0).all()
    assert np.abs(bias).max() > 0 and len(set(np.round(bias, 9))) > 1


def test_no_rate_no_update_and_evaluation_not_counted():
    for rate in (0.0, None):
        moe = layer(rate)
        moe(it.tensor(np.random.default_rng(1).normal(size=(5, DIM))))
        assert moe.expert_load.sum() == 5 * K
        assert update_expert_biases(moe) is None
        assert (moe.gate.e_score_correction_bias.numpy() == 0).all() and moe.expert_load.sum() == 0
    moe = layer()
    with it.no_grad():
        moe(it.tensor(np.ones((3, DIM))))
    assert moe.expert_load.sum() == 0


def test_bias_is_a_saved_buffer_not_a_parameter():
    moe = layer()
    moe(it.tensor(np.random.default_rng(2).normal(size=(7, DIM))))
    update_expert_biases(moe)
    state = moe.state_dict()
    assert "gate.e_score_correction_bias" in state
    assert "gate.e_score_correction_bias" not in dict(moe.named_parameters())
    other = layer(seed=1)
    other.load_state_dict(state)
    np.testing.assert_array_equal(other.gate.e_score_correction_bias.numpy(), moe.gate.e_score_correction_bias.numpy())
    assert np.abs(other.gate.e_score_correction_bias.numpy()).max() == 0.05


def test_the_finaliser_updates_the_biases():
    assert FINALIZE_STEPS[-1] is update_correction_biases
    moe = layer()
    moe(it.tensor(np.random.default_rng(3).normal(size=(7, DIM))))
    update_correction_biases(SimpleNamespace(raw_model=moe, dims=None, moe=True))
    assert np.abs(moe.gate.e_score_correction_bias.numpy()).max() == 0.05 and moe.expert_load.sum() == 0


def test_run_state_saves_and_loads_the_biases(tmp_path):
    """Both checkpoint formats keep every layer's correction bias and load it back (not an optimizer entry)."""
    from infini_train.models.llama.qwen3_moe import Qwen3Moe, Qwen3MoeConfig
    from infini_train.optim import AdamW
    from infini_train.run_state import RunState, load_checkpoint
    from infini_train.training.parallel_dims import ParallelDims

    cfg = Qwen3MoeConfig(dim=16, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=8, intermediate_size=24, vocab_size=31,
                         max_seq_len=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8)
    model = Qwen3Moe(cfg)
    values = []
    for i, (_, block) in enumerate(model.numbered_blocks()):
        block.mlp = DeepSeekMoE(16, 8, 4, 2, n_group=2, topk_group=1)
        values.append(np.arange(4.0, dtype=np.float32) * (i + 1) / 100)
        block.mlp.gate.e_score_correction_bias.copy_(it.tensor(values[-1]))
    state = RunState(model, AdamW(model.parameters(), lr=1e-3), ParallelDims())
    for fmt in ("whole", "sharded"):
        path = state.save(str(tmp_path / fmt), 1, fmt, {"step": 1})
        weights, opt, _ = load_checkpoint(path)
        assert sum(name.endswith("e_score_correction_bias") for name in weights) == 2
        assert sum(len(g["params"]) for g in opt["param_groups"]) == len(list(model.parameters()))
        for _, block in model.numbered_blocks():
            block.mlp.gate.e_score_correction_bias.copy_(it.tensor(np.zeros(4, np.float32)))
        state.load(path)
        for value, (_, block) in zip(values, model.numbered_blocks()):
            np.testing.assert_array_equal(block.mlp.gate.e_score_correction_bias.numpy(), value)
