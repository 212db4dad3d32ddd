"""infini_train.progress: a set-up progress bar drawn on rank 0's terminal only, after a delay."""
import io

import pytest

from infini_train.data.corpus import tokenize_documents
from infini_train.data.tokenizer import ByteTokenizer
from infini_train.progress import RANK_VARIABLES, launcher_rank, progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def rank0(monkeypatch):
    for name in RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_off_when_the_output_is_not_a_terminal(rank0):
    out = io.StringIO()
    bar = progress(range(5), file=out, delay=0)
    assert bar.disable and list(bar) == [0, 1, 2, 3, 4] and out.getvalue() == ""


def test_drawn_on_rank_0s_terminal_and_gone_when_done(rank0):
    out = Terminal()
    with progress(total=3, desc="consolidating", unit="tensor", file=out, delay=0) as bar:
        assert not bar.disable
        bar.update(3)
    assert out.getvalue().startswith("\rconsolidating:   0%|") and "0/3 " in out.getvalue()
    assert out.getvalue().endswith("\r")  # leave=False: the line is cleared


def test_not_drawn_before_the_delay(rank0):
    out = Terminal()
    assert list(progress(range(3), file=out)) == [0, 1, 2] and out.getvalue() == ""  # quick work: no bar


def test_off_on_other_ranks(rank0):
    rank0.setenv("PMI_RANK", "1")
    out = Terminal()
    assert launcher_rank() == 1 and progress(range(2), file=out, delay=0).disable and out.getvalue() == ""


def test_building_a_corpus_under_captured_output_prints_no_bar(capfd):
    tokens = tokenize_documents(["abc", "de"] * 50, ByteTokenizer())
    assert len(tokens) == 2 * 50 + 5 * 50
    assert capfd.readouterr().err == ""
