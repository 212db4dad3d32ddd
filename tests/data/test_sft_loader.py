import json

import numpy as np
import pytest

from infini_train.data.sft import labels_of
from infini_train.data.sft_loader import SFTBatch, SFTDataLoader, pack_rows
from infini_train.data.sft_records import SFTDataError
from infini_train.data.tokenizer import ByteTokenizer

EOS = PAD = 256  # the byte tokenizer's end of text, also its padding id (it has no pad token)


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def texts(tmp_path, items, name="texts.jsonl"):
    return write_jsonl(tmp_path / name, [{"text": t} for t in items])


def b(text):
    return list(text.encode())


def test_packing_layout_on_a_hand_checked_example(tmp_path):
    # samples (text + EOS): 3, 4, 2, 8 and 11 tokens; T = 8: the last is cut to 8
    path = texts(tmp_path, ["ab", "cde", "f", "ghijklm", "nopqrstuvw"])
    loader = SFTDataLoader(path, ByteTokenizer(), 4, 8, format="text", packing=True, shuffle=False)
    batch = loader.next_batch()
    assert isinstance(batch, SFTBatch) and all(a.dtype == np.int64 and a.shape == (4, 8) for a in batch)
    # row 0: "ab" and "cde" (7 tokens; "f" does not fit); row 1: "f"; rows 2 and 3: one full sample each
    np.testing.assert_array_equal(batch.inputs, [
        b("ab") + [EOS] + b("cde") + [EOS, PAD],
        b("f") + [EOS] + [PAD] * 6,
        b("ghijklm") + [EOS],
        b("nopqrstu")])
    np.testing.assert_array_equal(batch.targets, [
        b("b") + [EOS, -1] + b("de") + [EOS, -1, -1],
        [EOS, -1] + [-1] * 6,
        b("hijklm") + [EOS, -1],
        b("opqrstu") + [-1]])
    np.testing.assert_array_equal(batch.positions, [[0, 1, 2, 0, 1, 2, 3, 0], [0, 1, 0, 0, 0, 0, 0, 0],
                                                    list(range(8)), list(range(8))])
    np.testing.assert_array_equal(batch.segments, [[1, 1, 1, 2, 2, 2, 2, 0], [1, 1, 0, 0, 0, 0, 0, 0],
                                                   [1] * 8, [1] * 8])
    stats = loader.stats()
    # the batch took the whole epoch: the loader is at the start of the next (unshuffled: the same 4 rows)
    assert stats == {"samples": 5, "used": 5, "truncated": 1, "skipped": 0, "tokens": 25, "trained": 20, "epoch": 1,
                     "rows": 4, "fill": 25 / 32}  # trained: the targets of the batch above that are not -1
    assert "5 samples, 1 truncated to T=8, 0 skipped (no trained token); 25 tokens in 4 packed rows per epoch, 78.1% " \
           "not padding" in loader.summary()


def test_padding_layout_one_sample_per_row(tmp_path):
    path = texts(tmp_path, ["ab", "cde", "f"])
    loader = SFTDataLoader(path, ByteTokenizer(), 3, 6, format="text", packing=False, shuffle=False)
    batch = loader.next_batch()
    np.testing.assert_array_equal(batch.inputs, [b("ab") + [EOS] + [PAD] * 3, b("cde") + [EOS, PAD, PAD],
                                                 b("f") + [EOS] + [PAD] * 4])
    np.testing.assert_array_equal(batch.targets, [b("b") + [EOS] + [-1] * 4, b("de") + [EOS, -1, -1, -1],
                                                  [EOS] + [-1] * 5])
    np.testing.assert_array_equal(batch.positions, [[0, 1, 2, 0, 0, 0], [0, 1, 2, 3, 0, 0], [0, 1, 0, 0, 0, 0]])
    np.testing.assert_array_equal(batch.segments, [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0]])
    assert loader.stats()["fill"] == 9 / 18


def test_pack_rows_is_greedy_in_order():
    assert pack_rows([3, 4, 2, 8, 8], 8, True).tolist() == [0, 2, 3, 4, 5]
    assert pack_rows([1, 1, 1, 5, 3], 8, True).tolist() == [0, 4, 5]
    assert pack_rows([2, 7, 1], 8, True).tolist() == [0, 1, 3]  # the 1 packs after the 7, not back with the 2
    assert pack_rows([3, 4], 8, False).tolist() == [0, 1, 2]
    assert pack_rows([], 8, True).tolist() == [0]


