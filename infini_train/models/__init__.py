"""Models built on infini_train.nn. ``from_pretrained(path)`` loads any of them from a Hugging Face directory."""


def from_pretrained(path, device=None, dtype=None):
    """The model of an HF directory, by config.json's model_type (see models/pretrained.py)."""
    from .pretrained import from_pretrained as load

    return load(path, device=device, dtype=dtype)


__all__ = ["from_pretrained"]
