"""Run under ``mpiexec -n 2`` with INFINI_TRAIN_COLLECTIVE_TIMEOUT=1: rank 0's checkpoint writes (its state.json, which
rank 0 alone writes in either format) and samples are made to take 3 s each. The other rank must wait for them
without tripping the collective timeout."""
import sys
import time

from infini_train.training import loop
from infini_train.run_state import writer


def slow(fn):
    def wrapper(*args, **kwargs):
        time.sleep(3)
        return fn(*args, **kwargs)
    return wrapper


writer.write_state_file = slow(writer.write_state_file)
loop.sample_text = slow(loop.sample_text)

if __name__ == "__main__":
    from infini_train.training import main

    sys.exit(main(sys.argv[1:]))