CHAT = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]


def test_chat_targets_are_the_next_tokens_labels(tmp_path):
    tok = ByteTokenizer()
    path = write_jsonl(tmp_path / "c.jsonl", [{"messages": CHAT}])
    loader = SFTDataLoader(path, tok, 1, 96, format="chat", shuffle=False)
    batch = loader.next_batch()
    text = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n"
    n = len(text)
    assert tok.decode(batch.inputs[0, :n]) == text and (batch.segments[0, :n] == 1).all()
    assert (batch.segments[0, n:] == 0).all()
    answer = text.index("yo")
    expected = [-1] * 96
    expected[answer - 1:n - 1] = b("yo<|im_end|>\n")  # the token before "y" predicts "y", ...
    np.testing.assert_array_equal(batch.targets[0], expected)
    prompt_loader = SFTDataLoader(path, tok, 1, 96, format="chat", shuffle=False, train_on_prompt=True)
    np.testing.assert_array_equal(prompt_loader.next_batch().targets[0, :n - 1], b(text[1:]))


def test_truncated_and_skipped_samples_are_counted(tmp_path):
    long_prompt = [{"role": "user", "content": "x" * 80}, {"role": "assistant", "content": "y"}]
    records = [{"messages": CHAT},                                                 # kept
               {"messages": [{"role": "user", "content": "no answer"}]},           # skipped: nothing trained
               {"messages": long_prompt},                                          # truncated before its answer
               {"messages": CHAT + [{"role": "user", "content": "z" * 40}]}]       # truncated after its answer
    path = write_jsonl(tmp_path / "c.jsonl", records)
    loader = SFTDataLoader(path, ByteTokenizer(), 2, 96, format="chat")  # CHAT is 65 tokens
    s = loader.stats()
    assert (s["samples"], s["used"], s["truncated"], s["skipped"]) == (4, 2, 2, 2)
    assert loader.summary().startswith(f"chat data {path}: 4 samples, 2 truncated to T=96, 2 skipped")
    with_prompt = SFTDataLoader(path, ByteTokenizer(), 2, 96, format="chat", train_on_prompt=True).stats()
    assert (with_prompt["used"], with_prompt["skipped"]) == (4, 0)
    # a sample whose only trained token is its first (no token before it predicts it) trains nothing either
    text_path = texts(tmp_path, ["", "a"], "t.jsonl")  # "" is just EOS
    assert SFTDataLoader(text_path, ByteTokenizer(), 1, 8, format="text").stats()["skipped"] == 1


def test_nothing_to_train_is_an_error(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [{"messages": [{"role": "user", "content": "q"}]}] * 3)
    with pytest.raises(SFTDataError, match=r"c.jsonl: none of the 3 samples has a trained token within T=64 tokens "
                                           r"\(all 3 skipped\)\nHINT: check that the conversations have assistant"):
        SFTDataLoader(path, ByteTokenizer(), 1, 64, format="chat")


def many_texts(tmp_path, n=23, seed=0):
    rng = np.random.default_rng(seed)
    items = [chr(65 + i % 26) + "z" * int(rng.integers(0, 9)) for i in range(n)]
    return texts(tmp_path, items), items


@pytest.mark.parametrize("packing", [True, False])
def test_two_ranks_read_what_one_rank_with_twice_the_batch_reads(tmp_path, packing):
    path, _ = many_texts(tmp_path)
    tok = ByteTokenizer()
    one = SFTDataLoader(path, tok, 6, 12, format="text", packing=packing, seed=3)
    ranks = [SFTDataLoader(path, tok, 3, 12, rank=r, world_size=2, format="text", packing=packing, seed=3)
             for r in range(2)]
    for _ in range(9):  # several epochs: global batches reach across epoch ends
        whole = one.next_batch()
        parts = [rank.next_batch() for rank in ranks]
        for field in SFTBatch._fields:
            np.testing.assert_array_equal(np.concatenate([getattr(p, field) for p in parts]), getattr(whole, field))
        assert ranks[0].state_dict() == ranks[1].state_dict() == one.state_dict()


