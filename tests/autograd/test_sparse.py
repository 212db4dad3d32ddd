import numpy as np
import pytest
import torch

import infini_train as it
from tests.op_check import check_op


def test_embedding_with_repeated_ids():
    ids = np.array([[0, 3, 3], [1, 0, 3]], np.int64)
    check_op([ids, (5, 4)], it.embedding, torch.nn.functional.embedding)


def test_embedding_padding_idx_gets_no_gradient():
    ids = np.array([1, 2, 2, 0], np.int64)
    # fd=False: by definition the padding row's gradient is zero, not the true derivative
    check_op([ids, (4, 3)], lambda i, w: it.embedding(i, w, padding_idx=2),
             lambda i, w: torch.nn.functional.embedding(i, w, padding_idx=2), fd=False)


def test_embedding_errors():
    with pytest.raises(ValueError, match=r"embedding: expected ids in \[0, 4\), got id 4"):
        it.embedding(it.tensor([1, 4]), it.ones(4, 2))
    with pytest.raises(ValueError, match="embedding: expected integer ids"):
        it.embedding(it.tensor([1.0]), it.ones(4, 2))
