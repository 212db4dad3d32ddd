import numpy as np
import pytest

import infini_train as it


def test_dropout_statistics_scaling_and_gradient():
    it.manual_seed(0)
    x = it.ones(200, 500, requires_grad=True)
    y = it.dropout(x, p=0.3)
    out = y.numpy()
    kept = out != 0
    assert abs(1 - kept.mean() - 0.3) < 0.01
    np.testing.assert_allclose(out[kept], 1 / 0.7, rtol=1e-6)
    y.backward(it.full((200, 500), 2.0))
    np.testing.assert_allclose(x.grad.numpy(), 2.0 * out)


def test_dropout_is_reproducible_with_seed_and_identity_in_eval():
    it.manual_seed(3)
    a = it.dropout(it.ones(50), 0.5).numpy()
    it.manual_seed(3)
    b = it.dropout(it.ones(50), 0.5).numpy()
    np.testing.assert_array_equal(a, b)
    x = it.ones(4)
    assert it.dropout(x, 0.5, training=False) is x
    np.testing.assert_array_equal(it.dropout(x, 1.0).numpy(), 0.0)


def test_dropout_p_validation():
    with pytest.raises(ValueError, match=r"dropout: expected p in \[0, 1\], got 1.5"):
        it.dropout(it.ones(2), 1.5)
