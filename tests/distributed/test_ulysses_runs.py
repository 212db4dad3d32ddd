"""Runs with ``parallel.context_method`` ulysses (all-to-all over the heads) and hybrid (all-to-all inside pairs of
context ranks, ring attention across them): Ulysses CP2 and CP4 on tiny GPT-2 and tiny LLaMA (grouped-query heads),
hybrid CP 2 x 2 with attention dropout, Ulysses CP2 x DP2 x ZeRO-2, CP2 x TP2 (the heads split twice) and Ulysses
with recompute and dropout give the one-process losses and gradient norms over 10 steps (rtol 1e-4); a ring
checkpoint resumes under Ulysses and a Ulysses one under hybrid, each continuing the uninterrupted run; heads or
groups that do not split are refused."""
import numpy as np
import pytest

from infini_train.run_state import list_checkpoints
from tests.distributed.mpi_jobs import needs_mpiexec, output
from tests.training.tiny_run import grad_norms, losses_by_step, run, tiny_args

pytestmark = needs_mpiexec
RERUN = {"ulysses-cp2-llama3", "hybrid-2x2-dropout-llama3"}  # also in the layouts pass (another BLAS kernel family)

SHAPE = ["model.n_head=4", "train.val_loss_every=0", "train.grad_clip=0.5", "train.learning_rate=3e-3",
         "train.total_batch_size=256", "train.batch_size=2", "train.num_iterations=10"]
# LLaMA with 8 query and 4 key/value heads: both split over 2 and 4 ranks
MODELS = {"gpt2": [], "llama3": ["model.arch=llama3", "model.n_head=8", "model.n_kv_head=4",
                                 "model.rope_scaling_factor=0"]}
DROPOUT = ["model.dropout=0.1"]  # LLaMA's: on the attention probabilities, whose masks every method draws alike
ULYSSES = ["parallel.context_method=ulysses"]
HYBRID = ["parallel.context=4", "parallel.context_method=hybrid", "parallel.context_a2a=2"]


def _train(data_dir, out, ranks, *extra, check=True):
    return run(tiny_args(data_dir, out, *SHAPE, *extra), ranks=ranks, check=check)


@pytest.fixture(scope="module")
def single(data_dir, tmp_path_factory):
    runs = {}
    for name, model, more in (("gpt2", "gpt2", []), ("llama3", "llama3", []), ("dropout", "llama3", DROPOUT)):
        out = tmp_path_factory.mktemp(name)
        _train(data_dir, out, 1, *MODELS[model], *more)
        runs[name] = out
    return runs


def _same(got_dir, want_dir, steps=range(10)):
    want, got = losses_by_step(want_dir), losses_by_step(got_dir)
    assert sorted(got) == list(steps)
    np.testing.assert_allclose([got[s] for s in steps], [want[s] for s in steps], rtol=1e-4)


LAYOUTS = {  # name: (ranks, model, the one-process run it equals, settings)
    "ulysses-cp2-gpt2": (2, "gpt2", "gpt2", ["parallel.context=2", *ULYSSES]),
    "ulysses-cp4-gpt2": (4, "gpt2", "gpt2", ["parallel.context=4", *ULYSSES]),
    "ulysses-cp2-llama3": (2, "llama3", "llama3", ["parallel.context=2", *ULYSSES]),
    "ulysses-cp4-llama3": (4, "llama3", "llama3", ["parallel.context=4", *ULYSSES]),
    "hybrid-2x2-dropout-llama3": (4, "llama3", "dropout", [*HYBRID, *DROPOUT]),
    "ulysses-cp2xdp2xzero2-llama3": (4, "llama3", "llama3", ["parallel.context=2", *ULYSSES, "parallel.zero_stage=2"]),
    "ulysses-cp2xtp2-llama3": (4, "llama3", "llama3", ["parallel.context=2", *ULYSSES, "parallel.tensor=2"]),
    "ulysses-cp2-recompute-dropout-llama3": (2, "llama3", "dropout", ["parallel.context=2", *ULYSSES, *DROPOUT,
                                                                      "train.recompute=block"]),
}


@pytest.mark.parametrize("layout", [pytest.param(k, marks=pytest.mark.layouts) if k in RERUN else k for k in LAYOUTS])
def test_ulysses_and_hybrid_give_the_one_process_losses(data_dir, single, tmp_path, layout):
    ranks, model, reference, parallel = LAYOUTS[layout]
    out = tmp_path / "run"
    proc = _train(data_dir, out, ranks, *MODELS[model], *parallel)
    method = "hybrid: all-to-all 2 x ring 2" if "hybrid" in layout else "ulysses"
    context = next(k for k in parallel if k.startswith("parallel.context="))
    assert f"CP{context.split('=')[1]} ({method})" in proc.stdout, output(proc)
    _same(out, single[reference])
    np.testing.assert_allclose(grad_norms(out), grad_norms(single[reference]), rtol=1e-4)


def test_checkpoints_resume_across_context_methods(data_dir, single, tmp_path):
    llama = MODELS["llama3"]
    ring = tmp_path / "ring"
    _train(data_dir, ring, 2, *llama, "parallel.context=2", "train.save_every=5")
    ulysses = tmp_path / "ulysses"
    proc = _train(data_dir, ulysses, 2, *llama, "parallel.context=2", *ULYSSES,
                  f"resume={list_checkpoints(ring)[0]}", "train.save_every=7")
    assert "at step 5" in proc.stdout, output(proc)
    _same(ulysses, single["llama3"], range(5, 10))
    hybrid = tmp_path / "hybrid"
    proc = _train(data_dir, hybrid, 4, *llama, *HYBRID, f"resume={list_checkpoints(ulysses)[0]}")
    assert "at step 7" in proc.stdout, output(proc)
    _same(hybrid, single["llama3"], range(7, 10))


@pytest.mark.parametrize("extra,message", [
    (["parallel.context=4", *ULYSSES, "model.arch=llama3", "model.n_kv_head=2", "model.rope_scaling_factor=0"],
     "parallel.context: expected a divisor of model n_kv_head (2) with parallel.context_method=ulysses"),
    (["parallel.context=4", "parallel.context_method=hybrid", "parallel.context_a2a=3"],
     "parallel.context_a2a: expected a divisor of parallel.context (4) greater than 1 and less than it"),
    (["parallel.context=4", "parallel.context_method=hybrid"],
     "parallel.context_a2a: expected a divisor of parallel.context (4) greater than 1 and less than it with "
     "parallel.context_method=hybrid (all-to-all inside groups of context_a2a consecutive context ranks, ring "
     "attention across the groups), got 1; HINT: use one of [2]"),
    (["parallel.context=2", *ULYSSES, "parallel.context_a2a=2"],
     "parallel.context_a2a: expected 1 with parallel.context_method=ulysses"),
    (["parallel.context=2", "parallel.context_method=ulyses"],
     "parallel.context_method: expected one of ('ring', 'ulysses', 'hybrid') (did you mean 'ulysses'?)")])
def test_layouts_whose_heads_or_groups_do_not_split_are_refused(data_dir, tmp_path, extra, message):
    proc = _train(data_dir, tmp_path / "x", 1, *extra, check=False)
    assert proc.returncode != 0 and message in proc.stderr, output(proc)
