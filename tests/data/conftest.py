"""Fixtures of the data tests."""
import pytest

from tests.data.sft_tokenizers import HFStandIn, tiny_llama3_dir


@pytest.fixture(scope="session")
def hf_tokenizer(tmp_path_factory):
    """The tiny LLaMA-3-style transformers tokenizer (an oracle), trained once per test process."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(tiny_llama3_dir(tmp_path_factory))


@pytest.fixture
def llama_tok(hf_tokenizer):
    """The tiny tokenizer through the interface infini_train's SFT data codes against."""
    return HFStandIn(hf_tokenizer)
