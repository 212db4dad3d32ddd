"""The model registry and the causal-LM shell: each arch's ModelSpec (class, config, validate), the LMConfig names
both configs answer to, and the pipeline chunks the shell cuts for every model."""
import numpy as np
import pytest

import infini_train as it
from infini_train.models import registry
from infini_train.models.gpt2 import GPT2, GPT2Config
from infini_train.models.llama import Llama, LlamaConfig


def test_specs_are_registered_by_arch():
    assert registry.model_class("gpt2") == (GPT2, GPT2Config)
    assert registry.model_class("llama3") == (Llama, LlamaConfig)
    assert registry.arch_of(GPT2(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, block_size=8))) == "gpt2"
    with pytest.raises(ValueError, match=r"model.arch: expected one of \('gpt2', 'llama3', 'qwen3', 'qwen3_moe', "
                                         r"'mixtral', 'deepseek_v3', 'gpt_oss'\), got 'gpt3'"):
        registry.model_spec("gpt3")


def test_validate_names_the_key_to_change():
    gpt2 = registry.model_spec("gpt2")
    config = GPT2Config(n_layer=6, n_head=4, n_embd=32)
    assert gpt2.validate(config, tensor=2, pipeline=3) == []
    assert gpt2.validate(config, pipeline=2, virtual=2) == [
        "model.n_layer: expected a multiple of parallel.pipeline x parallel.virtual_pipeline = 2 x 2 = 4 (equal model "
        "chunks), got 6"]
    assert gpt2.validate(config, tensor=3) == [
        "parallel.tensor: expected a divisor of model n_head (4; each rank takes n_head / tensor heads), got 3; HINT: "
        "use one of [1, 2, 4]"]
    llama = registry.model_spec("llama3")
    gqa = LlamaConfig(dim=64, n_layers=2, n_heads=8, n_kv_heads=2, intermediate_size=32, vocab_size=32, max_seq_len=8)
    assert llama.validate(gqa, tensor=4) == [
        "parallel.tensor: expected a divisor of model n_kv_head (2; each rank takes n_kv_head / tensor heads), got 4; "
        "HINT: use one of [1, 2]"]


def test_both_configs_answer_the_lm_config_names():
    g = GPT2Config(block_size=16, n_layer=3, n_head=4, n_embd=32)
    ll = LlamaConfig(dim=64, n_layers=2, n_heads=8, n_kv_heads=2, intermediate_size=32, max_seq_len=24)
    assert (g.num_layers, g.num_heads, g.num_kv_heads, g.head_dim, g.hidden_size, g.context_length) == \
           (3, 4, 4, 8, 32, 16)
    assert (ll.num_layers, ll.num_heads, ll.num_kv_heads, ll.head_dim, ll.hidden_size, ll.context_length) == \
           (2, 8, 2, 8, 64, 24)
    assert not hasattr(ll, "n_layer") and not hasattr(ll, "block_size")  # no GPT-2-named aliases


@pytest.mark.parametrize("arch", ["gpt2", "llama3"])
def test_pipeline_chunks_run_the_whole_model_in_pieces(arch):
    it.manual_seed(0)
    if arch == "gpt2":
        model = GPT2(GPT2Config(block_size=16, vocab_size=40, n_layer=4, n_head=2, n_embd=16))
    else:
        model = Llama(LlamaConfig(dim=16, n_layers=4, n_heads=2, n_kv_heads=1, intermediate_size=24, vocab_size=40,
                                  max_seq_len=16, rope_scaling=None))
    idx = it.tensor(np.random.default_rng(0).integers(0, 40, (2, 7)))
    logits, _ = model(idx)
    first, middle, last = model.pipeline_chunk(range(0, 1), True, False), model.pipeline_chunk(range(1, 3), False,
                                                                                              False), \
        model.pipeline_chunk(range(3, 4), False, True)
    assert type(first) is type(model) and first.first and not first.last
    chunked, _ = last(middle(first(idx)))
    np.testing.assert_array_equal(chunked.numpy(), logits.numpy())
    whole = dict(model.state_dict())
    for chunk in (first, middle, last):  # parameters keep their names in the whole model
        assert all(name in whole for name in chunk.state_dict())
    assert sum(c.num_params() for c in (first, middle, last)) >= model.num_params()
