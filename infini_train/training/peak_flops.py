"""The peak FLOP/s that MFU divides by: a stable figure of the device a rank runs on, never a timing.

- a GPU: its dense datasheet peak for the run's arithmetic (float16/bfloat16 tensor cores under fp16-/bf16-mixed,
  float32, or TF32 where cupy runs float32 matmuls on tensor cores with CUPY_TF32=1);
- CPU ranks: the host's vector peak, cores x clock x float32 FLOPs per cycle from the instruction set (two FMA
  units of 16 lanes with AVX-512, of 8 with AVX2 + FMA), halved for float64;
- or ``train.peak_flops`` (FLOP/s of one device: a GPU, or the cores of one host), which wins.

``DevicePeak`` says which: every rank makes one for its device, and ``job_peak`` adds them up once per physical
device (ranks sharing a host's cores or a GPU count it once). Where no figure is known (a GPU missing from the
table, a CPU whose clock the system does not give) the run reports no MFU and says so, rather than guess.
"""
from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass

# dense TFLOP/s from NVIDIA's datasheets (sparsity figures halved); the first name contained in the device's wins
GPU_PEAK_TFLOPS = (
    ("H200", {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4}),
    ("H100 PCIe", {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0}),
    ("H100 NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.0, "fp16": 835.0}),
    ("H100", {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4}),  # SXM (HBM3)
    ("A100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}),
    ("L40S", {"fp32": 91.6, "tf32": 183.0, "bf16": 362.1, "fp16": 362.1}),
    ("L4", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0}),
    ("A10", {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0}),
    ("V100", {"fp32": 15.7, "tf32": 15.7, "bf16": 15.7, "fp16": 125.0}),  # no bfloat16 tensor cores
)
CPU_MAX_FREQ = "/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"  # kHz
ARITHMETIC = {"fp32": "fp32", "bf16-mixed": "bf16", "fp16-mixed": "fp16"}
PEAK_HINT = "set train.peak_flops to the peak FLOP/s of one device (a GPU, or one host's cores)"


@dataclass(frozen=True)
class DevicePeak:
    """One rank's device: ``key`` names the physical device (ranks with the same key share it), ``flops`` its
    peak in FLOP/s (0: unknown), ``source`` where the figure comes from (or why it is unknown)."""

    key: tuple
    flops: float
    source: str
    cores: frozenset = frozenset()  # CPU ranks: the cores this rank may run on (a host counts their union)
    flops_per_core: float = 0.0


def gpu_peak(name, precision, tf32=None):
    """(FLOP/s, source) of the GPU called ``name`` for ``precision``, or None when the table lacks it."""
    arithmetic = ARITHMETIC[precision]
    if arithmetic == "fp32" and (os.environ.get("CUPY_TF32") == "1" if tf32 is None else tf32):
        arithmetic = "tf32"
    for model, peaks in GPU_PEAK_TFLOPS:
        if model in name:
            return peaks[arithmetic] * 1e12, f"{name} {arithmetic} dense (datasheet)"
    return None


def _cpuinfo():
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return ""


def cpu_clock_ghz(cpuinfo=None, max_freq_file=CPU_MAX_FREQ):
    """The cores' maximum (else nominal) clock in GHz, or None when the system does not say."""
    try:
        with open(max_freq_file) as f:
            return int(f.read()) / 1e6
    except (OSError, ValueError):
        pass
    cpuinfo = _cpuinfo() if cpuinfo is None else cpuinfo
    named = re.search(r"model name\s*:.*@\s*([0-9.]+)\s*GHz", cpuinfo)
    if named:
        return float(named.group(1))
    current = re.search(r"cpu MHz\s*:\s*([0-9.]+)", cpuinfo)
    return float(current.group(1)) / 1e3 if current else None


def float32_flops_per_cycle(cpuinfo=None):
    """(float32 FLOPs per cycle per core, instruction set) from the CPU flags: two FMA units of 16 lanes (AVX-512),
    8 lanes (AVX2 + FMA), 8 lanes without FMA (AVX), else 4-lane SSE."""
    cpuinfo = _cpuinfo() if cpuinfo is None else cpuinfo
    flags = set(re.search(r"flags\s*:(.*)", cpuinfo).group(1).split()) if "flags" in cpuinfo else set()
    if "avx512f" in flags:
        return 64, "avx512f"
    if {"avx2", "fma"} <= flags:
        return 32, "avx2+fma"
    if "avx" in flags:
        return 16, "avx"
    return 8, "sse"


def cpu_peak(dtype_itemsize=4, cpuinfo=None, max_freq_file=CPU_MAX_FREQ):
    """(FLOP/s per core, description) of this host's cores, or None when the clock is unknown."""
    clock = cpu_clock_ghz(cpuinfo, max_freq_file)
    if not clock:
        return None
    per_cycle, isa = float32_flops_per_cycle(cpuinfo)
    if dtype_itemsize == 8:
        per_cycle //= 2
    width = "float64" if dtype_itemsize == 8 else "float32"
    return clock * 1e9 * per_cycle, f"{clock:.2f} GHz x {per_cycle} {width} FLOP/cycle ({isa})"


def device_peak(device, precision, dtype_itemsize=4, peak_flops=0.0):
    """This rank's DevicePeak: of ``device`` (a backend Device) running ``precision``; ``peak_flops`` (> 0) is the
    configured peak of one device."""
    host = socket.gethostname()
    if device.type == "cuda":
        from .. import backend

        cupy = backend.cupy_module()
        props = cupy.cuda.runtime.getDeviceProperties(device.index or 0)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        key = ("cuda", host, props.get("pciBusID", device.index), props.get("pciDeviceID", 0))
        if peak_flops > 0:
            return DevicePeak(key, float(peak_flops), f"train.peak_flops per GPU ({name})")
        found = gpu_peak(name, precision)
        if found is None:
            return DevicePeak(key, 0.0, f"no peak known for the GPU {name!r}")
        return DevicePeak(key, *found)
    cores = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset(
        range(os.cpu_count() or 1))
    if peak_flops > 0:
        return DevicePeak(("cpu", host), float(peak_flops), "train.peak_flops per host")
    found = cpu_peak(dtype_itemsize)
    if found is None:
        return DevicePeak(("cpu", host), 0.0, f"the CPU clock of {host} is unknown")
    return DevicePeak(("cpu", host), found[0] * len(cores), found[1], cores, found[0])


def job_peak(peaks):
    """(total FLOP/s, description) of every rank's DevicePeak, each physical device counted once: a host's CPU
    ranks count the union of their cores, a GPU shared by ranks counts once. (None, why) when a device's peak is
    unknown."""
    unknown = [p.source for p in peaks if not p.flops]
    if unknown:
        return None, f"{unknown[0]}: {PEAK_HINT}"
    devices = {}
    for peak in peaks:
        if peak.key in devices and peak.flops_per_core:
            held = devices[peak.key]
            peak = DevicePeak(peak.key, len(held.cores | peak.cores) * peak.flops_per_core, peak.source,
                              held.cores | peak.cores, peak.flops_per_core)
        devices[peak.key] = peak
    total = sum(p.flops for p in devices.values())
    parts = {}
    for p in devices.values():
        what = f"{len(p.cores)} cores x {p.source}" if p.flops_per_core else p.source
        parts[what] = parts.get(what, 0) + 1
    kind = "GPU" if any(k[0] == "cuda" for k in devices) else "host"
    described = ", ".join(f"{n} {kind}{'s' if n > 1 else ''}: {what}" for what, n in parts.items())
    return total, f"{format_flops(total)} ({described})"


def run_peak(device, precision, dtype_itemsize=4, peak_flops=0.0, group=None):
    """job_peak of every rank of ``group`` (default: the world), each giving its own device's peak (a collective)."""
    from .. import distributed as dist

    mine = device_peak(device, precision, dtype_itemsize, peak_flops)
    peaks = [None] * dist.get_world_size(group)
    dist.all_gather_object(peaks, mine, group)
    return job_peak(peaks)


def format_flops(value):
    for unit, scale in (("PFLOP/s", 1e15), ("TFLOP/s", 1e12), ("GFLOP/s", 1e9)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.3g} FLOP/s"
