"""Utilities: run configuration (utils.config), checkpoints (utils.checkpoint), metrics logging (utils.metrics)."""
