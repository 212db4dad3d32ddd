"""Train GPT-2 with infini_train, single process or data-parallel under mpirun.

    python examples/gpt2/train.py --config configs/gpt2_tiny.yaml [dotted.key=value ...]
    mpirun -n 2 python examples/gpt2/train.py --config configs/gpt2_tiny_ddp.yaml

Gradient accumulation, AdamW with llm.c's cosine schedule, grad clipping, periodic validation, samples and
checkpoints; metrics.jsonl and a loss-curve PNG in out_dir. ``resume=auto`` continues bitwise-identically
from the newest good checkpoint. SIGTERM, SIGINT or SIGUSR1 to any rank stops every rank at the next step with
a checkpoint (exit status 75); the loop lives in ``infini_train.training``.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from infini_train.training import run_script  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_script())
