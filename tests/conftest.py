"""Fixtures every test directory shares."""
import pytest

from tests.training.tiny_run import make_data


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """Token shards of a small stdlib corpus (tests/training/tiny_run.py: make_data) for the tiny runs of one test
    module."""
    return make_data(tmp_path_factory.mktemp("data"))
