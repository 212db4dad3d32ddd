"""gpt-oss (model.arch=gpt_oss): attention sinks, alternating sliding-window / full attention, YaRN rope scaling and
a mixture of clamped-SwiGLU experts with biases (model.py, moe.py); its config and presets (config.py), HF config.json
both ways (io.py), its tensor plan (parallel.py) and its run-config keys (section.py). The names below are imported
when first used, so that reading a run config (which imports section.py) does not import the model."""
from importlib import import_module

_FROM = {"GptOssConfig": ".config", "GPT_OSS_PRESETS": ".config", "GptOss": ".model", "SPEC": ".model"}


def __getattr__(name):
    if name not in _FROM:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_FROM[name], __name__), name)


__all__ = ["GptOss", "GptOssConfig", "GPT_OSS_PRESETS", "SPEC"]