def rows_of_epoch(loader):
    """The first byte of each sample of the next epoch's rows, read row by row (B=1)."""
    firsts = []
    for _ in range(loader.rows_in_epoch()):
        batch = loader.next_batch()
        starts = (batch.positions[0] == 0) & (batch.segments[0] > 0)
        firsts += batch.inputs[0][starts].tolist()
    return firsts


def test_each_epoch_is_a_fresh_deterministic_shuffle_of_every_sample(tmp_path):
    path, items = many_texts(tmp_path)
    tok = ByteTokenizer()
    a = SFTDataLoader(path, tok, 1, 12, format="text", seed=5)
    epochs = [rows_of_epoch(a) for _ in range(3)]
    assert a.state_dict()["epoch"] == 3 and a.state_dict()["row"] == 0
    for firsts in epochs:
        assert sorted(firsts) == sorted(ord(t[0]) for t in items)  # every sample once per epoch
    assert epochs[0] != epochs[1] != epochs[2]
    again = SFTDataLoader(path, tok, 1, 12, format="text", seed=5)
    assert [rows_of_epoch(again) for _ in range(3)] == epochs
    other = SFTDataLoader(path, tok, 1, 12, format="text", seed=6)
    assert rows_of_epoch(other) != epochs[0]
    in_order = SFTDataLoader(path, tok, 1, 12, format="text", shuffle=False)
    assert rows_of_epoch(in_order) == [ord(t[0]) for t in items] == rows_of_epoch(in_order)


@pytest.mark.parametrize("steps_before", [0, 1, 3, 4, 7, 12])
def test_state_dict_resumes_exactly_mid_epoch(tmp_path, steps_before):
    path, _ = many_texts(tmp_path)
    tok = ByteTokenizer()
    a = SFTDataLoader(path, tok, 2, 12, format="text", seed=1)
    for _ in range(steps_before):
        a.next_batch()
    state = json.loads(json.dumps(a.state_dict()))
    expect = [a.next_batch() for _ in range(10)]
    b_ = SFTDataLoader(path, tok, 2, 12, format="text", seed=1)
    b_.next_batch()  # wherever it was
    b_.load_state_dict(state)
    for want in expect:
        got = b_.next_batch()
        for field in SFTBatch._fields:
            np.testing.assert_array_equal(getattr(got, field), getattr(want, field))
    # a resume under another layout: 2 ranks with batch 1 continue where one rank with batch 2 stopped
    ranks = [SFTDataLoader(path, tok, 1, 12, rank=r, world_size=2, format="text", seed=1) for r in range(2)]
    for rank in ranks:
        rank.load_state_dict(state)
    for want in expect[:4]:
        np.testing.assert_array_equal(np.concatenate([r.next_batch().inputs for r in ranks]), want.inputs)


@pytest.mark.parametrize("shuffle", [True, False])
def test_a_set_smaller_than_a_batch_wraps_through_many_epochs(tmp_path, shuffle):
    # one conversation, batch 8: one global batch spans 8 epochs of one row each (more than the layouts kept)
    path = texts(tmp_path, ["abc"])
    loader = SFTDataLoader(path, ByteTokenizer(), 8, 6, format="text", shuffle=shuffle, seed=2)
    for _ in range(3):
        batch = loader.next_batch()
        np.testing.assert_array_equal(batch.inputs, [b("abc") + [EOS, PAD, PAD]] * 8)
        np.testing.assert_array_equal(batch.targets, [b("bc") + [EOS, -1, -1, -1]] * 8)
    assert loader.state_dict()["epoch"] == 24
    # a validation pass asks for the first epochs again after many later ones were laid out
    loader.reset()
    np.testing.assert_array_equal(loader.next_batch().inputs, batch.inputs)
    loader.load_state_dict({**loader.state_dict(), "epoch": 3, "row": 0})
    np.testing.assert_array_equal(loader.next_batch().inputs, batch.inputs)


