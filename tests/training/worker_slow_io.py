"""Run under ``mpiexec -n 2`` with INFINI_TRAIN_COLLECTIVE_TIMEOUT=1: rank 0's checkpoint writes and samples are
made to take 3 s each. The other rank must wait for them without tripping the collective timeout."""
import sys
import time

from infini_train.training import loop
from infini_train.training import checkpoints as checkpoint


def slow(fn):
    def wrapper(*args, **kwargs):
        time.sleep(3)
        return fn(*args, **kwargs)
    return wrapper


checkpoint.save_checkpoint = slow(checkpoint.save_checkpoint)
loop.sample_text = slow(loop.sample_text)

if __name__ == "__main__":
    from infini_train.training import main

    sys.exit(main(sys.argv[1:]))
