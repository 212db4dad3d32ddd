"""train.checkpoint_async: checkpoints written in the background are the synchronous ones file for file (one process,
whole format; two ranks under ZeRO-3, sharded), a job killed while its writer works leaves the previous checkpoint
as the one resume=auto picks and the resumed run equals the uninterrupted one bitwise, and a writer's error ends the
run with that error."""
import os
import signal
import subprocess
import time

import numpy as np
import pytest

import infini_train as it

from infini_train.run_state import list_checkpoints
from infini_train.run_state import async_save
from infini_train.training import Run
from infini_train.training.config import parse_args
from tests.distributed.mpi_jobs import needs_mpiexec
from tests.training.tiny_run import CONFIG, command, job_env, losses_by_step, run, same_run, tiny_args

COMMON = ("train.num_iterations=6", "train.save_every=2", "train.keep_last=0", "train.val_loss_every=3")
ZERO3 = ("parallel.zero_stage=3", "train.total_batch_size=256")


def _files(step_dir):
    """{file: bytes} of a checkpoint directory, state.json's run-specific lines aside."""
    out = {}
    for name in sorted(os.listdir(step_dir)):
        with open(os.path.join(step_dir, name), "rb") as f:
            out[name] = f.read()
    out.pop("state.json")
    return out


def _same_checkpoints(a, b):
    steps_a, steps_b = list_checkpoints(a), list_checkpoints(b)
    assert [os.path.basename(p) for p in steps_a] == [os.path.basename(p) for p in steps_b] == \
        ["step_000002", "step_000004", "step_000006"]
    for pa, pb in zip(steps_a, steps_b):
        assert _files(pa) == _files(pb), pa


def test_one_process_background_checkpoints_are_the_synchronous_ones(data_dir, tmp_path):
    sync, background = tmp_path / "sync", tmp_path / "async"
    run(tiny_args(data_dir, sync, *COMMON))
    proc = run(tiny_args(data_dir, background, *COMMON, "train.checkpoint_async=true"))
    assert "step_000002: staged" in proc.stdout and "writing in the background" in proc.stdout
    assert f"saved checkpoint {background}/checkpoints/step_000004 (in the background)" in proc.stdout
    same_run(sync, background)
    _same_checkpoints(sync, background)


@needs_mpiexec
def test_two_ranks_sharded_background_checkpoints_are_the_synchronous_ones(data_dir, tmp_path):
    sync, background = tmp_path / "sync", tmp_path / "async"
    run(tiny_args(data_dir, sync, *COMMON, *ZERO3), ranks=2)
    run(tiny_args(data_dir, background, *COMMON, *ZERO3, "train.checkpoint_async=true"), ranks=2)
    same_run(sync, background)
    _same_checkpoints(sync, background)
    assert not [n for n in os.listdir(list_checkpoints(background)[-1]) if n.endswith((".done", ".error"))]


@needs_mpiexec
def test_a_job_killed_mid_write_resumes_from_the_previous_checkpoint_bitwise(data_dir, tmp_path):
    full, killed = tmp_path / "full", tmp_path / "killed"
    run(tiny_args(data_dir, full, *COMMON, *ZERO3), ranks=2)
    env = job_env(**{async_save.DELAY_ENV: "120@4"})  # the writers of step 4 wait: the job dies mid-save
    proc = subprocess.Popen(command(tiny_args(data_dir, killed, *COMMON, *ZERO3, "train.checkpoint_async=true"),
                                    ranks=2), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)
    seen, deadline = [], time.monotonic() + 120
    try:
        for line in proc.stdout:
            seen.append(line)
            if "step_000004: staged" in line:
                break
            assert time.monotonic() < deadline, "".join(seen)
        time.sleep(1.0)  # the ranks train on while the writers wait
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert any("step_000002 (in the background)" in line for line in seen), "".join(seen)
    assert [os.path.basename(p) for p in list_checkpoints(killed)] == ["step_000002"]
    leftovers = os.listdir(killed / "checkpoints")
    assert any(n.startswith(".tmp-step_000004") for n in leftovers), leftovers  # unfinished: not a checkpoint
    resumed = run(tiny_args(data_dir, killed, *COMMON, *ZERO3, "train.checkpoint_async=true", "resume=auto"),
                  ranks=2)
    assert "at step 2" in resumed.stdout, resumed.stdout
    assert not [n for n in os.listdir(killed / "checkpoints") if n.startswith(".tmp")]  # the next save cleaned up
    same_run(full, killed)
    np.testing.assert_array_equal([losses_by_step(killed)[s] for s in range(6)],
                                  [losses_by_step(full)[s] for s in range(6)])


