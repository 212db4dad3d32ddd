"""The OpenBLAS kernel family to run the layout-equality tests under a second time: another than the one the first
pass ran (this environment's OPENBLAS_CORETYPE, else the CPU's native choice), so a tolerance that only holds for one
family's rounding fails here rather than on a user's CPU (OpenBLAS's Haswell and Zen kernels round differently from
its SkylakeX kernels).

    OPENBLAS_CORETYPE=$(python -m tests.blas_coretype) pytest tests/distributed tests/training

Prints Haswell where the first pass runs another family (SkylakeX, Cooperlake, Sapphire Rapids ...), SkylakeX where it
runs Haswell / Zen kernels on a CPU with AVX-512, else Sandybridge (AVX, no FMA); on other architectures it prints the
first pass's name (the second pass then repeats the first)."""
import platform

HASWELL_FAMILY = ("haswell", "zen")


def running_coretype():
    """The kernel family NumPy's OpenBLAS runs in this environment (threadpoolctl reads it), e.g. "SkylakeX"."""
    import numpy  # noqa: F401  (loads OpenBLAS)
    from threadpoolctl import threadpool_info

    for library in threadpool_info():
        if library.get("internal_api") == "openblas":
            return library.get("architecture") or ""
    return ""


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return []


def other_coretype(running, machine, flags):
    """The kernel family to compare against ``running`` on ``machine`` (platform.machine()) with CPU ``flags``."""
    if machine not in ("x86_64", "AMD64"):
        return running
    if running.lower() not in HASWELL_FAMILY:
        return "Haswell"
    return "SkylakeX" if "avx512f" in flags else "Sandybridge"


if __name__ == "__main__":
    print(other_coretype(running_coretype(), platform.machine(), cpu_flags()))
