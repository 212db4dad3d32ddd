import glob
import json
import os

import numpy as np
import pytest

from infini_train.data.corpus import read_meta
from infini_train.data.sft import SampleTable
from infini_train.data.sft_loader import SFTBatch, SFTDataLoader
from infini_train.data.sft_prepare import prepare_sft_shards
from infini_train.data.sft_records import SFTDataError
from infini_train.data.sft_shards import HEADER_BYTES, SFT_MAGIC, read_sft_header, read_sft_shard, write_sft_shard
from infini_train.data.shards import ShardError, write_shard
from infini_train.data.tokenizer import ByteTokenizer
from tests.data.test_corpus import load_prepare_data



def table(samples):
    """A SampleTable of [(ids, mask), ...]."""
    ids = np.concatenate([np.asarray(i, dtype=np.uint32) for i, _ in samples])
    mask = np.concatenate([np.asarray(m, dtype=np.uint8) for _, m in samples])
    return SampleTable(ids, mask, np.cumsum([0] + [len(i) for i, _ in samples]), "test")


def test_round_trip_keeps_ids_past_uint16_masks_and_boundaries(tmp_path):
    path = str(tmp_path / "train_000000.sft")
    t = table([([128000, 5, 128255], [0, 1, 1]), ([7], [1]), ([70000, 1, 2, 3], [0, 0, 1, 1])])
    write_sft_shard(path, t, "chat", 128256)
    assert os.listdir(tmp_path) == ["train_000000.sft"]  # written atomically: no temporary file left
    assert os.path.getsize(path) == HEADER_BYTES + 8 * 4 + 5 * 8
    header = np.fromfile(path, dtype="<i8", count=6).tolist()
    assert header == [SFT_MAGIC, 1, 3, 8, 2, 128256]
    loaded, info = read_sft_shard(path)
    assert info == {"samples": 3, "tokens": 8, "format": "chat", "vocab_size": 128256}
    assert isinstance(loaded.ids, np.memmap) and not loaded.ids.flags.writeable
    for i in range(3):
        np.testing.assert_array_equal(loaded[i][0], t[i][0])
        np.testing.assert_array_equal(loaded[i][1], t[i][1])
    assert loaded.ids.dtype == np.dtype("<u4") and int(loaded[0][0][2]) == 128255


def test_reading_validates_the_header_and_the_offsets(tmp_path):
    path = str(tmp_path / "a.sft")
    write_sft_shard(path, table([([1, 2], [1, 1])]), "text", 257)
    data = open(path, "rb").read()
    open(path, "wb").write(data[:-1])
    with pytest.raises(ShardError, match=r"a.sft: header says 1 samples and 2 tokens \(1050 bytes\) but the file has "
                                         r"1049 bytes\nHINT: the file is damaged or was cut off"):
        read_sft_header(path)
    open(path, "wb").write(data[:100])
    with pytest.raises(ShardError, match="100 bytes, shorter than the 1024-byte SFT shard header"):
        read_sft_header(path)
    write_shard(str(tmp_path / "t.bin"), list(range(600)))
    with pytest.raises(ShardError, match=r"t.bin: an llm.c token shard \(magic 20240520\), expected an SFT shard.*\n"
                                         r"HINT: token shards are data.format=tokens"):
        read_sft_header(str(tmp_path / "t.bin"))
    header = np.frombuffer(data[:HEADER_BYTES], dtype="<i8").copy()
    header[1] = 9
    open(path, "wb").write(header.tobytes() + data[HEADER_BYTES:])
    with pytest.raises(ShardError, match="unsupported SFT shard version 9, expected 1"):
        read_sft_header(path)
    offsets = np.array([0, 3], dtype="<i8")  # the header says 2 tokens
    open(path, "wb").write(data[:HEADER_BYTES] + offsets.tobytes() + data[HEADER_BYTES + 16:])
    with pytest.raises(ShardError, match="sample offsets are not increasing from 0 to the 2 tokens of the header"):
        read_sft_shard(path)
    with pytest.raises(ShardError, match="cannot read the SFT shard"):
        read_sft_header(str(tmp_path / "missing.sft"))


CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}, {"role": "assistant", "content": "Paris."}],
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "1 + 1 = ?"},
     {"role": "assistant", "content": "2"}, {"role": "user", "content": "2 * 3 = ?"},
     {"role": "assistant", "content": "6, of course: " + "six " * 10}],
    [{"role": "user", "content": "Hello!"}, {"role": "assistant", "content": "How can I help you today?"}],
    [{"role": "user", "content": "no answer here"}],
    [{"role": "user", "content": "Write a short poem about the sea. " * 3}, {"role": "assistant", "content": "Blue."}],
]


def chat_file(tmp_path, copies=3):
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in CHATS * copies))
    return str(path)


def assert_same_batches(a, b, steps):
    for _ in range(steps):
        x, y = a.next_batch(), b.next_batch()
        for field in SFTBatch._fields:
            np.testing.assert_array_equal(getattr(x, field), getattr(y, field))
    assert a.stats() == b.stats()


@pytest.mark.parametrize("packing", [True, False])
def test_prepared_shards_give_the_batches_of_the_jsonl(tmp_path, llama_tok, packing):
    src = chat_file(tmp_path)
    out = str(tmp_path / "out")
    meta = prepare_sft_shards([src], out, llama_tok, "chat", val_fraction=0, shard_tokens=150)
    assert meta["train_shards"] > 1 and meta["val_shards"] == 0 and not glob.glob(os.path.join(out, "val_*"))
    kwargs = dict(format="chat", packing=packing, seed=4)
    for T in (48, 128):  # truncation and skipping decided when read, alike for both
        jsonl = SFTDataLoader(src, llama_tok, 2, T, **kwargs)
        shards = SFTDataLoader(os.path.join(out, "train_*.sft"), llama_tok, 2, T, **kwargs)
        assert shards.kind == "shards" and jsonl.kind == "jsonl"
        assert_same_batches(jsonl, shards, 12)


def test_validation_samples_are_a_seeded_draw_and_both_splits_keep_file_order(tmp_path):
    tok = ByteTokenizer()
    path = tmp_path / "t.jsonl"
    items = [f"sample {i:02d}" for i in range(20)]
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in items))
    out = str(tmp_path / "out")
    meta = prepare_sft_shards([str(path)], out, tok, "text", val_fraction=0.2, split_seed=1)
    assert (meta["num_samples"], meta["train_samples"], meta["val_samples"]) == (20, 16, 4)
    assert read_meta(os.path.join(out, "train_*.sft")) == meta

    def decoded(split):
        t, _ = read_sft_shard(os.path.join(out, f"{split}_000000.sft"))
        return [tok.decode(t[i][0].tolist()).removesuffix("<|endoftext|>") for i in range(len(t))]

    train, val = decoded("train"), decoded("val")
    assert sorted(train + val) == items and train == sorted(train) and val == sorted(val)
    assert val != items[:4]  # drawn, not the first ones
    again = prepare_sft_shards([str(path)], str(tmp_path / "again"), tok, "text", val_samples=4, split_seed=1)
    assert again["val_samples"] == 4 and decoded("val") == val
    with pytest.raises(ValueError, match=r"the validation split \(val_samples=20: 20 samples\) must leave training "
                                         r"samples of the 20 there are"):
        prepare_sft_shards([str(path)], out, tok, "text", val_samples=20)


