"""Hang reports: when a collective or a transfer times out, every rank writes its Python stacks and what it is
waiting for to ``<hang dir>/rank<R>.txt``, and the error names the ranks that never arrived.

    dist.set_hang_dir("out/hang")   # a training run does this at its start (out_dir/hang), on every rank

How it works, for ranks on one host or on several that share the hang directory (a run's out_dir):

- Every collective started on a group gets a sequence number on that group (``group.sequence``, process_group.py).
  The members of a group call its collectives in the same order, so collective N of a group is the same call on
  every member, and a rank's count on a group says how far it got: it entered collective ``group.sequence``.
- ``set_hang_dir(path)`` starts a watchdog thread on the rank. It lists the directory every 0.2 s (nothing else: it
  costs one directory listing while nothing hangs) and answers every new ``request.*`` file there by writing the
  rank's report: the stacks of all its threads (``faulthandler``), the collective it is waiting in if any, and its
  count of collectives entered on each group. The shared filesystem is the side channel: it does not depend on the
  stuck communicator, and a rank that is merely slow or asleep answers as well, since only its watchdog is involved.
- A rank whose wait times out (work.py) writes a request, then its own report, and waits up to
  $INFINI_TRAIN_HANG_GRACE seconds (default 5) for every rank's answer. The members of its group whose count on the
  group is below the pending collective's sequence number never arrived (for a send or receive: the peer). The error
  names them and where their stacks are, and the ranks that did not answer within the grace period (stuck outside
  Python with the GIL held, or gone: no stack). The error then ends the job as any uncaught error does (the MPI abort
  of launch_utils.py): within the timeout plus the grace period plus about a second.

The reports are text for people, with one machine-readable line, ``state: {...}`` (JSON: rank, host, pid, the
requests answered, ``entered`` {group key: count}, ``waiting``). Group keys are the group's world ranks and its
ordinal among the groups of those ranks (``"0,1,2,3#0"``), the same on every member. Requests that exist when the
watchdog starts (a previous job's, in the same out_dir) are not answered.

Without a hang directory (library use), nothing is written: the error gives the pending collective's sequence
number and bytes only. On NFS, a client's attribute cache can make a request visible on other hosts only after the
grace period; those ranks are then reported as not answering (their reports still arrive, later).
"""
from __future__ import annotations

import datetime
import faulthandler
import json
import os
import socket
import threading
import time
import weakref

from . import waits

GRACE_ENV = "INFINI_TRAIN_HANG_GRACE"
DEFAULT_GRACE = 5.0
POLL_SECONDS = 0.2  # the watchdog's directory listing interval
REQUEST_PREFIX = "request."
_STACKS = "Python stacks (faulthandler: every thread, most recent call first):"

_groups = weakref.WeakSet()  # every live ProcessGroup of this process, for the reports' counts
_ordinals = {}  # world ranks -> groups of those ranks made so far (a group's key)
_lock = threading.RLock()  # one report written at a time (watchdog and main thread)
_session = None  # the _Watch while a hang directory is set


def register(group):
    """A new ProcessGroup's key, e.g. "0,1#0" (its world ranks, then how many groups of those ranks came before it:
    members make their groups in the same order, so the key is the same on every member)."""
    ranks = tuple(group.ranks)
    ordinal = _ordinals.get(ranks, 0)
    _ordinals[ranks] = ordinal + 1
    _groups.add(group)
    return f"{','.join(map(str, ranks))}#{ordinal}"


def resolve_grace():
    """Seconds a timed-out rank waits for the other ranks' reports: $INFINI_TRAIN_HANG_GRACE, else 5."""
    value = os.environ.get(GRACE_ENV)
    if value is None:
        return DEFAULT_GRACE
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not 0 <= seconds < float("inf"):
        raise ValueError(f"{GRACE_ENV}: expected a number of seconds >= 0 (how long a timed-out rank waits for the "
                         f"other ranks' stacks), got {value!r}\nHINT: export {GRACE_ENV}=5")
    return seconds


