import errno
import glob
import os
import re

import pytest
import yaml

from infini_train.training.config import load as config_load
from infini_train.training.config import (
    ConfigError,
    RunConfig,
    config_keys,
    load_config,
    parse_args,
    parse_value,
)
from infini_train.training.config.yaml_io import merge

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write(tmp_path, text, name="run.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def errors_of(*args):
    with pytest.raises(ConfigError) as info:
        load_config(*args)
    return str(info.value), info.value.errors


def test_unknown_keys_suggest_the_nearest_key_in_and_across_sections(tmp_path):
    path = write(tmp_path, "train:\n  learnin_rate: 0.1\nmodel:\n  n_layers: 2\nlearning_rate: 3\n"
                           "trian:\n  batch_size: 2\ndata:\n  dropout: 0.1\n")
    msg, errors = errors_of(path)
    assert "train.learnin_rate: unknown key (did you mean 'train.learning_rate'?)" in msg
    assert "model.n_layers: unknown key (did you mean 'model.n_layer'?)" in msg
    assert "learning_rate: unknown key (did you mean 'train.learning_rate'?)" in msg  # across sections
    assert "trian: unknown key (did you mean 'train'?)" in msg
    assert "data.dropout: unknown key (did you mean 'model.dropout'?)" in msg
    assert len(errors) == 5
    msg, _ = errors_of(None, ["train.warmup_iter=3", "train.foo.bar=1", "seed.x=1"])
    assert "train.warmup_iter: unknown key (did you mean 'train.warmup_iters'?)" in msg
    assert "train.foo: unknown key" in msg
    assert "seed.x: unknown key ('seed' is a setting, not a section)" in msg


def test_wrong_types_name_key_expected_type_and_value(tmp_path):
    path = write(tmp_path, "train:\n  batch_size: eight\n  num_iterations: 2.5\n  overfit_single_batch: 1\n"
                           "  learning_rate: fast\nseed: true\nmodel: 3\nresume: false\n")
    msg, errors = errors_of(path)
    assert "train.batch_size: expected int, got 'eight' (str)" in msg
    assert "train.num_iterations: expected int, got 2.5 (float)" in msg
    assert "train.overfit_single_batch: expected bool, got 1 (int)" in msg
    assert "train.learning_rate: expected float, got 'fast' (str)" in msg
    assert "seed: expected int, got True (bool)" in msg  # bools are not ints
    assert "model: expected a section of keys (like model.arch), got 3 (int)" in msg
    assert "resume: expected str, got False (bool); HINT: quote the value to pass it as text, e.g. resume: 'false'" \
        in msg
    assert len(errors) == 7
    msg, _ = errors_of(None, ["model.n_layer=null", "data.tokenizer=null"])
    assert "model.n_layer" not in msg  # optional model fields accept null
    assert "data.tokenizer: expected str, got None (NoneType); HINT: this key cannot be null" in msg


def test_quoted_numbers_and_bools_are_read_alike_in_files_and_on_the_command_line(tmp_path):
    path = write(tmp_path, 'train:\n  batch_size: "16"\n  overfit_single_batch: "true"\n  learning_rate: "3e-4"\n'
                           'plot: "false"\ndata:\n  packing: \'no\'\n')
    cfg = load_config(path)
    assert (cfg.train.batch_size, cfg.train.overfit_single_batch, cfg.train.learning_rate, cfg.plot,
            cfg.data.packing) == (16, True, 3e-4, False, False)
    quoted = load_config(None, ['plot="false"', "data.train_on_prompt='true'", 'train.batch_size="4"'])
    assert (quoted.plot, quoted.data.train_on_prompt, quoted.train.batch_size) == (False, True, 4)
    cli = load_config(None, ["plot=false", "data.packing=no", "train.overfit_single_batch=true"])
    assert (cli.plot, cli.data.packing, cli.train.overfit_single_batch) == (False, False, True)
    msg, _ = errors_of(None, ["plot=maybe", 'data.packing="1"'])
    assert "plot: expected bool, got 'maybe' (str)" in msg and "data.packing: expected bool, got '1' (str)" in msg


def test_ints_are_accepted_for_float_fields(tmp_path):
    cfg = load_config(write(tmp_path, "train:\n  weight_decay: 0\n  learning_rate: 1\nmodel:\n  dropout: 0\n"))
    assert cfg.train.weight_decay == 0.0 and isinstance(cfg.train.weight_decay, float)
    assert cfg.train.learning_rate == 1.0 and isinstance(cfg.train.learning_rate, float)
    assert isinstance(cfg.model.dropout, float)


def test_out_of_range_values_are_all_reported_in_one_error():
    msg, errors = errors_of(None, [
        "train.batch_size=0", "train.learning_rate=-1e-3", "train.warmup_iters=-3", "train.weight_decay=-1",
        "train.grad_clip=-0.5", "train.beta1=1.0", "train.beta2=-0.1", "model.dropout=1.0", "train.eps=.inf",
        "train.learning_rate_decay_frac=1.5", "dtype=float16", "device=gpu:0", "backend=gloo", "seed=-1",
        "train.val_loss_every=-1", "data.tokenizer=bpe", "data.source=web"])
    assert msg.startswith("invalid run configuration (defaults), 17 problems:")
    assert len(errors) == 17 and len(msg.splitlines()) == 18  # one line per problem
    for line in ["train.batch_size: expected an integer >= 1, got 0",
                 "train.learning_rate: expected a number >= 0 (0: the weights stay as they are, as for "
                 "evaluation-only runs), got -0.001",
                 "train.warmup_iters: expected an integer >= 0, got -3",
                 "train.weight_decay: expected a number >= 0, got -1.0",
                 "train.grad_clip: expected a number >= 0 (0 disables clipping), got -0.5",
                 "train.beta1: expected a number in [0, 1), got 1.0",
                 "train.beta2: expected a number in [0, 1), got -0.1",
                 "model.dropout: expected a number in [0, 1), got 1.0",
                 "train.eps: expected a number > 0, got inf",
                 "train.learning_rate_decay_frac: expected a number in [0, 1], got 1.5",
                 "dtype: expected one of ('float32', 'float64'), got 'float16'",
                 "device: expected 'auto', 'cpu', 'cpu:N', 'cuda' or 'cuda:N', got 'gpu:0'",
                 "backend: expected one of ('auto', 'mpi', 'nccl'), got 'gloo'",
                 "seed: expected an integer in [0, 2**63), got -1",
                 "train.val_loss_every: expected an integer >= 0 (0 disables), got -1",
                 "data.tokenizer: expected one of ('byte', 'gpt2', 'auto') or hf:PATH (a Hugging Face model "
                 "directory or its tokenizer.json), got 'bpe' (did you mean 'byte'?)",
                 "data.source: expected one of ('stdlib',) or null, got 'web'"]:
        assert line in errors


def test_type_errors_and_range_errors_are_reported_together(tmp_path):
    msg, errors = errors_of(None, ["train.batch_size=x", "train.beta2=1.5", "train.learnin_rate=1"])
    assert len(errors) == 3 and "train.beta2: expected a number in [0, 1), got 1.5" in msg


def test_bad_preset_and_model_consistency():
    msg, _ = errors_of(None, ["model.preset=gpt-2"])
    assert "model.preset: expected one of ['d12', 'd24', 'd36', 'd48', 'gpt2', 'gpt2-large', 'gpt2-medium', " \
           "'gpt2-xl'] (model.arch=gpt2) or null, got 'gpt-2' (did you mean 'gpt2'?)" in msg
    msg, _ = errors_of(None, ["model.block_size=64", "train.sequence_length=128"])
    assert "train.sequence_length: expected <= model block_size (64), got 128" in msg
    msg, _ = errors_of(None, ["model.n_embd=100", "model.n_head=3"])
    assert "model.n_head: expected n_embd (100) divisible by n_head (3), got n_embd % n_head = 1" in msg
    msg, _ = errors_of(None, ["model.preset=d12", "model.n_embd=100"])  # the preset's n_head=12
    assert "model.n_embd: expected n_embd (100) divisible by n_head (12)" in msg
    msg, _ = errors_of(None, ["model.vocab_size=200", "train.sequence_length=64"])
    assert "model.vocab_size: expected >= 257 for data.tokenizer 'byte', got 200" in msg
    msg, _ = errors_of(None, ["data.tokenizer=gpt2", "model.vocab_size=257", "train.sequence_length=64"])
    assert "model.vocab_size: expected >= 50257 for data.tokenizer 'gpt2', got 257" in msg
    msg, _ = errors_of(None, ["backend=nccl", "device=cpu"])
    assert "backend: expected 'mpi' or 'auto' with device 'cpu' (NCCL needs GPUs), got 'nccl'" in msg


def test_default_corpus_shard_names_are_checked():
    msg, _ = errors_of(None, ["data.train=data/x/*.bin"])  # would also match the val shards
    assert "data.train: expected a pattern matching the default corpus's train_NNNNNN.bin" in msg
    msg, _ = errors_of(None, ["data.train=data/x/train_*.bin", "data.val=data/y/val_*.bin"])
    assert "data.val: expected the directory of data.train ('data/x') with data.source=stdlib" in msg
    cfg = load_config(None, ["data.train=data/x/*.bin", "data.val=null", "data.source=null"])  # own shards
    assert cfg.data.val is None and cfg.data.source is None


def test_multiple_validation_passes_checks():
    msg, _ = errors_of(None, ["train.val_loss_every=10", "train.val_max_steps=0"])
    assert "train.val_max_steps: expected >= 1 when train.val_loss_every is set, got 0" in msg
    msg, _ = errors_of(None, ["train.batch_size=4", "train.sequence_length=8", "train.total_batch_size=100"])
    assert "train.total_batch_size: expected a multiple of batch_size * sequence_length = 4 * 8 = 32" in msg


def test_overrides_are_parsed_as_yaml_and_coerced_by_field_type(tmp_path):
    cfg = load_config(write(tmp_path, "train:\n  learning_rate: 1e-3\n"),
                      ["train.learning_rate=3e-4", "out_dir=runs/x", "train.overfit_single_batch=true",
                       "model.preset=d12", "model.n_layer=2", "train.num_iterations=1e4", "plot=false",
                       "data.val=null", "data.train=data/x/train_*.bin", "model.bias=no", "resume=", "out_dir=2024"])
    assert cfg.train.learning_rate == 3e-4 and isinstance(cfg.train.learning_rate, float)
    assert cfg.train.num_iterations == 10000 and isinstance(cfg.train.num_iterations, int)
    assert cfg.train.overfit_single_batch is True and cfg.plot is False and cfg.model.bias is False
    assert cfg.out_dir == "2024" and cfg.resume == "" and cfg.data.val is None
    assert cfg.data.train == "data/x/train_*.bin"
    gpt = cfg.model.to_model_config()
    assert (gpt.n_layer, gpt.n_head, gpt.n_embd, gpt.bias) == (2, 12, 768, False)
    assert parse_value("3e-4") == "3e-4" and parse_value("*.bin") == "*.bin" and parse_value("cpu:1") == "cpu:1"
    msg, _ = errors_of(None, ["train.learning_rate", "=3"])
    assert "override 'train.learning_rate': expected dotted.key=value, e.g. train.learning_rate=3e-4" in msg
    assert "override '=3': expected dotted.key=value" in msg


def test_model_config_without_preset_uses_gpt2_defaults():
    gpt = load_config(None, ["model.n_layer=3"]).model.to_model_config()
    assert (gpt.n_layer, gpt.n_head, gpt.n_embd, gpt.vocab_size, gpt.block_size) == (3, 12, 768, 50257, 1024)
    gpt = load_config(None, ["model.preset=gpt2-medium", "model.vocab_size=50304"]).model.to_model_config()
    assert (gpt.n_layer, gpt.n_head, gpt.n_embd, gpt.vocab_size) == (24, 16, 1024, 50304)


def test_grad_accum_steps_checks_divisibility_with_the_world_size():
    cfg = load_config(None, ["train.batch_size=4", "train.sequence_length=8", "train.total_batch_size=96"])
    assert cfg.train.grad_accum_steps(world_size=1) == 3 and cfg.grad_accum_steps(1) == 3
    with pytest.raises(ConfigError, match=r"train.total_batch_size: expected a multiple of batch_size \* "
                                          r"sequence_length \* world_size = 4 \* 8 \* 2 = 64, got 96\nHINT: set "
                                          r"train.total_batch_size=64 \(or 128\)"):
        cfg.train.grad_accum_steps(world_size=2)
    auto = load_config(None, ["train.batch_size=4", "train.sequence_length=8", "train.total_batch_size=0"])
    assert auto.train.grad_accum_steps(world_size=4) == 1


def test_yaml_problems(tmp_path):
    assert load_config(write(tmp_path, "")) == RunConfig()  # empty file: defaults
    assert load_config(write(tmp_path, "# only a comment\n")) == RunConfig()
    with pytest.raises(ConfigError, match="duplicate key 'batch_size'"):
        load_config(write(tmp_path, "train:\n  batch_size: 4\n  batch_size: 8\n"))
    with pytest.raises(ConfigError, match="expected a YAML mapping of keys at the top level, got"):
        load_config(write(tmp_path, "- 1\n- 2\n"))
    path = write(tmp_path, "train: [1,\n")
    with pytest.raises(ConfigError, match=re.escape(f"config file {path!r} is not valid YAML: while parsing a flow "
                                                    f"node expected the node content, but found '<stream end>' "
                                                    f"in \"{path}\", line 2, column 1")):
        load_config(path)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(str(tmp_path / "missing.yaml"))


# the language-model run configs (configs/mnist_*.yaml belong to examples/mnist, checked in tests/examples)
SHIPPED = sorted(p for p in glob.glob(os.path.join(REPO, "configs", "*.yaml"))
                 if not os.path.basename(p).startswith("mnist_"))
FIRST_SHIPPED = sorted(n for n in os.listdir(os.path.join(REPO, "configs")) if n.endswith(".yaml"))[0]


def test_all_four_shipped_configs_exist():
    assert {os.path.basename(p) for p in SHIPPED} >= {"gpt2_tiny.yaml", "gpt2_124m.yaml", "gpt2_tiny_ddp.yaml",
                                                       "gpt2_124m_ddp.yaml"}


@pytest.fixture(scope="module")
def hf_llama_dir(tmp_path_factory):
    """A tiny HF LLaMA directory standing for the model a fine-tuning config names (model.pretrained)."""
    from transformers import LlamaConfig as HFLlamaConfig
    from transformers import LlamaForCausalLM

    out = tmp_path_factory.mktemp("pretrained")
    LlamaForCausalLM(HFLlamaConfig(vocab_size=300, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, max_position_embeddings=2048)).save_pretrained(out)
    return out


@pytest.mark.parametrize("path", SHIPPED, ids=os.path.basename)
def test_shipped_configs_validate(path, hf_llama_dir):
    with open(path) as f:
        raw = yaml.safe_load(f)
    pretrained = raw["model"].get("pretrained")  # a model the user brings: here a tiny one in its place
    cfg = load_config(path, [f"model.pretrained={hf_llama_dir}"] if pretrained else [])
    assert isinstance(cfg, RunConfig)
    assert raw["out_dir"] == f"runs/{os.path.basename(path)[:-5]}"
    model = cfg.model.to_model_config()
    assert cfg.train.sequence_length <= model.context_length


def test_shipped_configs_have_the_intended_batch_arithmetic():
    def cfg(name):
        return load_config(os.path.join(REPO, "configs", name))
    tiny, tiny_ddp, big, big_ddp = (cfg(n) for n in ("gpt2_tiny.yaml", "gpt2_tiny_ddp.yaml", "gpt2_124m.yaml",
                                                       "gpt2_124m_ddp.yaml"))
    assert tiny.train.grad_accum_steps(1) == 1 and tiny.model.vocab_size == 257 and tiny.data.source == "stdlib"
    assert tiny_ddp.train.grad_accum_steps(2) == 1
    tiny_tp = cfg("gpt2_tiny_tp.yaml")  # TP2 x DP2 on 4 ranks: the global batch of tiny_ddp on 2
    assert (tiny_tp.parallel.tensor, tiny_tp.parallel.sequence) == (2, True)
    assert tiny_tp.train.grad_accum_steps(4 // tiny_tp.parallel.tensor) == 1
    assert tiny_tp.train.total_batch_size == tiny_ddp.train.total_batch_size
    tiny_pp = cfg("gpt2_tiny_pp.yaml")  # 2 stages, 4 micro-batches per step
    assert (tiny_pp.parallel.pipeline, tiny_pp.parallel.pipeline_schedule) == (2, "1f1b")
    assert tiny_pp.train.grad_accum_steps(1) == 4 and tiny_pp.model.n_layer % tiny_pp.parallel.pipeline == 0
    assert tiny_ddp.train.total_batch_size == 2 * tiny.train.batch_size * tiny.train.sequence_length
    assert big.train.grad_accum_steps(1) == 8 and big.train.total_batch_size == 524288
    assert big_ddp.train.grad_accum_steps(8) == 1 and big_ddp.backend == "nccl"
    for run in (big, big_ddp):
        t = run.train
        assert (run.model.preset, run.data.tokenizer, t.learning_rate, t.warmup_iters, t.weight_decay, t.beta1,
                t.beta2, t.grad_clip, t.num_iterations, t.learning_rate_decay_frac) == \
            ("d12", "gpt2", 6e-4, 700, 0.1, 0.9, 0.95, 1.0, 18865, 0.0)
        assert run.model.to_model_config().block_size == 1024 and t.sequence_length == 1024


def test_resolved_config_round_trips_and_is_written_atomically(tmp_path):
    cfg = load_config(os.path.join(REPO, "configs", "gpt2_tiny.yaml"),
                      [f"out_dir={tmp_path}", "train.learning_rate=3e-4", "train.eps=1e-8"])
    path = cfg.save_resolved()
    assert path == os.path.join(str(tmp_path), "config.yaml")
    assert sorted(os.listdir(tmp_path)) == ["config.yaml"]  # no temporary file left behind
    assert load_config(path) == cfg
    assert RunConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match="train.batch_siz: unknown key"):
        RunConfig.from_dict({"train": {"batch_siz": 2}})


def test_pretty_lists_every_key():
    text = load_config(None, ["train.learning_rate=3e-4"]).pretty()
    lines = text.splitlines()
    assert any(line.split() == ["train.learning_rate", "0.0003"] for line in lines)
    assert any(line.split()[:2] == ["data.train", "'data/stdlib_byte/train_*.bin'"] for line in lines)
    for key in config_keys():
        assert any(line.startswith(key + " ") for line in lines), key
    assert "(resolved model)" in text and "n_layer=12" in text


def test_parse_args(tmp_path, capsys):
    cfg = parse_args(["train.batch_size=2", "--config", os.path.join(REPO, "configs", "gpt2_124m.yaml"),
                      "out_dir=runs/y"])
    assert cfg.train.batch_size == 2 and cfg.out_dir == "runs/y" and cfg.model.preset == "d12"
    default = parse_args([])
    assert default == load_config(os.path.join(REPO, "configs", "gpt2_tiny.yaml"))
    with pytest.raises(ConfigError, match="train.learning_rat: unknown key"):
        parse_args(["train.learning_rat=1"])
    with pytest.raises(SystemExit) as info:
        parse_args(["--print-config", "seed=7"])
    assert info.value.code == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["seed"] == 7 and printed["train"]["num_iterations"] == default.train.num_iterations


TINY = os.path.join(REPO, "configs", "gpt2_tiny.yaml")


def test_mapping_overrides_merge_into_the_config_files_section():
    cfg = load_config(TINY, ["model={n_layer: 2, n_head: 2}", "train={batch_size: 2}"])
    m, t = cfg.model, cfg.train
    assert (m.n_layer, m.n_head, m.n_embd, m.block_size, m.vocab_size, m.dropout) == (2, 2, 256, 64, 257, 0.0)
    assert (t.batch_size, t.sequence_length, t.num_iterations, t.learning_rate, t.warmup_iters) == \
        (2, 64, 300, 0.001, 20)
    gpt = m.to_model_config()
    assert (gpt.n_layer, gpt.n_head, gpt.n_embd, gpt.block_size, gpt.vocab_size) == (2, 2, 256, 64, 257)
    # later overrides apply in order, dotted or mapping
    cfg = load_config(TINY, ["model.n_embd=128", "model={n_head: 8}", "model.n_layer=1"])
    assert (cfg.model.n_embd, cfg.model.n_head, cfg.model.n_layer, cfg.model.block_size) == (128, 8, 1, 64)


def test_mapping_override_keeps_a_preset_from_the_file(tmp_path):
    path = write(tmp_path, "model:\n  preset: d12\n  vocab_size: 50304\ntrain:\n  sequence_length: 32\n")
    cfg = load_config(path, ["model={n_layer: 2}"])
    assert (cfg.model.preset, cfg.model.vocab_size, cfg.model.n_layer) == ("d12", 50304, 2)
    gpt = cfg.model.to_model_config()
    assert (gpt.n_layer, gpt.n_head, gpt.n_embd, gpt.vocab_size) == (2, 12, 768, 50304)
    assert load_config(path, ["model={}"]).model == load_config(path).model


def test_merge_is_recursive():
    into = {"a": {"b": 1, "c": {"d": 2, "e": 3}}, "f": 4}
    merge(into, {"a": {"c": {"d": 5}}, "f": {"g": 6}})
    assert into == {"a": {"b": 1, "c": {"d": 5, "e": 3}}, "f": {"g": 6}}


def test_mapping_override_problems_are_reported_with_the_key_path():
    msg, errors = errors_of(TINY, ["model={n_layers: 2}", "train={batch_size: two}", "model={n_head:2, n_layer:1}",
                                   "data={val: x", "trian={batch_size: 2}"])
    assert "model.n_layers: unknown key (did you mean 'model.n_layer'?)" in errors
    assert "train.batch_size: expected int, got 'two' (str)" in errors
    assert "model.n_head:2: unknown key; HINT: put a space after the colon: model={n_head: 2}" in errors
    assert "model.n_layer:1: unknown key; HINT: put a space after the colon: model={n_layer: 1}" in errors
    assert any(e.startswith("data: expected a YAML mapping like data={train: ...}, got '{val: x', which is not valid "
                            "YAML") for e in errors)
    assert "trian: unknown key (did you mean 'train'?)" in errors
    assert len(errors) == 6, msg


def test_text_keys_take_the_command_line_text_as_written(tmp_path):
    cfg = load_config(None, ["out_dir=0755", "resume=2024-01-01", "device=cpu:1", "model.preset=null",
                             "data.source=null", "data.val=1.10", "data.train=0x10", "train.learning_rate=1.10"])
    assert (cfg.out_dir, cfg.resume, cfg.device, cfg.data.val, cfg.data.train) == \
        ("0755", "2024-01-01", "cpu:1", "1.10", "0x10")
    assert cfg.model.preset is None
    assert cfg.train.learning_rate == 1.1  # other types keep their YAML parsing
    assert load_config(None, ["out_dir=1.10"]).out_dir == "1.10"
    assert load_config(None, ["out_dir=runs/ x "]).out_dir == "runs/ x "
    # a quoted text is unquoted, so a null spelling can still be meant as the word
    assert load_config(None, ["out_dir='null'"]).out_dir == "null"
    assert load_config(None, ['resume="0755"']).resume == "0755"
    assert load_config(None, ["data.val=~", "data.source=null", "data.train=d/*.bin"]).data.val is None
    # a mapping override keeps the text of its str keys too
    cfg = load_config(None, ["data={source: null, train: 0755, val: 1.10}", "out_dir=2024"])
    assert (cfg.data.source, cfg.data.train, cfg.data.val, cfg.out_dir) == (None, "0755", "1.10", "2024")
    # the text survives the resolved config's round trip
    saved = load_config(None, [f"out_dir={tmp_path}", "resume=0755"])
    assert load_config(saved.save_resolved()).resume == "0755"


def test_yaml_file_keeps_the_text_of_str_keys_and_refuses_other_values(tmp_path):
    path = write(tmp_path, "out_dir: 0755\nresume: 2024-01-01\ndevice: cpu\ndata:\n  val: 1.10\n"
                           "  train: x/train_*.bin\n  source: null\nmodel:\n  preset: 1_000\n"
                           "train:\n  learning_rate: 1.10\n  batch_size: 0x10\n")
    msg, errors = errors_of(path)
    assert (errors[0].startswith("model.preset: expected one of ") and errors[0].endswith("got '1_000'")
            and len(errors) == 1), msg
    cfg = load_config(path, ["model.preset=null"])
    assert (cfg.out_dir, cfg.resume, cfg.data.val) == ("0755", "2024-01-01", "1.10")
    assert (cfg.train.learning_rate, cfg.train.batch_size) == (1.1, 16)
    _, errors = errors_of(write(tmp_path, "out_dir: yes\ndata:\n  tokenizer: null\n"))
    assert errors == ["out_dir: expected str, got True (bool); HINT: quote the value to pass it as text, "
                      "e.g. out_dir: 'true'",
                      "data.tokenizer: expected str, got None (NoneType); HINT: this key cannot be null"]
    msg, _ = errors_of_dict({"out_dir": 1.1})  # a dict has no text to keep: refused, not guessed
    assert "out_dir: expected str, got 1.1 (float); HINT: quote the value to pass it as text" in msg


def errors_of_dict(raw):
    with pytest.raises(ConfigError) as info:
        RunConfig.from_dict(raw)
    return str(info.value), info.value.errors


def test_config_path_that_is_a_directory(tmp_path):
    with pytest.raises(ConfigError) as info:
        parse_args(["--config", os.path.join(REPO, "configs")])
    configs = os.path.join(REPO, "configs")
    assert str(info.value) == (f"config file {configs!r}: expected a YAML file, got a directory\n"
                               f"HINT: name a file in it, e.g. --config {os.path.join(configs, FIRST_SHIPPED)}")
    with pytest.raises(ConfigError, match=r"got a directory\nHINT: name a file in it, e.g. --config .*run.yaml"):
        load_config(str(tmp_path))


def test_config_path_that_does_not_exist_suggests_the_nearest_file(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    with pytest.raises(ConfigError) as info:
        parse_args(["--config", "configs/gpt2_tiny.yml"])
    first, hint = str(info.value).splitlines()
    assert first == "config file 'configs/gpt2_tiny.yml': expected a YAML file, got a path that does not exist " \
                    "(did you mean 'configs/gpt2_tiny.yaml'?)"
    assert hint.startswith(f"HINT: the shipped runs are in {os.path.join(REPO, 'configs')}: {FIRST_SHIPPED}, ")
    monkeypatch.chdir(tmp_path)  # a bare name is looked up in the shipped configs too
    with pytest.raises(ConfigError, match=r"\(did you mean '.*configs/gpt2_124m_ddp.yaml'\?\)"):
        load_config("gpt2_124m_dp.yaml")


def test_config_path_that_cannot_be_read(tmp_path, monkeypatch):
    path = write(tmp_path, "seed: 1\n")

    def refuse(name, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", name)

    monkeypatch.setattr(config_load, "open", refuse, raising=False)  # chmod does not stop root
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == (f"config file {path!r}: expected a readable YAML file, got Permission denied\n"
                               f"HINT: check that it is a file you may read (ls -l {path})")


def test_config_file_whose_top_level_is_not_a_mapping(tmp_path):
    path = write(tmp_path, "train.batch_size=2\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    first, hint = str(info.value).splitlines()
    assert first == f"config file {path!r}: expected a YAML mapping of keys at the top level, got " \
                    "'train.batch_size=2' (str)"
    assert hint.startswith("HINT: write one 'key: value' per line and sections as 'train:'")
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"seed: \xff\n")  # not UTF-8
    with pytest.raises(ConfigError, match=re.escape(f"config file {str(binary)!r} is not valid YAML: unacceptable "
                                                    f"character #x00ff: invalid start byte in \"{binary}\"")):
        load_config(str(binary))


def test_skip_nonfinite_key(capsys):
    assert load_config(TINY).train.skip_nonfinite == 0
    assert load_config(TINY, ["train.skip_nonfinite=3"]).train.skip_nonfinite == 3
    _, errors = errors_of(None, ["train.skip_nonfinite=-1"])
    assert errors == ["train.skip_nonfinite: expected an integer >= 0 (0: stop at the first non-finite step), got -1"]
    _, errors = errors_of(None, ["train.skip_nonfinite=1.5"])
    assert errors == ["train.skip_nonfinite: expected int, got 1.5 (float)"]
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    listing = {line.split()[0]: " ".join(line.split()[1:]) for line in capsys.readouterr().out.splitlines()
               if line.startswith("    ") and line.split()[0] in config_keys()}
    assert listing["train.skip_nonfinite"] == ("skip up to K consecutive optimizer steps whose loss or gradient "
                                               "norm is not finite (0: stop the run at the first one)")
    assert set(listing) == set(config_keys()) and all(listing.values())  # every key listed with its description


def test_the_numerics_section_keeps_its_earlier_name_precision_check(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text("precision_check:\n  level: 2\n")
    from_file = load_config(str(path))
    assert from_file.numerics.level == 2
    assert from_file.warnings == ["precision_check is now called numerics (e.g. numerics.level); the old name "
                                  "still works"]
    from_cli = load_config(None, ["precision_check.level=1"])
    assert from_cli.numerics.level == 1 and len(from_cli.warnings) == 1
    assert load_config(str(path), ["numerics.level=1"]).numerics.level == 1  # the new name wins
    saved = RunConfig().to_dict()
    saved["precision_check"] = saved.pop("numerics")
    saved["precision_check"]["level"] = 1
    assert RunConfig.from_dict(saved).numerics.level == 1  # a checkpoint's config written before the rename
    assert "precision_check" in saved  # from_dict leaves its argument as it was
    with pytest.raises(ConfigError, match=r"numerics\.level: expected 0 \(off\), 1 .* or 2 .*, got 3"):
        load_config(None, ["precision_check.level=3"])


def test_lora_target_modules_take_a_yaml_list_in_files_and_on_the_command_line(tmp_path):
    path = write(tmp_path, "lora:\n  rank: 4\n  target_modules: [c_attn, c_fc]\n")
    for cfg in (load_config(path), load_config(None, ["lora.rank=4", "lora.target_modules=[c_attn,c_fc]"]),
                load_config(None, ["lora.rank=4", "lora.target_modules=[c_attn, c_fc]"]),
                load_config(None, ["lora.rank=4", "lora.target_modules=c_attn,c_fc"])):
        assert cfg.lora.target_modules == "c_attn,c_fc" and cfg.lora.targets() == ["c_attn", "c_fc"]
    regex = load_config(None, ["lora.rank=4", r"lora.target_modules=.*\.attn\.c_(attn|proj)"]).lora
    assert regex.targets() == r".*\.attn\.c_(attn|proj)"
    assert load_config(None, ["lora.rank=4", "lora.target_modules=[ck]_attn"]).lora.targets() == "[ck]_attn"
    _, errors = errors_of(None, ["lora.rank=4", "lora.target_modules=[]"])
    assert errors == ["lora.target_modules: expected all-linear, module names or a regex, got ''"]