def test_a_writer_error_ends_the_run_with_that_error(data_dir, tmp_path, monkeypatch):
    from infini_train.run_state import writer

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer.whole_files, "write_files", full_disk)
    cfg = parse_args(["--config", CONFIG, *tiny_args(data_dir, tmp_path / "run", *COMMON,
                                                     "train.checkpoint_async=true")])
    with pytest.raises(RuntimeError, match=r"asynchronous checkpoint of step 2 failed: OSError: \[Errno 28\] No "
                                           r"space left on device"):
        Run(cfg).train()
    assert list_checkpoints(tmp_path / "run") == []


def test_rank0_names_the_ranks_whose_shards_never_came(tmp_path):
    async_save.write_marker(str(tmp_path), 0, ("shard00000.safetensors", 10, "ab"))
    with pytest.raises(RuntimeError, match=r"ranks \[1, 2\] did not finish writing their shards within 0.2 s"):
        async_save.collect_markers(str(tmp_path), 3, timeout=0.2)
    async_save.write_marker(str(tmp_path), 1, error="OSError: disk quota exceeded")
    with pytest.raises(RuntimeError, match="rank 1's writer failed: OSError: disk quota exceeded"):
        async_save.collect_markers(str(tmp_path), 3, timeout=0.2)
    os.remove(tmp_path / "shard00001.error")
    async_save.write_marker(str(tmp_path), 1, None)
    async_save.write_marker(str(tmp_path), 2, ("shard00002.safetensors", 7, "cd"))
    assert async_save.collect_markers(str(tmp_path), 3) == [("shard00000.safetensors", 10, "ab"), None,
                                                             ("shard00002.safetensors", 7, "cd")]
    assert os.listdir(tmp_path) == []


def test_staged_copies_do_not_follow_the_live_arrays():
    live = np.arange(6, dtype=np.float32).reshape(2, 3)[:, 1:]
    staged = async_save.staged_copy(live)
    live += 100
    np.testing.assert_array_equal(staged, [[1, 2], [4, 5]])
    assert staged.flags.c_contiguous and async_save.staged_bytes([staged]) == 16


def test_a_later_save_stages_into_the_last_ones_buffers():
    live = np.arange(4, dtype=np.float32)
    first = async_save.staged_copy(live)
    live *= 3
    again = async_save.staged_copy(live, first)
    assert again is first
    np.testing.assert_array_equal(again, [0, 3, 6, 9])
    assert async_save.staged_copy(live.astype(np.float64), first) is not first  # another dtype: new memory


@pytest.mark.cuda
@pytest.mark.skipif(not it.backend.cuda_available(), reason="needs cupy and an NVIDIA GPU")
def test_gpu_arrays_stage_into_pinned_host_memory():
    import cupy as cp

    live = cp.arange(6, dtype=cp.float32).reshape(2, 3)[:, 1:]
    staged = async_save.staged_copy(live)
    live += 100
    np.testing.assert_array_equal(staged, [[1, 2], [4, 5]])
    assert isinstance(staged, np.ndarray) and async_save.staged_copy(live, staged) is staged
    np.testing.assert_array_equal(staged, [[101, 102], [104, 105]])


def test_the_delay_hook_is_checked(monkeypatch):
    monkeypatch.setenv(async_save.DELAY_ENV, "2.5@4")
    assert async_save.hook_delay(4) == 2.5 and async_save.hook_delay(2) == 0.0
    monkeypatch.setenv(async_save.DELAY_ENV, "soon")
    with pytest.raises(ValueError, match="INFINI_TRAIN_ASYNC_SAVE_DELAY: expected seconds, or seconds@step"):
        async_save.hook_delay(2)
