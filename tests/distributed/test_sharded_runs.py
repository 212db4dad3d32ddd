"""Runs with ``train.checkpoint_format=sharded`` (every rank writes its own shard, nothing gathered): the checkpoint
of each layout assembles to exactly the whole-format checkpoint of the same run; a sharded checkpoint resumes under
other layouts (tensor, pipeline, ZeRO stage) and continues the uninterrupted run; a damaged shard is found by
``resume=auto``, which falls back to the previous checkpoint; generation reads a sharded checkpoint directly."""
import json
import os

import numpy as np
import pytest

from infini_train.run_state import list_checkpoints, load_checkpoint, load_model_checkpoint
from tests.distributed.mpi_jobs import needs_mpiexec, output
from tests.training.tiny_run import losses_by_step, run, tiny_args

pytestmark = needs_mpiexec

SHAPE = ["model.n_head=4", "train.val_loss_every=0", "train.grad_clip=0.5", "train.learning_rate=3e-3",
         "train.total_batch_size=256", "train.save_every=3", "train.num_iterations=6"]
SHARDED = "train.checkpoint_format=sharded"
WHOLE = "train.checkpoint_format=whole"


def _train(data_dir, out, ranks, *extra, check=True):
    return run(tiny_args(data_dir, out, *SHAPE, *extra), ranks=ranks, check=check)


def _value(x):
    return np.asarray(x.numpy() if hasattr(x, "numpy") else x)


def _assert_same_checkpoint(a, b):
    """Model state, and optimizer state paired group by group and position by position, bitwise."""
    wa, oa, sa = load_checkpoint(a)
    wb, ob, sb = load_checkpoint(b)
    assert sa["step"] == sb["step"] and sorted(wa) == sorted(wb)
    for k in wa:
        np.testing.assert_array_equal(wa[k], wb[k], err_msg=k)
    for ga, gb in zip(oa["param_groups"], ob["param_groups"], strict=True):
        assert {k: v for k, v in ga.items() if k != "params"} == {k: v for k, v in gb.items() if k != "params"}
        for ia, ib in zip(ga["params"], gb["params"], strict=True):
            ea, eb = oa["state"].get(ia), ob["state"].get(ib)
            assert (ea is None) == (eb is None) and (ea is None or sorted(ea) == sorted(eb))
            for key in ea or ():
                np.testing.assert_array_equal(_value(ea[key]), _value(eb[key]), err_msg=f"{ia} {key}")


@pytest.mark.parametrize("ranks,layout", [
    (4, ["parallel.pipeline=2", "parallel.tensor=2"]),
    (4, ["parallel.tensor=2", "parallel.sequence=true", "parallel.zero_stage=2"]),
    (4, ["parallel.pipeline=2", "parallel.zero_stage=1", "parallel.pipeline_schedule=interleaved",
         "parallel.virtual_pipeline=2", "model.n_layer=4", "train.total_batch_size=512"]),
    (3, ["parallel.zero_stage=3", "train.total_batch_size=384"])],
    ids=["pp2xtp2", "tp2xdp2-sp-zero2", "pp2xdp2-zero1-interleaved", "zero3x3"])
def test_a_sharded_checkpoint_is_the_whole_checkpoint_written_by_every_rank(data_dir, tmp_path, ranks, layout):
    sharded, whole = tmp_path / "sharded", tmp_path / "whole"
    _train(data_dir, sharded, ranks, SHARDED, *layout)
    _train(data_dir, whole, ranks, WHOLE, *layout)
    assert losses_by_step(sharded) == losses_by_step(whole)
    newest = list_checkpoints(sharded)[-1]
    files = sorted(os.listdir(newest))
    assert files == ["metadata.json"] + [f"shard{r:05d}.safetensors" for r in range(ranks)] + ["state.json"], files
    with open(os.path.join(newest, "state.json")) as f:
        state = json.load(f)
    assert state["format"] == "sharded" and set(state["files"]) == set(files) - {"state.json"}
    for a, b in zip(list_checkpoints(sharded), list_checkpoints(whole), strict=True):
        _assert_same_checkpoint(a, b)
    model_state, _ = load_model_checkpoint(newest)  # what evaluate.py and generate.py read
    np.testing.assert_array_equal(model_state["lm_head.weight"], load_checkpoint(list_checkpoints(whole)[-1])[0]
                                  ["lm_head.weight"])


@pytest.mark.layouts
@pytest.mark.parametrize("first,second", [
    ((4, ["parallel.tensor=2", "parallel.zero_stage=2"]), (4, ["parallel.pipeline=2", "parallel.zero_stage=1"])),
    ((4, ["parallel.pipeline=2", "parallel.tensor=2"]), (1, [])),
    ((1, []), (4, ["parallel.pipeline=2", "parallel.tensor=2", "parallel.sequence=true"]))],
    ids=["tp2xdp2-zero2->pp2xdp2-zero1", "pp2xtp2->one", "one->pp2xtp2-sp"])