def set_hang_dir(path, rank=None, world_size=None):
    """Write hang reports to ``path`` (created on the first report) and start this rank's watchdog; None stops it.
    Every rank of the job calls it (a training run does, with out_dir/hang). ``rank`` and ``world_size`` default to
    the world's."""
    global _session
    stop()
    if path is None:
        return None
    if rank is None or world_size is None:
        from . import default_group

        world = default_group()
        rank, world_size = world.rank if rank is None else rank, world.size if world_size is None else world_size
    _session = _Watch(os.path.abspath(os.fspath(path)), int(rank), int(world_size), resolve_grace())
    _session.start()
    return _session.directory


def get_hang_dir():
    """The directory hang reports go to, or None."""
    return _session.directory if _session is not None else None


def stop():
    """Stop the watchdog (destroy_process_group does); later timeouts write nothing."""
    global _session
    session, _session = _session, None
    if session is not None:
        session.halt()


def report_timeout(work, limit):
    """The text a timeout error appends after "did not complete within N s": the pending collective's sequence
    number and bytes, and with a hang directory the ranks that never arrived, after every rank wrote its report.
    Never raises (a failing report is described in the text instead)."""
    launch = getattr(work, "launch", None)
    details = f" ({launch.describe()})" if launch is not None else ""
    session = _session
    if session is None:
        return details
    try:
        return details + session.timed_out(work, launch)
    except Exception as exc:  # the timeout is the error that matters
        return details + f"; writing the hang report to {session.directory} failed: {exc!r}"


