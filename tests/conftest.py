"""Fixtures every test directory shares, and ``--op-device``: where the op-check suite (tests/op_check.py) runs."""
import pytest

from tests.training.tiny_run import make_data


def pytest_addoption(parser):
    parser.addoption("--op-device", default="cpu",
                     help="device of check_op's runs, both frameworks: cpu (default), cpu:N, or cuda:N (torch on "
                          "its CUDA device with TF32 off)")


def pytest_configure(config):
    import infini_train as it
    from tests import op_check

    spec = config.getoption("--op-device")
    try:
        device = it.device(spec)
    except ValueError as exc:
        raise pytest.UsageError(f"--op-device: {exc}") from None
    if device.is_cuda:
        import torch
        if not it.backend.cuda_available() or not torch.cuda.is_available():
            raise pytest.UsageError(f"--op-device {spec}: needs cupy, a CUDA build of torch and a GPU; cupy sees "
                                    f"one: {it.backend.cuda_available()}, torch: {torch.cuda.is_available()}")
        torch.backends.cudnn.allow_tf32 = False  # cupy's float32 convolutions and matmuls are plain float32
        torch.backends.cuda.matmul.allow_tf32 = False
    op_check.DEVICE = str(device)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """Token shards of a small stdlib corpus (tests/training/tiny_run.py: make_data) for the tiny runs of one test
    module."""
    return make_data(tmp_path_factory.mktemp("data"))
