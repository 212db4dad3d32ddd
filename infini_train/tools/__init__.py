"""Runnable tools: ``python -m infini_train.tools.<name>`` (compare_precision: the first divergent entry of two
precision-checker files)."""
