"""Runnable tools: ``python -m infini_train.tools.<name>`` (compare_numerics: the first divergent entry of two
numerics-checker files)."""
