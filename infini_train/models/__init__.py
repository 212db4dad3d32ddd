"""Models built on infini_train.nn."""
