"""The processes of this machine as the tests see them in /proc: to find a rank of a running job and signal it."""
import os


def processes(environ=False):
    """(pid, argv, environment) of each process that can be read: argv a list of bytes, the environment a set of
    b"NAME=value" (empty unless ``environ``). Processes that end while being read are left out."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            variables = set()
            if environ:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    variables = set(f.read().split(b"\0"))
        except OSError:
            continue
        yield int(entry), argv, variables


def parent_pids():
    """{pid: parent pid} of every process."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    return parents
