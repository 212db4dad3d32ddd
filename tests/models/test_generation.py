import numpy as np
import pytest
import torch

import infini_train as it
from infini_train.models.generation import sample_next
from infini_train.models.gpt2 import GPT2, GPT2Config

transformers = pytest.importorskip("transformers")


def model(block=24, seed=0):
    it.manual_seed(seed)
    m = GPT2(GPT2Config(block_size=block, vocab_size=97, n_layer=2, n_head=2, n_embd=32))
    m.eval()
    return m


PROMPTS = np.array([[5, 17, 3, 9], [1, 2, 3, 4]], np.int64)


def test_kv_cache_equals_no_cache_greedy_token_for_token():
    m = model()
    with_cache = m.generate(it.tensor(PROMPTS), 12, temperature=0, use_cache=True).numpy()
    without = m.generate(it.tensor(PROMPTS), 12, temperature=0, use_cache=False).numpy()
    np.testing.assert_array_equal(with_cache, without)
    assert with_cache.shape == (2, 16)


def test_generation_past_block_size_crops_the_context_identically():
    m = model(block=8)
    a = m.generate(it.tensor(PROMPTS), 10, temperature=0, use_cache=True).numpy()
    b = m.generate(it.tensor(PROMPTS), 10, temperature=0, use_cache=False).numpy()
    np.testing.assert_array_equal(a, b)


def test_sampling_with_cache_matches_no_cache_for_the_same_seed():
    m = model()
    a = m.generate(it.tensor(PROMPTS), 8, temperature=0.8, top_k=10, seed=3).numpy()
    b = m.generate(it.tensor(PROMPTS), 8, temperature=0.8, top_k=10, seed=3, use_cache=False).numpy()
    np.testing.assert_array_equal(a, b)


def test_greedy_matches_hf_generate(tmp_path):
    m = model()
    m.save_pretrained(tmp_path / "m")
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "m"))
    hf.eval()
    ours = m.generate(it.tensor(PROMPTS[:1]), 10, temperature=0).numpy()
    theirs = hf.generate(torch.tensor(PROMPTS[:1]), max_new_tokens=10, do_sample=False, pad_token_id=0).numpy()
    np.testing.assert_array_equal(ours, theirs)


def test_stop_tokens_end_generation_as_hf_eos_does(tmp_path):
    m = model()
    m.save_pretrained(tmp_path / "m")
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "m")).eval()
    free = m.generate(it.tensor(PROMPTS[:1]), 10, temperature=0).numpy()[0]
    stop = int(free[4 + 3])  # the 4th new token: generation ends there, the stop token kept
    ours = m.generate(it.tensor(PROMPTS[:1]), 10, temperature=0, stop_tokens=[stop, 96]).numpy()
    theirs = hf.generate(torch.tensor(PROMPTS[:1]), max_new_tokens=10, do_sample=False, pad_token_id=0,
                         eos_token_id=[stop, 96]).numpy()
    first = 4 + list(free[4:]).index(stop)  # (it may come earlier than the 4th)
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(ours[0], free[:first + 1])
    both = m.generate(it.tensor(PROMPTS), 10, temperature=0, stop_tokens=[stop]).numpy()
    free_both = m.generate(it.tensor(PROMPTS), 10, temperature=0).numpy()
    for row in range(2):  # a row that stopped repeats its stop token until the other stops (or the budget ends)
        hit = [i for i in range(4, free_both.shape[1]) if free_both[row, i] == stop]
        end = hit[0] if hit else free_both.shape[1] - 1
        np.testing.assert_array_equal(both[row, :end + 1], free_both[row, :end + 1])
        assert (both[row, end + 1:] == stop).all()


def test_no_graph_and_flat_memory_under_no_grad():
    m = model(block=64)
    seen = []
    m.generate(it.tensor(PROMPTS[:1]), 5, temperature=0, stream=seen.append)
    assert len(seen) == 5
    with it.no_grad():
        logits, _ = m(it.tensor(PROMPTS))
    assert logits.grad_fn is None and not logits.requires_grad
    # a graph would keep activations alive via grad_fn; count live Function objects instead of bytes
    import gc

    from infini_train.autograd.function import Function
    gc.collect()
    before = sum(issubclass(type(o), Function) for o in gc.get_objects())
    m.generate(it.tensor(PROMPTS[:1]), 50, temperature=0)
    gc.collect()
    after = sum(issubclass(type(o), Function) for o in gc.get_objects())
    assert after - before <= 0


def test_peak_memory_does_not_grow_with_generated_length():
    import gc
    import tracemalloc

    m = model(block=1024)
    m.generate(it.tensor(PROMPTS[:1]), 300, temperature=0)  # warm-up: lazy imports, interpreter free lists

    def peak(n):
        gc.collect()
        tracemalloc.start()
        m.generate(it.tensor(PROMPTS[:1]), n, temperature=0)
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return top

    short, long = peak(300), peak(1000)
    # nothing accumulates per token; what grows is the transient attention row over t cached keys (O(t),
    # 4 bytes x heads x layers per key), well inside this bound
    assert long < short * 1.25 + 64_000, (short, long)


def test_sample_next_top_k_top_p_and_errors():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    rng = np.random.default_rng(0)
    picks = [int(sample_next(logits, 1.0, top_k=2, rng=rng)[0]) for _ in range(200)]
    assert set(picks) == {0, 1}
    picks = [int(sample_next(logits, 1.0, top_p=0.7, rng=rng)[0]) for _ in range(200)]
    assert set(picks) == {0, 1}  # 0.5 < 0.7 needs the second token; 0.8 >= 0.7 stops there
    assert int(sample_next(logits, 0.0)[0]) == 0
    with pytest.raises(ValueError, match="top_p must be in"):
        sample_next(logits, 1.0, top_p=1.5)


def test_prompt_longer_than_block_size_is_a_clear_error():
    m = model(block=8)
    with pytest.raises(ValueError, match="the prompt has 9 tokens, more than block_size 8"):
        m.generate(it.tensor(np.zeros((1, 9), np.int64)), 2)
