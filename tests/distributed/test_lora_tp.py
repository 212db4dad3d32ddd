"""LoRA under tensor (+ sequence) parallelism: real MPI jobs (worker_lora_tp.py compares a split GPT-2 with adapters
against the one-process LoRA model: loss, whole adapter gradients, merging, saved and loaded adapter files), and
a world of one without a launcher."""
import os
import re

import pytest

from tests.distributed.mpi_jobs import HERE, assert_every_rank_checked, mpirun, needs_mpiexec, output, python

pytestmark = pytest.mark.layouts


@needs_mpiexec
@pytest.mark.parametrize("ranks, sequence", [(2, False), (2, True), (4, True)],
                         ids=["tp2", "tp2-sequence", "tp4-sequence"])
def test_lora_on_split_gpt2_matches_one_process(tmp_path, ranks, sequence):
    proc = mpirun(ranks, "worker_lora_tp.py", "--out", str(tmp_path), *(["--sequence-parallel"] if sequence else []),
                  timeout=300)
    assert proc.returncode == 0, output(proc)
    assert_every_rank_checked(proc, "LoRA TP OK", ranks, at_least=60)
    assert sorted(os.listdir(tmp_path / "tp")) == ["adapter_config.json", "adapter_model.safetensors"]


def test_lora_worker_in_a_world_of_one_without_a_launcher(tmp_path):
    proc = python(os.path.join(HERE, "worker_lora_tp.py"), "--out", str(tmp_path), timeout=120)
    assert proc.returncode == 0, output(proc)
    assert re.fullmatch(r"rank 0 LoRA TP OK \d+", proc.stdout.strip()), output(proc)
