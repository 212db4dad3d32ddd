"""The meta device: tensors with a shape and dtype and no storage (torch's meta device). Models built under
``with it.device("meta"):`` hold no data and draw no random numbers; ``to_empty`` gives them storage to fill."""
import numpy as np
import pytest

import infini_train as it
from infini_train import backend
from infini_train.models.gpt2 import GPT2, GPT2Config


def holds_no_data(t):
    return t.device.type == "meta" and not any(t.array.strides) and t.array.base is not None and t.array.base.size == 1


def test_a_model_built_on_meta_holds_shapes_but_no_storage_and_draws_nothing():
    state = backend.get_rng_state_all()
    with it.device("meta"):
        model = GPT2(GPT2Config(block_size=1024, vocab_size=50257, n_layer=12, n_head=12, n_embd=768))
        assert it.zeros(2, 3).device.type == "meta"
    assert it.zeros(2, 3).device.type == "cpu"  # the default device is back
    assert model.num_params() > 124_000_000
    assert all(holds_no_data(p) for p in model.parameters())
    after = backend.get_rng_state_all()
    assert state.keys() == after.keys()
    for key in state:
        np.testing.assert_array_equal(np.asarray(state[key], dtype=object), np.asarray(after[key], dtype=object))
    with pytest.raises(RuntimeError, match=r"meta device has no data to copy\nHINT: .*to_empty"):
        model.to(device="cpu")
    with pytest.raises(RuntimeError, match="no data to copy"):
        model.lm_head.weight.to("cpu")


def test_to_empty_gives_storage_that_a_state_dict_fills():
    it.manual_seed(0)
    reference = GPT2(GPT2Config(block_size=16, vocab_size=67, n_layer=2, n_head=2, n_embd=16))
    with it.device("meta"):
        model = GPT2(GPT2Config(block_size=16, vocab_size=67, n_layer=2, n_head=2, n_embd=16))
    params = list(model.parameters())
    model.to_empty(device="cpu")
    assert [id(p) for p in model.parameters()] == [id(p) for p in params]  # the same Parameter objects
    assert all(p.device.type == "cpu" and p.array.flags.writeable for p in params)
    model.load_state_dict(reference.state_dict())
    x = it.tensor(np.arange(16).reshape(1, 16) % 67)
    np.testing.assert_array_equal(model(x, x)[1].numpy(), reference(x, x)[1].numpy())


def test_nested_device_contexts_and_bad_names():
    with it.device("meta"):
        with it.device("cpu"):
            assert it.ones(1).device.type == "cpu"
        assert it.ones(1).device.type == "meta"
    with pytest.raises(ValueError, match="'meta'"):
        it.device("metal")


def test_replayed_inits_give_each_split_the_eager_values():
    from infini_train.nn.parallel.sharded_init import InitError, recording_inits, replay_inits
    from infini_train.nn.parallel.sharded_pieces import tensor_pieces

    config = GPT2Config(block_size=16, vocab_size=67, n_layer=2, n_head=2, n_embd=16)
    it.manual_seed(3)
    eager = GPT2(config).state_dict()
    it.manual_seed(3)
    with it.device("meta"), recording_inits() as calls:
        model = GPT2(config)
    assert calls and all(kind in ("normal", "uniform", "constant") for _, kind, _ in calls)
    model.to_empty(device="cpu")
    replay_inits(calls, model)
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), eager[name].numpy(), err_msg=name)
    with it.device("meta"), recording_inits() as calls:
        bare = it.nn.Linear(3, 2)
    bare.to_empty(device="cpu")
    with pytest.raises(InitError, match="never initialised"):
        replay_inits([c for c in calls if c[0] is not bare.bias], bare)
    assert tensor_pieces(np.zeros((2, 3))).boxes() == [((0, 0), (2, 3))]
