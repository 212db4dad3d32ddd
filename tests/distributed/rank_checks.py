"""The assertions of a worker script that every rank runs: ``check(cond, what)`` raises naming the rank, and
``check.count`` says how many held (the worker prints it, and the test reads it to know the checks ran)."""


class RankChecks:
    def __init__(self, rank):
        self.rank, self.count = rank, 0

    def __call__(self, cond, what):
        if not cond:
            raise AssertionError(f"rank {self.rank}: {what}")
        self.count += 1