def read_state(path):
    """The ``state:`` JSON of a rank's report at ``path``, or None (no such file, or not a report)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("state: "):
                    return json.loads(line[len("state: "):])
    except (OSError, ValueError):
        return None
    return None


def _pending(launch):
    """A Launch as the reports write it."""
    if launch is None:
        return None
    return {"collective": launch.name, "group": list(getattr(launch.group, "ranks", [])),
            "key": getattr(launch.group, "key", None), "sequence": launch.sequence, "bytes": launch.nbytes,
            "peer": launch.peer}


class _Watch:
    """One rank's hang directory: its watchdog thread, the requests it answered, and its reports."""

    def __init__(self, directory, rank, world_size, grace):
        self.directory, self.rank, self.world_size, self.grace = directory, rank, world_size, grace
        self.path = os.path.join(directory, f"rank{rank}.txt")
        self.answered = []  # the requests this rank's reports answer
        self.seen = set(self._requests())  # requests already there (an earlier job's): never answered
        self.requests = 0
        self.timed_out_wait = None  # (Work, start) of this rank's wait that timed out: later reports still show it
        self.frozen_stacks = None  # and the stacks at that moment (later, the rank is on its way out)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="infini_train hang watchdog", daemon=True)

    def start(self):
        self._thread.start()

    def halt(self):
        self._stop.set()

    def _requests(self):
        try:
            return [name for name in os.listdir(self.directory) if name.startswith(REQUEST_PREFIX)]
        except OSError:
            return []

    def _watch(self):
        while not self._stop.wait(POLL_SECONDS):
            new = [name for name in self._requests() if name not in self.seen]
            if not new:
                continue
            try:
                with _lock:
                    self.seen.update(new)
                    self.answered.extend(new)
                    self.write()
            except Exception:  # a report that cannot be written must not end the rank; the timeout will
                pass

    def timed_out(self, work, launch):
        """Request every rank's report, write this one's, wait for theirs; the error's text naming who never
        arrived."""
        os.makedirs(self.directory, exist_ok=True)
        self.requests += 1
        name = f"{REQUEST_PREFIX}rank{self.rank}.{os.getpid()}.{time.time_ns()}.{self.requests}"
        describe = getattr(work, "describe", str(work))
        with _lock:
            self.seen.add(name)  # (before the file exists: the watchdog must not answer it too)
            self.answered.append(name)
            with open(os.path.join(self.directory, name), "w") as f:
                json.dump({"rank": self.rank, "waiting": describe, "pending": _pending(launch)}, f)
            self.timed_out_wait = waits.waiting
            self.write()
            with open(self.path) as f:
                self.frozen_stacks = f.read().split(_STACKS + "\n", 1)[-1]
        states = {self.rank: read_state(self.path)}
        silent = set(range(self.world_size)) - {self.rank}
        deadline = time.monotonic() + self.grace
        while True:
            for r in sorted(silent):
                state = read_state(self._rank_path(r))
                if state is not None and name in state.get("answered", ()):
                    states[r] = state
                    silent.discard(r)
            if not silent or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        return self._verdict(launch, states, silent)

    def _verdict(self, launch, states, silent):
        group = launch.group if launch is not None else None
        members = list(getattr(group, "ranks", range(self.world_size)))
        if launch is not None and launch.sequence is not None:
            key = getattr(group, "key", None)
            missing = [r for r in members if r in states and r != self.rank
                       and states[r].get("entered", {}).get(key, 0) < launch.sequence]
        elif launch is not None and launch.peer is not None:
            missing = [launch.peer]
        else:
            missing = []
        text = ""
        if missing:
            stacks = ", ".join(self._rank_path(r) for r in missing if r in states) or "none written"
            text += f"; ranks never arrived: {missing} (their stacks: {stacks})"
        unanswered = sorted(silent)
        if unanswered:
            text += (f"; ranks that did not answer within {self.grace:g} s (no stack: stuck outside Python, or gone): "
                     f"{unanswered}")
        if (not missing and not any(r in members for r in unanswered) and launch is not None
                and launch.sequence is not None):
            text += "; every rank of the group entered it (collectives called in a different order on some rank?)"
        return text + f"; every rank's stacks and pending collective: {self.directory}{os.sep}rank<R>.txt"

    def _rank_path(self, rank):
        return os.path.join(self.directory, f"rank{rank}.txt")

    def write(self):
        """This rank's report (atomically: a reader never sees half of one), for the requests it answered."""
        os.makedirs(self.directory, exist_ok=True)
        waiting = waits.waiting or self.timed_out_wait
        pending = None
        if waiting is not None:
            work, since = waiting
            pending = _pending(work.launch) or {}
            pending.update(waiting_s=round(time.monotonic() - since, 3), describe=work.describe)
        groups = sorted(list(_groups), key=lambda g: g.key)
        state = {"rank": self.rank, "world_size": self.world_size, "host": socket.gethostname(), "pid": os.getpid(),
                 "answered": list(self.answered), "waiting": pending,
                 "entered": {g.key: g.sequence for g in groups}}
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        asked = sorted({_requester(name) for name in self.answered})
        asked = ", ".join(f"rank {r}{' (this rank)' if r == self.rank else ''}" for r in asked)
        lines = [f"hang report of rank {self.rank} (world of {self.world_size}; host {state['host']}, pid "
                 f"{state['pid']}), {now}, for the timed-out waits of {asked}"]
        if pending is None:
            lines.append("pending collective: none (this rank is not waiting in a collective or transfer)")
        else:
            what = (f"sequence {pending['sequence']} on that group, " if pending.get("sequence") is not None else "")
            size = waits.human_bytes(pending.get("bytes") or 0)
            lines.append(f"pending collective: {pending['describe']}: {what}{size}, waiting for "
                         f"{pending['waiting_s']:g} s")
        lines.append("collectives entered, by group (the last collective and the last transfer):")
        for g in groups:
            last = g.last_collective
            transfer = g.last_transfer
            lines.append(f"  group ranks {g.ranks} ({g.backend}, key {g.key}): {g.sequence} entered"
                         + (f", the last {last.name} of {waits.human_bytes(last.nbytes)}" if last else "")
                         + (f"; last transfer: {transfer.name} of {waits.human_bytes(transfer.nbytes)}"
                            if transfer else ""))
        lines.append("state: " + json.dumps(state))
        lines.append("")
        lines.append(_STACKS if self.frozen_stacks is None else _STACKS[:-1] + ", when this rank's wait timed out):")
        tmp = f"{self.path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            f.write("\n".join(lines) + "\n")
            if self.frozen_stacks is not None:
                f.write(self.frozen_stacks)
            else:
                f.flush()
                faulthandler.dump_traceback(file=f, all_threads=True)
        os.replace(tmp, self.path)


def _requester(name):
    """The rank that wrote a request, from its file's name ("request.rank3.<pid>.<ns>.<n>"), or -1."""
    part = name[len(REQUEST_PREFIX):].split(".")[0]
    return int(part[4:]) if part.startswith("rank") and part[4:].isdigit() else -1


__all__ = ["set_hang_dir", "get_hang_dir", "stop", "report_timeout", "read_state", "register", "GRACE_ENV"]
