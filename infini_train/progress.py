"""A progress bar for set-up work a person waits on (building the corpus, tokenizing a JSONL, loading pretrained
weights, consolidating a checkpoint): tqdm on stderr, shown only

- on the job's rank 0 (or a process no launcher started): the other ranks do the same work silently;
- when stderr is a terminal (tqdm's ``disable=None``): logs, pipes and tests' captured output get no bar;
- once the work has taken ``delay`` seconds (1 by default): quick work never draws one.

    for doc in progress(documents, desc="tokenizing", unit="doc"):
        ...
    with progress(total=len(entries), desc="consolidating", unit="tensor") as bar:
        bar.update(1)

It changes nothing else: the iterable's items pass through, and a disabled bar costs one attribute test per item.
"""
from __future__ import annotations

import os

# a rank's number in its environment: MPICH / MVAPICH (PMI), Open MPI, PMIx (srun --mpi=pmix), Slurm's srun
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID")


def launcher_rank():
    """This process's rank as its launcher announced it (0 when no launcher started it)."""
    for name in RANK_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def progress(iterable=None, *, total=None, desc=None, unit="it", delay=1.0, **kwargs):
    """A ``tqdm`` over ``iterable`` (or a manual bar of ``total`` steps) that only rank 0 draws, only on a terminal,
    after ``delay`` seconds; further ``kwargs`` go to tqdm."""
    from tqdm import tqdm

    disable = None if launcher_rank() == 0 else True  # None: tqdm draws only when stderr is a TTY
    return tqdm(iterable, total=total, desc=desc, unit=unit, delay=delay, disable=disable, leave=False,
                dynamic_ncols=True, **kwargs)


__all__ = ["progress", "launcher_rank"]
