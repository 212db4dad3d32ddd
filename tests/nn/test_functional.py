"""nn.functional: each wrapper against torch.nn.functional (forward and input gradients)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import infini_train as it
from infini_train.autograd.ops import activations
from infini_train.nn import functional as F
from tests.op_check import check_op

ids = np.array([[0, 3, 1], [2, 2, 4]])
target = np.array([1, -100, 3, 0])
class_weight = np.array([0.5, 2.0, 1.0, 1.5, 0.25], np.float32)
soft_target = np.random.default_rng(0).dirichlet(np.ones(5), size=4).astype(np.float32)

CASES = [
    ("linear", [(2, 3, 4), (5, 4), (5,)], F.linear, TF.linear, {}),
    ("embedding", [ids, (5, 3)], lambda i, w: F.embedding(i, w, padding_idx=2),
     lambda i, w: TF.embedding(i, w, padding_idx=2), {"fd": False}),
    ("layer_norm", [(3, 4), (4,), (4,)], lambda x, w, b: F.layer_norm(x, (4,), w, b),
     lambda x, w, b: TF.layer_norm(x, (4,), w, b), {"rtol": 1e-4, "atol": 1e-5}),
    ("gelu", [(3, 5)], F.gelu, TF.gelu, {}),
    ("gelu_tanh", [(3, 5)], lambda x: F.gelu(x, "tanh"), lambda x: TF.gelu(x, approximate="tanh"), {}),
    ("relu", [(3, 5)], F.relu, TF.relu, {}),
    ("softmax", [(3, 5)], lambda x: F.softmax(x, 0), lambda x: TF.softmax(x, 0), {}),
    ("log_softmax", [(3, 5)], lambda x: F.log_softmax(x, -1), lambda x: TF.log_softmax(x, -1), {}),
    ("cross_entropy", [(4, 5), target], F.cross_entropy, TF.cross_entropy, {}),
    ("cross_entropy_sum", [(4, 5), np.array([1, -1, 3, 0])],
     lambda x, t: F.cross_entropy(x, t, ignore_index=-1, reduction="sum"),
     lambda x, t: TF.cross_entropy(x, t, ignore_index=-1, reduction="sum"), {}),
    ("cross_entropy_weight_smoothing", [(4, 5), target, class_weight],
     lambda x, t, w: F.cross_entropy(x, t, w, label_smoothing=0.2),
     lambda x, t, w: TF.cross_entropy(x, t, w, label_smoothing=0.2), {"grad_mask": [True, False, False]}),
    ("cross_entropy_probabilities", [(4, 5), soft_target],
     lambda x, p: F.cross_entropy(x, p, reduction="sum"), lambda x, p: TF.cross_entropy(x, p, reduction="sum"), {}),
    ("nll_loss_weight", [(4, 5), target, class_weight], lambda x, t, w: F.nll_loss(x, t, w, reduction="none"),
     lambda x, t, w: TF.nll_loss(x, t, w, reduction="none"), {"grad_mask": [True, False, False]}),
    ("mse_loss", [(3, 4), (3, 4)], F.mse_loss, TF.mse_loss, {}),
    ("binary_cross_entropy_with_logits", [(4, 5), soft_target],
     lambda x, t: F.binary_cross_entropy_with_logits(x, t, pos_weight=it.tensor(class_weight, dtype=x.dtype)),
     lambda x, t: TF.binary_cross_entropy_with_logits(x, t, pos_weight=torch.tensor(class_weight)), {}),
    ("sdpa_gqa", [(1, 4, 3, 4), (1, 2, 3, 4), (1, 2, 3, 4)],
     lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
     lambda q, k, v: TF.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
     {"rtol": 1e-4, "atol": 1e-5}),
    ("sdpa_causal", [(1, 2, 3, 4), (1, 2, 3, 4), (1, 2, 3, 4)],
     lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
     lambda q, k, v: TF.scaled_dot_product_attention(q, k, v, is_causal=True), {"rtol": 1e-4, "atol": 1e-5}),
    ("sdpa_scale", [(2, 3, 4), (2, 5, 4), (2, 5, 3)],
     lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=0.3),
     lambda q, k, v: TF.scaled_dot_product_attention(q, k, v, scale=0.3), {"rtol": 1e-4, "atol": 1e-5}),
]


@pytest.mark.parametrize("name,specs,ours,theirs,kw", CASES, ids=[c[0] for c in CASES])
def test_functional_matches_torch(name, specs, ours, theirs, kw):
    check_op(specs, ours, theirs, **kw)


def test_dropout_functional():
    x = it.ones(50, 40)
    it.manual_seed(0)
    y = F.dropout(x, 0.5).numpy()
    assert abs((y != 0).mean() - 0.5) < 0.05 and set(np.unique(y)) == {0.0, 2.0}
    np.testing.assert_array_equal(F.dropout(x, 0.5, training=False).numpy(), x.numpy())


def test_all_lists_the_losses():
    for name in ("cross_entropy", "nll_loss", "mse_loss", "binary_cross_entropy_with_logits",
                 "scaled_dot_product_attention"):
        assert name in F.__all__ and callable(getattr(F, name))


def test_wrappers_look_up_the_op_families_at_call_time(monkeypatch):
    monkeypatch.setattr(activations, "relu", lambda x: "patched")
    assert F.relu(it.ones(1)) == "patched"