def test_reset_after_many_epochs_reads_the_first_batches_again(tmp_path):
    # 3 rows an epoch, 2 ranks x batch 4: each global batch reaches over 2-3 epochs
    path = texts(tmp_path, ["ab", "cdefg", "hi", "jklm"])
    ranks = [SFTDataLoader(path, ByteTokenizer(), 4, 6, rank=r, world_size=2, format="text", shuffle=False)
             for r in range(2)]
    first = [[r.next_batch().inputs for r in ranks] for _ in range(2)]
    for _ in range(10):
        for r in ranks:
            r.next_batch()
    for r in ranks:
        r.reset()
    for want in first:
        for r, expected in zip(ranks, want):
            np.testing.assert_array_equal(r.next_batch().inputs, expected)


def test_reset_and_state_errors(tmp_path):
    path, _ = many_texts(tmp_path)
    tok = ByteTokenizer()
    loader = SFTDataLoader(path, tok, 2, 12, format="text")
    first = loader.next_batch()
    loader.next_batch()
    loader.reset()
    assert loader.state_dict()["epoch"] == 0 and loader.state_dict()["row"] == 0
    np.testing.assert_array_equal(loader.next_batch().inputs, first.inputs)
    with pytest.raises(ValueError, match=r"expected \{'epoch': int, 'row': int, ...\}, got \{'shard': 0, 'position': "
                                         r"0\}\nHINT: a state of DistributedDataLoader"):
        loader.load_state_dict({"shard": 0, "position": 0})
    state = loader.state_dict()
    other_t = SFTDataLoader(path, tok, 2, 16, format="text")
    with pytest.raises(ValueError, match=r"another layout of the samples \(sequence_length 12 -> 16\)\nHINT: resume "
                                         r"with the same data, train.sequence_length"):
        other_t.load_state_dict(state)
    with pytest.raises(ValueError, match=r"row 999 of epoch 0 is outside the epoch's \d+ rows"):
        loader.load_state_dict({**state, "row": 999})


def test_argument_and_file_errors(tmp_path):
    path, _ = many_texts(tmp_path)
    tok = ByteTokenizer()
    with pytest.raises(ValueError, match=r"expected rank in \[0, 2\), got 2"):
        SFTDataLoader(path, tok, 1, 8, rank=2, world_size=2, format="text")
    with pytest.raises(ValueError, match=r"data.format: expected one of text, chat, instruction for JSONL data, got "
                                         r"'tokens'"):
        SFTDataLoader(path, tok, 1, 8, format="tokens", config_key="data.train")
    with pytest.raises(SFTDataError, match=r"data.val: no files match '.*nothing_\*.jsonl'.*\nHINT: point data.val at"):
        SFTDataLoader(str(tmp_path / "nothing_*.jsonl"), tok, 1, 8, format="text", config_key="data.val")
    from infini_train.data.shards import write_shard

    write_shard(str(tmp_path / "train_000000.bin"), [1, 2, 3])
    with pytest.raises(SFTDataError, match=r"train_000000.bin is an llm.c token shard \(.bin\), expected JSONL or "
                                           r"SFT shards"):
        SFTDataLoader(str(tmp_path / "train_*"), tok, 1, 8, format="text")


def test_labels_of_maps_the_mask():
    ids, mask = np.array([5, 6, 7]), np.array([0, 1, 1], dtype=np.uint8)
    assert labels_of(ids, mask).tolist() == [-1, 6, 7] and labels_of(ids, mask, True).tolist() == [5, 6, 7]


def test_the_attention_rule_from_segments(tmp_path):
    """The rule the model side implements: i attends to j iff segments[i] == segments[j] != 0 and j <= i; padding
    attends to itself only."""
    loader = SFTDataLoader(texts(tmp_path, ["ab", "c"]), ByteTokenizer(), 1, 8, format="text", shuffle=False)
    seg = loader.next_batch().segments[0]
    i, j = np.arange(8)[:, None], np.arange(8)[None, :]
    allowed = ((seg[:, None] == seg[None, :]) & (seg[:, None] != 0) & (j <= i)) | ((seg[:, None] == 0) & (i == j))
    expected = np.zeros((8, 8), dtype=bool)
    expected[:3, :3] = np.tril(np.ones((3, 3), dtype=bool))     # "ab" + EOS
    expected[3:5, 3:5] = np.tril(np.ones((2, 2), dtype=bool))   # "c" + EOS
    expected[5:, 5:] = np.eye(3, dtype=bool)                    # padding
    np.testing.assert_array_equal(allowed, expected)
