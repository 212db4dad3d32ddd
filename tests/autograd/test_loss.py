import numpy as np
import pytest
import torch

import infini_train as it
from tests.op_check import check_op


def targets(*shape, classes=5, seed=0, ignore=None):
    t = np.random.default_rng(seed).integers(0, classes, size=shape).astype(np.int64)
    if ignore is not None:
        t.reshape(-1)[::3] = ignore
    return t


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_2d(reduction):
    check_op([(6, 5), targets(6)], lambda x, t: it.cross_entropy(x, t, reduction=reduction),
             lambda x, t: torch.nn.functional.cross_entropy(x, t, reduction=reduction))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_ignore_index(reduction):
    t = targets(7, ignore=-1)
    check_op([(7, 5), t], lambda x, t: it.cross_entropy(x, t, ignore_index=-1, reduction=reduction),
             lambda x, t: torch.nn.functional.cross_entropy(x, t, ignore_index=-1, reduction=reduction))


def test_cross_entropy_class_dim_and_single_sample():
    check_op([(2, 5, 3), targets(2, 3)], it.cross_entropy, torch.nn.functional.cross_entropy)
    check_op([(5,), np.array(2)], it.cross_entropy, torch.nn.functional.cross_entropy)


def test_cross_entropy_on_extreme_logits_is_finite():
    x = np.array([[1e4, -1e4, 0.0], [-1e4, 1e4, 1e4]], np.float32)
    check_op([x, np.array([1, 2])], it.cross_entropy, torch.nn.functional.cross_entropy, fd=False)


def test_nll_loss():
    check_op([(6, 5), targets(6, ignore=-100)], lambda x, t: it.nll_loss(x.log_softmax(-1), t),
             lambda x, t: torch.nn.functional.nll_loss(x.log_softmax(-1), t))


def test_cross_entropy_errors():
    with pytest.raises(ValueError, match="cross_entropy: expected targets in \\[0, 5\\) or ignore_index, got target 7"):
        it.cross_entropy(it.zeros(2, 5), it.tensor([1, 7]))
    with pytest.raises(ValueError, match="cross_entropy: expected integer class-index targets"):
        it.cross_entropy(it.zeros(2, 5), it.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match=r"cross_entropy: expected target of shape \(2,\)"):
        it.cross_entropy(it.zeros(2, 5), it.tensor([1, 2, 3]))
