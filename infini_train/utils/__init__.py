"""Utilities: run configuration, checkpoints, metrics logging."""
