"""Where a run starts: a fresh run refuses an out_dir holding another run's checkpoints; resume=auto skips a
damaged newest checkpoint (truncated, missing or edited file) with a warning and resumes bitwise from the newest
good one; an explicitly named damaged checkpoint, a missing path or another model shape is one clear error."""
import json
import os
import shutil

import pytest

from infini_train.run_state import list_checkpoints
from tests.training.tiny_run import metrics, run, same_run, tiny_args

COMMON = ["train.num_iterations=12", "train.save_every=4", "train.keep_last=3", "model.dropout=0.1"]


@pytest.fixture(scope="module")
def finished(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("finished")
    run(tiny_args(data_dir, out, *COMMON))
    return out


def test_a_fresh_run_refuses_an_out_dir_with_another_runs_checkpoints(data_dir, finished, tmp_path):
    before = list_checkpoints(finished)
    proc = run(tiny_args(data_dir, finished, "train.num_iterations=3", "train.save_every=1"), check=False)
    assert proc.returncode == 1
    assert (f"error: out_dir: {finished} already holds 3 checkpoint(s) of an earlier run (newest step_000012)"
            in proc.stderr)
    assert "HINT: pass resume=auto to continue that run" in proc.stderr
    assert list_checkpoints(finished) == before


def _damage(path, kind):
    if kind == "truncated":
        with open(os.path.join(path, "model.safetensors"), "r+b") as f:
            f.truncate(os.path.getsize(f.name) // 2)
        return "model.safetensors is truncated"
    if kind == "missing":
        os.remove(os.path.join(path, "optimizer.safetensors"))
        return "optimizer.safetensors is missing"
    if kind == "edited_tensor":
        with open(os.path.join(path, "model.safetensors"), "r+b") as f:
            f.seek(-3, os.SEEK_END)
            byte = f.read(1)
            f.seek(-3, os.SEEK_END)
            f.write(bytes([byte[0] ^ 1]))
        return "model.safetensors was modified"
    with open(os.path.join(path, "state.json")) as f:
        state = json.load(f)
    state["step"] = 11  # still valid JSON: only the recorded digest can tell
    with open(os.path.join(path, "state.json"), "w") as f:
        json.dump(state, f)
    return "state.json was edited"


@pytest.mark.parametrize("kind", ["truncated", "missing", "edited_tensor", "edited_state"])
def test_resume_auto_skips_a_damaged_newest_checkpoint(data_dir, finished, tmp_path, kind):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    shutil.rmtree(out / "checkpoints" / "step_000012")  # as if stopped after the step-8 checkpoint...
    newest = str(out / "checkpoints" / "step_000008")
    why = _damage(newest, kind)  # ...and that checkpoint was damaged afterwards
    proc = run(tiny_args(data_dir, out, *COMMON, "resume=auto"))
    assert f"warning: resume=auto: skipping checkpoint {newest} is damaged: {why}" in proc.stderr
    assert f"resumed from {out / 'checkpoints' / 'step_000004'} at step 4" in proc.stdout
    same_run(finished, out)


def test_an_explicitly_named_damaged_checkpoint_is_one_clear_error(data_dir, finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    target = str(out / "checkpoints" / "step_000008")
    why = _damage(target, "truncated")
    proc = run(tiny_args(data_dir, out, *COMMON, f"resume={target}"), check=False)
    assert proc.returncode == 1
    assert f"error: checkpoint {target} is damaged: {why}" in proc.stderr and "Traceback" not in proc.stderr


def test_resume_from_a_state_json_path_and_from_a_missing_path(data_dir, finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    shutil.rmtree(out / "checkpoints" / "step_000012")
    state = out / "checkpoints" / "step_000008" / "state.json"
    proc = run(tiny_args(data_dir, out, *COMMON, f"resume={state}"))
    assert "at step 8" in proc.stdout
    same_run(finished, out)
    missing = tmp_path / "nowhere"
    proc = run(tiny_args(data_dir, tmp_path / "other", *COMMON, f"resume={missing}"), check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"error: no checkpoint found at {missing}: the path does not exist" in proc.stderr


def test_resume_with_another_model_shape_is_one_clear_error(data_dir, finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    proc = run(tiny_args(data_dir, out, *COMMON, "resume=auto", "model.n_embd=32"), check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "was trained with another model shape (model.n_embd: checkpoint 64, config 32)" in proc.stderr
    assert f"HINT: resume with the run's own config ({out / 'config.yaml'})" in proc.stderr


def test_metrics_of_a_resumed_run_read_like_one_run(data_dir, finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    shutil.rmtree(out / "checkpoints" / "step_000012")
    run(tiny_args(data_dir, out, *COMMON, "resume=auto"))
    assert [r["step"] for r in metrics(out)] == list(range(13))


def _tree_snapshot(out):
    """(relative path, size, mtime) of every file under ``out``: what 'touch nothing' means."""
    found = []
    for root, _, files in os.walk(out):
        for name in files:
            path = os.path.join(root, name)
            st = os.stat(path)
            found.append((os.path.relpath(path, out), st.st_size, st.st_mtime_ns))
    return sorted(found)


@pytest.mark.parametrize("kind", ["edited_state", "truncated"])
def test_resume_auto_with_no_checkpoint_that_verifies_stops_and_touches_nothing(data_dir, finished, tmp_path, kind):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    damaged = list_checkpoints(out)
    reasons = [_damage(path, kind) for path in damaged]
    before = _tree_snapshot(out)
    proc = run(tiny_args(data_dir, out, *COMMON, "resume=auto"), check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"error: resume=auto: none of the 3 checkpoint(s) in {out} verifies" in proc.stderr
    for path, why in zip(damaged, reasons):
        assert proc.stderr.count(f"checkpoint {path} is damaged: {why}") == 1  # listed once, in the one error
    assert "HINT: restore a good copy" in proc.stderr
    assert "step     1/" not in proc.stdout  # not a single step trained
    assert _tree_snapshot(out) == before


def test_resume_auto_in_an_out_dir_without_checkpoints_starts_fresh(data_dir, tmp_path):
    out = tmp_path / "run"
    os.makedirs(out / "checkpoints")
    proc = run(tiny_args(data_dir, out, "train.num_iterations=2", "resume=auto"))
    assert "resumed from" not in proc.stdout
    assert [r["step"] for r in metrics(out)] == [0, 1, 2]


def test_resume_auto_sets_a_damaged_checkpoint_aside_so_pruning_keeps_the_good_ones(tmp_path, capsys):
    import numpy as np

    from infini_train.run_state import save_checkpoint
    from infini_train.training.config import load_config
    from infini_train.training.resume import choose_checkpoint

    def save(step):
        return save_checkpoint(tmp_path, step, {"w": np.full(3, step, np.float32)}, {}, {}, keep_last=2, run_id="r")

    good, damaged = save(10), save(20)
    why = _damage(damaged, "truncated")
    assert choose_checkpoint(load_config(None, [f"out_dir={tmp_path}", "resume=auto"])) == good
    aside = damaged + ".damaged"
    err = capsys.readouterr().err
    assert f"warning: resume=auto: skipping checkpoint {damaged} is damaged: {why}" in err
    assert f"; moved it to {aside} so that train.keep_last does not count it" in err
    assert os.path.isdir(aside) and not os.path.exists(damaged)
    save(12)  # the resumed run's next checkpoint: train.keep_last=2 keeps step 10, never the damaged step 20
    assert [os.path.basename(p) for p in list_checkpoints(tmp_path)] == ["step_000010", "step_000012"]
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["step_000010", "step_000012", "step_000020.damaged"]


def _stopped_after_step_8(finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    shutil.rmtree(out / "checkpoints" / "step_000012")
    return out, str(out / "checkpoints" / "step_000008")


def test_resume_refuses_a_config_that_changes_the_run_and_lists_every_change(data_dir, finished, tmp_path):
    out, newest = _stopped_after_step_8(finished, tmp_path)
    first_config = (out / "config.yaml").read_bytes()
    one_shard = f"{data_dir}/train_000000.bin"
    proc = run(tiny_args(data_dir, out, *COMMON, "resume=auto", "train.learning_rate=2e-3",
                         "train.total_batch_size=256", "seed=7", f"data.train={one_shard}",
                         "train.num_iterations=16"), check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert (f"error: resume: checkpoint {newest} was trained with another config; resuming under these changes would "
            "continue another run than the one it recorded:\n"
            f"  data.train: checkpoint '{data_dir}/train_*.bin', config '{one_shard}'\n"
            "  train.total_batch_size: checkpoint 128, config 256\n"
            "  train.learning_rate: checkpoint 0.001, config 0.002\n"
            "  seed: checkpoint 1337, config 7\n"
            "also changed, which keeps the run:\n"
            "  train.num_iterations: checkpoint 12, config 16 (the run's length; the learning-rate schedule follows "
            "the new length from here)\n"
            f"  out_dir: checkpoint '{finished}', config '{out}' (where the run writes)\n"
            f"HINT: resume with the run's own config ({out / 'config.yaml'}), set resume_allow_changes=true to "
            "continue under these changes on purpose, or start a new run in another out_dir") in proc.stderr
    assert "step     9/" not in proc.stdout
    assert (out / "config.yaml").read_bytes() == first_config
    assert not list(out.glob("config.resume-*"))


def test_resume_lists_changes_that_keep_the_run_and_keeps_each_resumes_config(data_dir, finished, tmp_path):
    from infini_train.training.config import load_config

    out, newest = _stopped_after_step_8(finished, tmp_path)
    first_config = (out / "config.yaml").read_bytes()
    proc = run(tiny_args(data_dir, out, *COMMON, "resume=auto", "train.log_every=2", "train.keep_last=4"))
    assert (f"resume: the config differs from checkpoint {newest}'s:\n"
            "  train.keep_last: checkpoint 3, config 4 (checkpoints)\n"
            "  train.log_every: checkpoint 1, config 2 (reporting)\n"
            f"  out_dir: checkpoint '{finished}', config '{out}' (where the run writes)\n") in proc.stdout
    assert "warning: resume" not in proc.stderr
    same_run(finished, out)  # bitwise the uninterrupted run
    assert (out / "config.yaml").read_bytes() == first_config  # the run's record stays
    resumed = load_config(str(out / "config.resume-000008.yaml"))
    assert (resumed.train.log_every, resumed.train.keep_last, resumed.resume) == (2, 4, "auto")


def test_resume_allow_changes_continues_under_a_changed_config_with_a_warning(data_dir, finished, tmp_path):
    from infini_train.training.config import load_config

    out, newest = _stopped_after_step_8(finished, tmp_path)
    first_config = (out / "config.yaml").read_bytes()
    proc = run(tiny_args(data_dir, out, *COMMON, "resume=auto", "train.learning_rate=2e-3", "seed=7",
                         "resume_allow_changes=true"))
    assert (f"warning: resume: continuing under a changed config (resume_allow_changes=true); from checkpoint "
            f"{newest} on the run differs from the one it recorded:\n"
            "  train.learning_rate: checkpoint 0.001, config 0.002\n"
            "  seed: checkpoint 1337, config 7\n") in proc.stderr
    assert f"resumed from {newest} at step 8" in proc.stdout
    assert (out / "config.yaml").read_bytes() == first_config
    resumed = load_config(str(out / "config.resume-000008.yaml"))
    assert (resumed.train.learning_rate, resumed.seed, resumed.resume_allow_changes) == (2e-3, 7, True)


def test_resume_allow_changes_is_a_validated_config_key():
    from infini_train.training.config import ConfigError, load_config

    assert load_config(None, []).resume_allow_changes is False
    with pytest.raises(ConfigError, match=r"resume_allow_changes: expected bool, got 'maybe' \(str\)"):
        load_config(None, ["resume_allow_changes=maybe"])
    with pytest.raises(ConfigError, match=r"resume_allow_change: unknown key \(did you mean 'resume_allow_changes'"):
        load_config(None, ["resume_allow_change=true"])


def test_a_model_shape_mismatch_names_the_run_config_keys():
    from infini_train.models.llama.config import LlamaConfig
    from infini_train.training.config import ConfigError
    from infini_train.training.resume import check_same_model

    saved = LlamaConfig(dim=48, n_layers=2, n_heads=4, n_kv_heads=2, intermediate_size=96, vocab_size=300)
    config = dict(saved.to_dict(), n_layers=3, dim=64, max_seq_len=4096, attention_bias=True, mlp_bias=True)
    with pytest.raises(ConfigError) as info:
        check_same_model({"arch": "llama3", "model_config": saved.to_dict()}, "llama3", config, "/r/checkpoints/step_4")
    assert str(info.value).startswith(
        "resume: checkpoint /r/checkpoints/step_4 was trained with another model shape (model.n_embd: checkpoint 48, "
        "config 64; model.n_layer: checkpoint 2, config 3; model.block_size: checkpoint 2048, config 4096; "
        "model.bias: checkpoint False, config True)\nHINT: resume with the run's own config (/r/config.yaml)")
