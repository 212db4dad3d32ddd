"""Block recomputation (``train.recompute: block``) in both models: with dropout on, the gradients equal the stored
run's; every block's forward runs twice per step (once more in backward) and only the block inputs stay saved; whole
runs (one process, TP2 + sequence parallel, PP2) give bitwise the losses and weights of the run without it."""
import numpy as np
import pytest

import infini_train as it
from infini_train.models.gpt2 import GPT2, GPT2Config
from infini_train.models.llama import Llama, LlamaConfig
from infini_train.models.recompute import set_recompute
from tests.distributed.mpi_jobs import needs_mpiexec
from tests.training.tiny_run import run, same_run, tiny_args

MODELS = {
    "gpt2": lambda: GPT2(GPT2Config(block_size=32, vocab_size=97, n_layer=3, n_head=2, n_embd=32, dropout=0.1)),
    "llama3": lambda: Llama(LlamaConfig(vocab_size=97, dim=32, n_layers=3, n_heads=4, n_kv_heads=2,
                                        intermediate_size=64, max_seq_len=32, dropout=0.1)),
}


def _step(arch, mode):
    """One forward and backward from the same seed; the gradients and the number of block forwards."""
    it.manual_seed(0)
    model = set_recompute(MODELS[arch](), mode)
    calls = []
    for _, block in model.numbered_blocks():
        block.register_forward_hook(lambda *a: calls.append(1))
    idx = it.tensor(np.random.default_rng(1).integers(0, 97, (4, 24)))
    _, loss = model(idx, idx)
    forwards = len(calls)
    loss.backward()
    return {k: p.grad.numpy() for k, p in model.named_parameters()}, forwards, len(calls)


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_recomputed_gradients_equal_the_stored_ones_with_dropout(arch):
    stored, fwd, total = _step(arch, "none")
    recomputed, fwd_rc, total_rc = _step(arch, "block")
    assert (fwd, total) == (3, 3) and (fwd_rc, total_rc) == (3, 6)  # each block runs again in backward
    assert sorted(stored) == sorted(recomputed)
    for name in stored:
        np.testing.assert_allclose(recomputed[name], stored[name], rtol=1e-6, atol=0, err_msg=name)
        assert np.abs(stored[name]).max() > 0, name


def test_recompute_is_off_under_no_grad_and_in_eval():
    it.manual_seed(0)
    model = set_recompute(MODELS["gpt2"](), "block").eval()
    idx = it.tensor(np.random.default_rng(1).integers(0, 97, (2, 16)))
    with it.no_grad():
        logits, _ = model(idx)
    reference = set_recompute(model, "none")(idx)[0]
    np.testing.assert_array_equal(logits.numpy(), reference.numpy())


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match=r"train.recompute: expected one of \('none', 'block'\), got 'layer'"):
        set_recompute(MODELS["gpt2"](), "layer")


LLAMA = ["model.arch=llama3", "model.n_layer=4", "model.n_head=4", "model.n_kv_head=2", "model.intermediate_size=128",
         "model.dropout=0.1"]
LAYOUTS = {
    "gpt2-single": (1, ["model.dropout=0.1"]),
    "llama3-single": (1, LLAMA),
    "gpt2-tp2-sp": (2, ["model.dropout=0.1", "parallel.tensor=2", "parallel.sequence=true"]),
    "llama3-tp2": (2, [*LLAMA, "parallel.tensor=2"]),
    "gpt2-pp2-1f1b": (2, ["model.dropout=0.1", "parallel.pipeline=2", "parallel.pipeline_schedule=1f1b",
                          "train.total_batch_size=256"]),
}


@needs_mpiexec
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_recomputed_run_is_bitwise_the_stored_run(data_dir, tmp_path, layout):
    ranks, extra = LAYOUTS[layout]
    outs = []
    for mode in ("none", "block"):
        outs.append(tmp_path / mode)
        run(tiny_args(data_dir, outs[-1], "train.num_iterations=6", f"train.recompute={mode}", *extra), ranks=ranks)
    same_run(*outs)


def test_a_misspelled_recompute_setting_names_the_key(data_dir, tmp_path):
    proc = run(tiny_args(data_dir, tmp_path / "x", "train.num_iterations=1", "train.recompute=blocks"), check=False)
    assert proc.returncode != 0
    assert "train.recompute: expected one of ('none', 'block') (did you mean 'block'?)" in proc.stderr, proc.stderr