def test_the_loader_checks_the_shards_format_and_vocabulary(tmp_path, llama_tok):
    out = str(tmp_path / "out")
    prepare_sft_shards([chat_file(tmp_path)], out, llama_tok, "chat", val_fraction=0)
    pattern = os.path.join(out, "train_*.sft")
    with pytest.raises(SFTDataError, match=r"train_000000.sft: an SFT shard prepared with --format chat, but the "
                                           r"loader reads format 'instruction'\nHINT: set data.format=chat"):
        SFTDataLoader(pattern, llama_tok, 1, 64, format="instruction")
    with pytest.raises(SFTDataError, match=r"prepared with a tokenizer of vocab_size 400, but the loader's tokenizer "
                                           r"has 257"):
        SFTDataLoader(pattern, ByteTokenizer(), 1, 64, format="chat")
    open(os.path.join(out, "extra.jsonl"), "w").write("{}\n")
    with pytest.raises(SFTDataError, match=r"matches both SFT shards .* and other files"):
        SFTDataLoader(os.path.join(out, "*"), llama_tok, 1, 64, format="chat")


def test_prepare_data_cli_writes_sft_shards_and_meta(tmp_path, capsys):
    prepare_data = load_prepare_data()
    src = tmp_path / "alpaca.jsonl"
    src.write_text("".join(json.dumps({"instruction": f"Count to {i}", "input": "" if i % 2 else "in words",
                                       "output": " ".join(map(str, range(i + 1)))}) + "\n" for i in range(10)))
    out = str(tmp_path / "out")
    assert prepare_data.main(["--format", "instruction", str(src), "--out-dir", out, "--val-samples", "2"]) == 0
    printed = capsys.readouterr().out
    assert "10 instruction samples" in printed and "data.format=instruction" in printed
    assert f"data.train={out}/train_*.sft data.val={out}/val_*.sft data.tokenizer=byte" in printed
    meta = json.load(open(os.path.join(out, "meta.json")))
    assert (meta["format"], meta["tokenizer"], meta["chat_template"], meta["train_samples"], meta["val_samples"]) \
        == ("instruction", "byte", "builtin ChatML", 8, 2)
    assert meta["vocab_size"] == 257 and meta["eot_token"] == 256 and meta["inputs"] == [str(src)]
    loader = SFTDataLoader(os.path.join(out, "val_*.sft"), ByteTokenizer(), 2, 128, format="instruction")
    assert loader.stats()["samples"] == 2
    for argv, message in [(["--val-tokens", "5"], "--val-tokens is for --format tokens"),
                          (["--split-on", "x"], "--split-on is for --format tokens"),
                          (["--tokenizer", "bytes"], "unknown tokenizer 'bytes'")]:
        with pytest.raises(SystemExit, match=message):
            prepare_data.main(["--format", "instruction", str(src), "--out-dir", out] + argv)
    with pytest.raises(SystemExit, match=r"--format chat needs JSONL files, got none"):
        prepare_data.main(["--format", "chat"])
    with pytest.raises(SystemExit, match=r"error: .*alpaca.jsonl:1: expected the field \"messages\" of "
                                         r"data.format=chat.*\nHINT: this record looks like data.format=instruction"):
        prepare_data.main(["--format", "chat", str(src), "--out-dir", out])
    with pytest.raises(SystemExit, match="--val-samples is for the SFT formats"):
        prepare_data.main([str(src), "--val-samples", "2", "--out-dir", str(tmp_path / "tok")])


def test_prepare_data_cli_with_a_hf_tokenizer_matches_the_jsonl(tmp_path, tiny_llama3, capsys):
    from infini_train.data.tokenizer import get_tokenizer

    src, out = chat_file(tmp_path), str(tmp_path / "out")
    assert load_prepare_data().main(["--format", "chat", src, "--tokenizer", "hf:" + tiny_llama3, "--out-dir", out,
                                     "--val-fraction", "0"]) == 0
    assert "data.tokenizer=hf:" + tiny_llama3 in capsys.readouterr().out
    meta = json.load(open(os.path.join(out, "meta.json")))
    assert (meta["tokenizer"], meta["chat_template"], meta["vocab_size"]) == ("hf:" + tiny_llama3, "tokenizer", 400)
    tok = get_tokenizer(meta["tokenizer"])
    assert_same_batches(SFTDataLoader(src, tok, 3, 64, format="chat"),
                        SFTDataLoader(os.path.join(out, "train_*.sft"), tok, 3, 64, format="chat"), 6)
