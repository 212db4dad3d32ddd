"""Fixtures of the data tests."""
import pytest

from tests.data.sft_tokenizers import HFStandIn, tiny_llama3_dir


@pytest.fixture(scope="session")
def hf_dirs(tmp_path_factory):
    """{name: directory} of small Hugging Face tokenizers (tests/data/hf_dirs.py), built once per process."""
    pytest.importorskip("tokenizers")
    pytest.importorskip("transformers")
    from tests.data.hf_dirs import build_all

    return build_all(str(tmp_path_factory.mktemp("hf_tokenizers")))


@pytest.fixture(scope="session")
def tiny_llama3(tmp_path_factory):
    """The directory of a tiny LLaMA-3-style tokenizer whose template marks the assistant turns
    (tests/data/sft_tokenizers.py), trained once per process."""
    pytest.importorskip("tokenizers")
    pytest.importorskip("transformers")
    return tiny_llama3_dir(tmp_path_factory)


@pytest.fixture(scope="session")
def hf_tokenizer(tiny_llama3):
    """That tokenizer as transformers loads it: the oracle."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(tiny_llama3)


@pytest.fixture(params=["HFTokenizer", "stand-in"])
def llama_tok(request, tiny_llama3, hf_tokenizer):
    """That tokenizer as SFT data sees it: the project's hf:PATH tokenizer, and a stand-in over transformers with only
    the interface SFT data relies on (apply_chat_template, encode, eos/pad ids, eot_token, vocab_size)."""
    if request.param == "HFTokenizer":
        from infini_train.data.tokenizer import get_tokenizer

        return get_tokenizer("hf:" + tiny_llama3)
    return HFStandIn(hf_tokenizer)
