"""Run configuration: typed dataclasses read from YAML plus dotted command-line overrides, validated before
any work starts. Training keys follow the flags of llm.c's train_gpt2 (batch_size = -b, sequence_length = -t,
total_batch_size = -d, learning_rate = -l, warmup_iters = -u, learning_rate_decay_frac = -q, ...).

    cfg = load_config("configs/gpt2_tiny.yaml", ["train.learning_rate=3e-4", "out_dir=runs/x"])
    cfg = parse_args(sys.argv[1:])           # train.py [--config FILE] [dotted.key=value ...]
    grad_accum = cfg.train.grad_accum_steps(world_size)   # raises ConfigError when it does not divide
    model_config = cfg.model.to_model_config()  # the arch's model config (GPT2Config, LlamaConfig, ...)
    cfg.save_resolved()                      # out_dir/config.yaml, loadable with load_config
    print(cfg.pretty())
    cfg.differences()                        # [(dotted key, value, default)] of the settings not at their default

Every problem (unknown key, wrong type, out-of-range value, inconsistent values) is reported at once in
one ConfigError, one line each, naming the dotted key, what was expected and what was found, with the
nearest valid key for a misspelt one. In every periodic setting (``*_every``) 0 disables the action.

Command-line values are YAML, except that a text setting (out_dir, data.train, ...) takes the text as written
(``out_dir=0755`` is '0755'; null spellings are null, and ``out_dir="'null'"`` is the word); in YAML files such a
setting keeps its text when YAML would read it as a number or date. A mapping merges into its section key by key,
as in Hydra: ``'model={n_layer: 2, n_head: 2}'`` keeps the config file's other model keys.

The package: the sections (.sections; the model's in .model, its keys declared by the registered archs' sections:
infini_train.models.model_section) and the whole run's RunConfig with its validation (.schema), the range and
consistency checks (.checks, with .checker; the model's, through its arch's section and spec, in .model_checks),
strict YAML and the command-line overrides (.yaml_io), the entry points load_config and parse_args (.load), and what
a resume changes of its checkpoint's config (.resume_changes). Nothing here names a model architecture.
"""
from ...data.tokenizer import TOKENIZER_VOCAB, TOKENIZERS
from .checks import BACKENDS, DTYPES, PRECISIONS, SOURCES, check_ranges
from .load import DEFAULT_CONFIG, REPO_ROOT, default_config_path, load_config, parse_args
from .model import ModelConfig, model_config_class
from .schema import RENAMED_SECTIONS, SECTIONS, RunConfig, config_keys
from .sections import ConfigError, DataConfig, LoraConfig, NumericsConfig, ParallelConfig, ProfileConfig, TrainConfig
from .yaml_io import apply_overrides, load_yaml, parse_value

__all__ = ["ConfigError", "RunConfig", "ModelConfig", "DataConfig", "TrainConfig", "ParallelConfig", "LoraConfig",
           "ProfileConfig", "NumericsConfig", "SECTIONS", "RENAMED_SECTIONS", "config_keys", "load_config",
           "parse_args", "default_config_path", "REPO_ROOT", "DEFAULT_CONFIG", "parse_value", "load_yaml",
           "apply_overrides", "check_ranges", "BACKENDS", "DTYPES", "PRECISIONS", "SOURCES", "TOKENIZERS",
           "TOKENIZER_VOCAB", "model_config_class"]
