"""Stands in for train.py under launch/run.sh: no MPI, no model; behaviour chosen by the arguments.

    fake_train.py STATE_DIR fail N STATUS [args...]   the first N launches exit STATUS, later ones 0
    fake_train.py STATE_DIR wait [STATUS] [args...]   wait for SIGTERM/SIGINT/SIGUSR1, then exit STATUS (75)

Every rank appends "launch <argv>" to STATE_DIR/rank<R>.log; a received signal is logged as "got SIG...".
"""
import os
import signal
import sys
import time

state_dir, mode = sys.argv[1], sys.argv[2]
rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
log_path = os.path.join(state_dir, f"rank{rank}.log")


def log(line):
    with open(log_path, "a") as f:
        f.write(line + "\n")


log("launch " + " ".join(sys.argv[1:]))
if mode == "fail":
    launches, status = int(sys.argv[3]), int(sys.argv[4])
    marker = os.path.join(state_dir, f"launches{rank}")
    count = 1  # the marker file counts this rank's launches
    if os.path.exists(marker):
        with open(marker) as f:
            count += int(f.read())
    with open(marker, "w") as f:
        f.write(str(count))
    sys.exit(status if count <= launches else 0)

if mode == "wait":
    on_signal = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3].isdigit() else 75

    def stop(signum, frame):
        log(f"got {signal.Signals(signum).name}")
        sys.exit(on_signal)  # 75 as train.py: checkpoint written, stopped by a signal

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, stop)
    log("ready")
    time.sleep(60)
    log("not stopped")
    sys.exit(1)
sys.exit(f"fake_train.py: unknown mode {mode!r}")
