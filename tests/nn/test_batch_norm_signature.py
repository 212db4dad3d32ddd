"""BatchNorm1d / 2d / 3d with torch 2.13's signature (keyword-only ``bias``): state_dict keys, torch state loaded,
outputs, input and parameter gradients and running statistics in train and eval mode for every combination of
affine, bias and track_running_stats."""
import inspect

import numpy as np
import pytest
import torch

import infini_train as it
from infini_train import nn

SHAPES = {"BatchNorm1d": [(6, 3), (6, 3, 5)], "BatchNorm2d": [(4, 3, 5, 5)], "BatchNorm3d": [(3, 3, 2, 3, 4)]}


@pytest.mark.parametrize("name", list(SHAPES))
def test_signature_equals_torchs(name):
    ours, theirs = inspect.signature(getattr(nn, name)), inspect.signature(getattr(torch.nn, name))
    assert [(p.name, p.kind, p.default) for p in ours.parameters.values()] == \
           [(p.name, p.kind, p.default) for p in theirs.parameters.values()]


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("kwargs", [{}, {"bias": False}, {"affine": False}, {"track_running_stats": False},
                                    {"bias": False, "momentum": None}])
def test_train_and_eval_match_torch(name, kwargs):
    rng = np.random.default_rng(7)
    theirs = getattr(torch.nn, name)(3, **kwargs)
    with torch.no_grad():
        for p in theirs.parameters():
            p.uniform_(0.5, 1.5)
    ours = getattr(nn, name)(3, **kwargs)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})
    for shape in SHAPES[name]:
        for step in range(2):
            x = (2 * rng.standard_normal(shape) + step).astype(np.float32)
            xi, xt = it.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
            yi, yt = ours(xi), theirs(xt)
            (yi * yi).sum().backward()
            (yt * yt).sum().backward()
            np.testing.assert_allclose(yi.numpy(), yt.detach().numpy(), rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(xi.grad.numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-4)
        for (key, p), q in zip(ours.named_parameters(), theirs.parameters()):
            np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-4, atol=1e-4, err_msg=key)
        for key, value in theirs.state_dict().items():
            np.testing.assert_allclose(ours.state_dict()[key].numpy(), value.numpy(), rtol=1e-5, atol=1e-6)
        ours.eval(), theirs.eval()
        np.testing.assert_allclose(ours(it.tensor(x)).numpy(), theirs(torch.tensor(x)).detach().numpy(),
                                   rtol=1e-5, atol=1e-5)
        ours.train(), theirs.train()


def test_a_wrong_rank_names_the_layer_and_the_shapes_it_takes():
    with pytest.raises(ValueError, match=r"BatchNorm1d: expected a 2-D or 3-D input \(N, C\) or \(N, C, L\), got "
                                         r"input of shape \(2, 3, 4, 4\)"):
        nn.BatchNorm1d(3)(it.zeros(2, 3, 4, 4))


@pytest.mark.parametrize("x_dtype,layer_dtype", [("float32", "float32"), ("bfloat16", "float32"),
                                                 ("float16", "float32"), ("bfloat16", "bfloat16"),
                                                 ("float64", "float64")])
@pytest.mark.parametrize("track", [True, False])
def test_the_dtypes_torch_accepts_give_its_dtypes_and_values(x_dtype, layer_dtype, track):
    x, v = np.random.default_rng(3).standard_normal((2, 4, 3, 2)).astype(np.float32)

    def run(m, nn_):
        layer = nn_.BatchNorm1d(3, dtype=getattr(m, layer_dtype), track_running_stats=track)
        inp = m.tensor(x).to(getattr(m, x_dtype)).requires_grad_()
        out = layer(inp)
        (out.float() * m.tensor(v)).sum().backward()
        return out, inp.grad, layer.weight.grad, layer.eval()(inp.detach())

    ours, theirs = run(it, nn), run(torch, torch.nn)
    for a, b in zip(ours, theirs):
        assert str(a.dtype).split(".")[-1] == str(b.dtype).split(".")[-1]
        tol = 1e-5 if "float16" not in x_dtype and "bfloat16" not in (x_dtype + layer_dtype) else 3e-2
        np.testing.assert_allclose(a.float().numpy(), b.detach().float().numpy(), rtol=tol, atol=tol)


@pytest.mark.parametrize("x_dtype,layer_dtype", [("float64", "float32"), ("float32", "float64"),
                                                 ("float32", "bfloat16"), ("float16", "bfloat16")])
@pytest.mark.parametrize("affine,track", [(True, True), (False, True), (True, False)])
def test_a_dtype_torch_refuses_is_refused_with_one_message(x_dtype, layer_dtype, affine, track):
    def call(m, nn_):
        layer = nn_.BatchNorm2d(3, affine=affine, track_running_stats=track, dtype=getattr(m, layer_dtype))
        return layer(m.ones(2, 3, 2, 2).to(getattr(m, x_dtype)))

    with pytest.raises(RuntimeError, match="mixed dtype"):
        call(torch, torch.nn)
    with pytest.raises(ValueError, match=rf"BatchNorm2d: expected an input of the layer's dtype {layer_dtype} "
                                         rf".*got input of dtype {x_dtype}\nHINT: cast the input"):
        call(it, nn)


@pytest.mark.parametrize("kwargs", [{}, {"bias": False}, {"affine": False}, {"track_running_stats": False}])
def test_an_empty_batch_gives_an_empty_output_as_torch(kwargs):
    def run(m, nn_):
        layer = nn_.BatchNorm2d(3, **kwargs)
        x = m.ones(0, 3, 2, 2, requires_grad=True)
        out = layer(x)
        out.sum().backward()
        return (out, x.grad, *(p.grad for p in layer.parameters()), *layer.state_dict().values(),
                layer.eval()(x.detach()))

    ours, theirs = run(it, nn), run(torch, torch.nn)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert tuple(a.shape) == tuple(b.shape) and str(a.dtype).split(".")[-1] == str(b.dtype).split(".")[-1]
        np.testing.assert_array_equal(a.numpy(), b.detach().numpy())


def test_an_empty_batch_with_the_wrong_channel_count_is_refused():
    with pytest.raises(ValueError, match=r"BatchNorm1d: expected 3 channels \(dim 1\), got input of shape \(0, 4\)"):
        nn.BatchNorm1d(3)(it.ones(0, 4))
