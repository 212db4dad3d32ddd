"""Fixtures of the data tests."""
import pytest


@pytest.fixture(scope="session")
def hf_dirs(tmp_path_factory):
    """{name: directory} of small Hugging Face tokenizers (tests/data/hf_dirs.py), built once per process."""
    pytest.importorskip("tokenizers")
    pytest.importorskip("transformers")
    from tests.data.hf_dirs import build_all

    return build_all(str(tmp_path_factory.mktemp("hf_tokenizers")))
