"""The MFU denominator: GPU datasheet peaks by name and precision, the CPU vector peak from /proc/cpuinfo text, and
the job's peak with each physical device counted once."""
import pytest

from infini_train.training.peak_flops import DevicePeak, cpu_peak, format_flops, gpu_peak, job_peak

AVX512 = "model name\t: AMD EPYC 9654 96-Core Processor\ncpu MHz\t\t: 2596.140\nflags\t\t: sse avx avx2 fma avx512f\n"
AVX2 = "model name\t: Intel(R) Xeon(R) CPU E5-2680 v4 @ 2.40GHz\ncpu MHz\t\t: 1200.000\nflags\t\t: sse avx avx2 fma\n"


@pytest.mark.parametrize("name,precision,tf32,expected", [
    ("NVIDIA H100 80GB HBM3", "bf16-mixed", False, 989.4e12),
    ("NVIDIA H100 80GB HBM3", "fp32", False, 67.0e12),
    ("NVIDIA H100 80GB HBM3", "fp32", True, 494.7e12),
    ("NVIDIA H100 PCIe", "fp16-mixed", False, 756.0e12),
    ("NVIDIA H200", "bf16-mixed", False, 989.4e12),
    ("NVIDIA A100-SXM4-80GB", "bf16-mixed", False, 312.0e12),  # not the A10's
    ("NVIDIA A10", "bf16-mixed", False, 125.0e12),
    ("NVIDIA L40S", "fp32", False, 91.6e12),  # not the L4's
    ("NVIDIA L4", "fp32", False, 30.3e12),
    ("Tesla V100-SXM2-32GB", "bf16-mixed", False, 15.7e12),  # no bfloat16 tensor cores
])
def test_gpu_peaks_follow_the_name_and_the_precision(name, precision, tf32, expected):
    flops, source = gpu_peak(name, precision, tf32=tf32)
    assert flops == pytest.approx(expected) and source.startswith(name) and "datasheet" in source


def test_an_unknown_gpu_has_no_peak():
    assert gpu_peak("NVIDIA GeForce GTX 480", "fp32", tf32=False) is None


def test_cpu_peak_is_clock_times_vector_width(tmp_path):
    no_cpufreq = str(tmp_path / "missing")
    per_core, source = cpu_peak(4, AVX512, no_cpufreq)  # the clock /proc/cpuinfo reports
    assert per_core == pytest.approx(2.59614e9 * 64) and source == "2.60 GHz x 64 float32 FLOP/cycle (avx512f)"
    per_core, source = cpu_peak(8, AVX2, no_cpufreq)  # the nominal clock from the model name, halved for float64
    assert per_core == pytest.approx(2.4e9 * 16) and source == "2.40 GHz x 16 float64 FLOP/cycle (avx2+fma)"
    max_freq = tmp_path / "cpuinfo_max_freq"
    max_freq.write_text("3700000\n")  # kHz: cpufreq's maximum wins
    assert cpu_peak(4, AVX2, str(max_freq))[0] == pytest.approx(3.7e9 * 32)
    assert cpu_peak(4, "flags\t: sse\n", no_cpufreq) is None  # no clock anywhere: no peak


def _cpu(host, cores, per_core=1e9):
    return DevicePeak(("cpu", host), len(cores) * per_core, "1.00 GHz x 1 float32 FLOP/cycle (sse)", frozenset(cores),
                      per_core)


def test_ranks_sharing_a_host_count_its_cores_once():
    total, text = job_peak([_cpu("a", {0, 1}), _cpu("a", {0, 1}), _cpu("a", {1, 2}), _cpu("b", {0, 1})])
    assert total == 5e9  # host a: cores {0, 1, 2}; host b: {0, 1}
    assert text.startswith("5.0 GFLOP/s (")


def test_ranks_sharing_a_gpu_count_it_once_and_gpus_add_up():
    gpu = [DevicePeak(("cuda", "a", bus, 0), 989.4e12, "NVIDIA H100 80GB HBM3 bf16 dense (datasheet)")
           for bus in (1, 1, 2, 3)]
    total, text = job_peak(gpu)
    assert total == pytest.approx(3 * 989.4e12)
    assert text == "3.0 PFLOP/s (3 GPUs: NVIDIA H100 80GB HBM3 bf16 dense (datasheet))"


def test_an_unknown_device_means_no_mfu_and_says_why():
    total, text = job_peak([_cpu("a", {0}), DevicePeak(("cuda", "a", 1, 0), 0.0, "no peak known for the GPU 'X'")])
    assert total is None and text.startswith("no peak known for the GPU 'X': set train.peak_flops")


def test_format_flops():
    assert [format_flops(v) for v in (3.5e15, 2.5e12, 3.3e11, 5e6)] == ["3.5 PFLOP/s", "2.5 TFLOP/s", "330.0 GFLOP/s",
                                                                       "5e+06 FLOP/s"]


class _FakeCupy:
    """cupy.cuda.runtime.getDeviceProperties as cupy answers it (bytes name, PCI ids)."""

    def __init__(self, name):
        runtime = type("runtime", (), {"getDeviceProperties": staticmethod(
            lambda index: {"name": name.encode(), "pciBusID": 20 + index, "pciDeviceID": 0})})
        self.cuda = type("cuda", (), {"runtime": runtime})


class _Device:
    def __init__(self, kind, index=0):
        self.type, self.index = kind, index


def test_a_gpu_rank_takes_its_gpus_datasheet_peak_not_a_host_timing(monkeypatch):
    from infini_train import backend
    from infini_train.training.peak_flops import device_peak

    monkeypatch.setattr(backend, "cupy_module", lambda: _FakeCupy("NVIDIA H100 80GB HBM3"))
    peak = device_peak(_Device("cuda", 1), "bf16-mixed")
    assert peak.flops == pytest.approx(989.4e12) and peak.key[0] == "cuda" and peak.key[2] == 21
    assert peak.source == "NVIDIA H100 80GB HBM3 bf16 dense (datasheet)"
    configured = device_peak(_Device("cuda", 1), "bf16-mixed", peak_flops=5e14)
    assert configured.flops == 5e14 and configured.source == "train.peak_flops per GPU (NVIDIA H100 80GB HBM3)"
    monkeypatch.setattr(backend, "cupy_module", lambda: _FakeCupy("Some Future GPU"))
    unknown = device_peak(_Device("cuda"), "fp32")
    assert unknown.flops == 0.0 and job_peak([unknown])[0] is None