def test_a_sharded_checkpoint_resumes_under_another_layout(data_dir, tmp_path, first, second):
    uninterrupted, resumed = tmp_path / "uninterrupted", tmp_path / "resumed"
    _train(data_dir, uninterrupted, first[0], SHARDED, *first[1])
    proc = _train(data_dir, resumed, second[0], SHARDED, *second[1],
                  f"resume={list_checkpoints(uninterrupted)[0]}")
    assert "at step 3" in proc.stdout, output(proc)
    want, got = losses_by_step(uninterrupted), losses_by_step(resumed)
    assert sorted(got) == [3, 4, 5]
    np.testing.assert_allclose([got[s] for s in got], [want[s] for s in got], rtol=1e-4)


def test_resume_auto_skips_a_checkpoint_with_a_damaged_shard(data_dir, tmp_path):
    out = tmp_path / "run"
    _train(data_dir, out, 2, SHARDED, "parallel.tensor=2")
    newest = list_checkpoints(out)[-1]
    shard = os.path.join(newest, "shard00001.safetensors")
    with open(shard, "r+b") as f:
        f.seek(-4, os.SEEK_END)
        f.write(b"\xff\xff\xff\xff")
    proc = _train(data_dir, out, 2, SHARDED, "parallel.tensor=2", "train.num_iterations=7", "resume=auto")
    assert "shard00001.safetensors was modified" in proc.stdout + proc.stderr, output(proc)
    assert "at step 3" in proc.stdout, output(proc)


def test_every_rank_reports_its_peak_memory_per_phase(data_dir, tmp_path):
    from tests.training.tiny_run import all_records

    out = tmp_path / "run"
    _train(data_dir, out, 2, SHARDED, "parallel.tensor=2", "train.num_iterations=3")
    proc = _train(data_dir, out, 2, SHARDED, "parallel.tensor=2", "resume=auto")
    assert "peak resident memory of each phase:" in proc.stdout, output(proc)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("  rank ")]
    assert len(lines) == 2 and all("load " in line and "steady " in line and "save " in line for line in lines)
    record = all_records(out)[-1]
    assert record["step"] == 6 and record["memory"]["per_phase"] is True
    peaks = record["memory"]["peak_rss_mb"]
    assert set(peaks) == {"build", "load", "first_step", "steady", "save"}
    for phase in peaks:
        assert len(peaks[phase]) == 2 and all(20 < mb < 4000 for mb in peaks[phase]), (phase, peaks[phase])


def test_consolidate_writes_the_whole_checkpoint_hf_and_llmc_files(data_dir, tmp_path):
    import torch
    from transformers import GPT2LMHeadModel

    import infini_train as it
    from infini_train.models.gpt2 import GPT2
    from infini_train.tools.consolidate import main as consolidate

    sharded, whole = tmp_path / "sharded", tmp_path / "whole"
    layout = ["parallel.pipeline=2", "parallel.tensor=2"]
    _train(data_dir, sharded, 4, SHARDED, *layout)
    _train(data_dir, whole, 4, WHOLE, *layout)
    first, last = list_checkpoints(sharded)
    assert consolidate([str(first), str(tmp_path / "step3")]) == 0
    assert consolidate([str(sharded), str(tmp_path / "hf"), "--format", "hf"]) == 0
    assert consolidate([str(sharded), str(tmp_path / "model.bin"), "--format", "llmc"]) == 0
    assert consolidate([str(whole), str(tmp_path / "again")]) == 2  # already whole
    assert consolidate([str(first), str(tmp_path / "hf"), "--format", "hf"]) == 2  # never overwrites
    _assert_same_checkpoint(tmp_path / "step3", list_checkpoints(whole)[0])
    # the consolidated checkpoint resumes in one process and continues the run
    resumed = tmp_path / "resumed"
    proc = _train(data_dir, resumed, 1, f"resume={tmp_path / 'step3'}")
    assert "at step 3" in proc.stdout, output(proc)
    want, got = losses_by_step(whole), losses_by_step(resumed)
    np.testing.assert_allclose([got[s] for s in sorted(got)], [want[s] for s in sorted(got)], rtol=1e-4)
    # transformers and llm.c's loader read the model the run ended with
    weights = load_checkpoint(list_checkpoints(whole)[-1])[0]
    ours = GPT2.from_pretrained(str(tmp_path / "model.bin"))
    for name, value in ours.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), weights[name], err_msg=name)
    hf = GPT2LMHeadModel.from_pretrained(str(tmp_path / "hf")).eval()
    tokens = np.arange(12).reshape(1, 12) % 200
    with torch.no_grad():
        hf_logits = hf(torch.tensor(tokens)).logits.numpy()
    ours.eval()
    with it.no_grad():
        our_logits = ours(it.tensor(tokens))[0].numpy()
    np.testing.assert_allclose(our_logits, hf_logits, rtol=1e-4, atol=1e-4)


def test_sharded_init_gives_every_layout_the_one_process_weights_bitwise():
    from tests.distributed.mpi_jobs import mpirun

    proc = mpirun(4, "worker_sharded_init.py", timeout=240)
    assert proc.returncode == 0, output(proc)
    assert proc.stdout.count("sharded init ok") == 4, output(proc)
