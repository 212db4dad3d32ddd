"""GPT-2 on a GPU (cupy) against the same model on the CPU. Marked cuda: skipped without cupy and a GPU."""
import numpy as np
import pytest

import infini_train as it
from infini_train.models.gpt2 import GPT2, GPT2Config

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module")
def gpu():
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError
    except Exception:
        pytest.skip("cupy or a GPU is missing")
    return "cuda:0"


def test_forward_backward_and_adamw_on_gpu_match_cpu(gpu):
    cfg = GPT2Config(block_size=32, vocab_size=512, n_layer=2, n_head=4, n_embd=64)
    it.manual_seed(0)
    cpu_model = GPT2(cfg)
    it.manual_seed(0)
    gpu_model = GPT2(cfg).to(gpu)
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 512, (4, 32)), rng.integers(0, 512, (4, 32))
    opts = [m.configure_optimizers(0.1, 1e-3) for m in (cpu_model, gpu_model)]
    for _ in range(3):
        losses = []
        for model, opt, dev in ((cpu_model, opts[0], "cpu"), (gpu_model, opts[1], gpu)):
            opt.zero_grad()
            logits, loss = model(it.tensor(x, device=dev), it.tensor(y, device=dev))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        np.testing.assert_allclose(losses[1], losses[0], rtol=1e-4)
    for (n, p), (_, q) in zip(cpu_model.named_parameters(), gpu_model.named_parameters()):
        assert q.device is it.device(gpu)
        np.testing.assert_allclose(q.numpy(), p.numpy(), rtol=1e-3, atol=1e-5, err_msg=n)


def test_generation_on_gpu_matches_cpu(gpu):
    cfg = GPT2Config(block_size=32, vocab_size=97, n_layer=2, n_head=2, n_embd=32)
    it.manual_seed(0)
    m = GPT2(cfg)
    prompt = np.array([[1, 2, 3]])
    on_cpu = m.generate(it.tensor(prompt), 10, temperature=0).numpy()
    m.to(gpu)
    on_gpu = m.generate(it.tensor(prompt, device=gpu), 10, temperature=0).numpy()
    np.testing.assert_array_equal(on_gpu, on_cpu)
