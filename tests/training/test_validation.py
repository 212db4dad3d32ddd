"""Validation evaluates train.val_max_steps batches of train.batch_size sequences from the start of data.val whatever
the layout: the data-parallel ranks share those batches, so every layout reports the one process's figure."""
import json

import numpy as np
import pytest

from infini_train.training.evaluation import token_weighted_mean
from tests.distributed.mpi_jobs import needs_mpiexec
from tests.training.tiny_run import run, tiny_args

pytestmark = pytest.mark.layouts


def val_losses(out):
    return [r["val_loss"] for r in map(json.loads, open(out / "metrics.jsonl")) if "val_loss" in r]


def test_token_weighted_mean():
    # equal counts: the plain mean of the batch losses, bit for bit
    losses = [5.489623228708903, 5.160056908925374, 5.0336845715840655]
    assert token_weighted_mean(losses, [128, 128, 128]) == float(np.mean(losses))
    # unequal counts: every token weighs alike (a batch of 3 tokens at 1.0 and one of 1 token at 3.0)
    assert token_weighted_mean([1.0, 3.0], [3, 1]) == 1.5


@pytest.fixture(scope="module")
def one_process(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("val") / "one"
    run(tiny_args(data_dir, out, *SHAPE))
    return val_losses(out)


# 3 validation batches of 4 sequences (not a multiple of 2 ranks), validated at steps 0 and 2
SHAPE = ("train.total_batch_size=768", "train.num_iterations=2", "train.val_loss_every=2", "train.val_max_steps=3")


@needs_mpiexec
@pytest.mark.parametrize("ranks,extra", [(2, ()), (3, ()), (2, ("parallel.zero_stage=3",)),
                                         (2, ("parallel.tensor=2",))])
def test_the_validation_loss_does_not_depend_on_the_layout(data_dir, tmp_path, one_process, ranks, extra):
    out = tmp_path / "run"
    run(tiny_args(data_dir, out, *SHAPE, *extra), ranks=ranks)
    got = val_losses(out)
    assert len(got) == len(one_process) == 2
    if "parallel.tensor=2" in extra:  # the split products round differently
        np.testing.assert_allclose(got, one_process, rtol=1e-5)
    else:  # each batch is the one process's batch, computed alike: the same bits
        assert got[0] == one_process[0]
        np.testing.assert_allclose(got[1], one_process[1], rtol=1e-5)  # (after two steps of averaged gradients)
