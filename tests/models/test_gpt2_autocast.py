"""GPT-2 under autocast against Hugging Face's GPT2LMHeadModel under torch.autocast, same weights and batch.

Tolerances: both frameworks round every matmul result to bfloat16 (8 significant bits, relative error up to
2^-9 per rounding), but not always the same float32 value (their reductions order sums differently), so one
product can land one bf16 ulp apart and those differences travel through two layers. The loss agrees within
1e-2 relative, and each gradient points the same way (cosine similarity >= 0.99) rather than matching
element-wise; float16 keeps 11 bits and is held to the same bar.
"""
import numpy as np
import pytest
import torch

import infini_train as it
from tests.models.test_gpt2 import batch, hf_twin, small_model

transformers = pytest.importorskip("transformers")


def _cosine(a, b):
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))


@pytest.mark.parametrize("low", ["bfloat16", "float16"])
def test_forward_and_backward_under_autocast_match_hf(tmp_path, low):
    model = small_model()
    hf = hf_twin(model, tmp_path)
    x, y = batch()
    with it.autocast("cpu", dtype=getattr(it, low)):
        logits, loss = model(it.tensor(x), it.tensor(y))
    loss.backward()
    with torch.autocast("cpu", dtype=getattr(torch, low)):
        hf_logits = hf(torch.tensor(x)).logits
        hf_loss = torch.nn.functional.cross_entropy(hf_logits.view(-1, 512), torch.tensor(y).view(-1))
    hf_loss.backward()
    assert logits.dtype == getattr(it, low) and str(hf_logits.dtype) == f"torch.{low}"
    assert loss.dtype == it.float32 and hf_loss.dtype == torch.float32
    np.testing.assert_allclose(loss.item(), hf_loss.item(), rtol=1e-2)
    for name, p in model.named_parameters():
        assert p.grad.dtype == it.float32, name  # master weights get float32 gradients
        theirs = dict(hf.named_parameters())[name].grad
        if name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")) and "transformer.h." in name:
            theirs = theirs.T  # HF's Conv1D stores these weights transposed
        assert _cosine(p.grad.numpy(), theirs.float().numpy()) >= 0.99, name
