"""The op families: one file per family, forward and backward side by side, each with its public lowercase wrappers
(gathered as infini_train.<name> by infini_train/functional.py, and as infini_train.nn.functional.<name>). The
engine they run on (Function, the backward pass, grad mode, hooks, autocast, recomputation) is in the folder above."""
