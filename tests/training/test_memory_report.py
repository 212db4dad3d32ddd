"""The run's closing memory report: each rank's peak resident memory per phase, and on GPUs each phase's peak GPU
memory in use beside it; phases that did not run are left out."""
from infini_train.training.memory import PhasePeaks


def _gathered(device_mb=None):
    out = {"peak_rss_mb": {"build": [410.0, 395.0], "load": [0.0, 0.0], "first_step": [800.2, 790.0],
                           "steady": [800.0, 791.0], "save": [2251.0, 2100.0]}, "per_phase": True}
    if device_mb is not None:
        out["device_mb"] = device_mb
    return out


def test_on_the_host_only_resident_memory_is_reported():
    text = PhasePeaks().describe(_gathered())
    assert text == ("peak resident memory of each phase:\n"
                    "  rank 0: build 410, first step 800, steady 800, save 2251 MB\n"
                    "  rank 1: build 395, first step 790, steady 791, save 2100 MB")


def test_on_gpus_the_peak_gpu_memory_of_each_phase_follows():
    gpu = {"build": [479.0, 479.0], "load": [0.0, 0.0], "first_step": [12192.0, 12190.0],
           "steady": [13142.0, 13140.0], "save": [2849.0, 2849.0]}
    text = PhasePeaks().describe(_gathered(gpu))
    assert text.endswith("peak GPU memory (in use) of each phase:\n"
                         "  rank 0: build 479, first step 12192, steady 13142, save 2849 MB\n"
                         "  rank 1: build 479, first step 12190, steady 13140, save 2849 MB")
