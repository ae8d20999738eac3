import json
import re
import sys

import numpy as np
import pyarrow as pa
import pytest

from trainer.contract import join
from trainer.storage import open_storage
from trainops.staging.demo_data import demo_rows, write_demo_dataset
from trainops.staging.encoders import ByteTokenizer, load_tokenizer
from trainops.staging.errors import StagingError
from trainops.staging.options import check_tokenizer
from trainops.staging.stage import stage_dataset
from trainops.staging.tokenize import encode, token_dtype_for

tokenizers = pytest.importorskip("tokenizers")


def _word_tokenizer(extra_words: int = 0, eos: str | None = "</s>") -> bytes:
    """A word-level tokenizer.json over the demo vocabulary (plus ``extra_words`` fillers)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = sorted({w for t in demo_rows(600, seed=0)["text"] for w in t.split()})
    vocab = {w: i for i, w in enumerate(["[UNK]", *([eos] if eos else []), *words])}
    for n in range(extra_words):
        vocab[f"filler{n}"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok.to_str().encode()


def test_byte_batches_encode_like_the_record_format():
    texts = ["abc", "", "ünïcode ✓", "x" * 300]
    for array in (pa.array(texts), pa.array(["skip", *texts]).slice(1), pa.array(texts, pa.large_string())):
        tokens, lengths = ByteTokenizer().encode_batch(array)
        assert tokens.tobytes() == b"".join(encode(t) for t in texts)
        assert lengths.tolist() == [len(t.encode()) + 1 for t in texts]


def test_dtype_follows_the_vocabulary():
    assert [token_dtype_for(n) for n in (257, 65536, 65537)] == ["uint16", "uint16", "uint32"]


@pytest.mark.parametrize("extra, dtype, width", [(0, "uint16", 2), (70000, "uint32", 4)])
def test_a_hugging_face_tokenizer_at_a_uri_stages_readable_shards(
    file_root, raw_uri, tmp_path, extra, dtype, width
):
    source = write_demo_dataset(raw_uri, rows=300, seed=0, files=1)
    storage = open_storage(file_root)
    tok_uri = f"file://{tmp_path}/tok/tokenizer.json"
    storage.put(tok_uri, _word_tokenizer(extra))
    result = stage_dataset(storage, file_root, source["uri"], "hf", tokenizer=tok_uri, shard_tokens=2000)
    manifest = storage.get_json(result["manifest_uri"])
    tok = tokenizers.Tokenizer.from_str(_word_tokenizer(extra).decode())
    assert manifest["token_dtype"] == dtype
    assert manifest["tokenizer"]["kind"] == "huggingface"
    assert manifest["tokenizer"]["vocab_size"] == tok.get_vocab_size() > 0
    assert manifest["tokenizer"]["eos_id"] == tok.token_to_id("</s>") == 1
    shard = manifest["splits"]["eval"]["shards"][0]
    blob = storage.get(join(result["uri"], shard["path"]))
    assert len(blob) == width * shard["tokens"]
    stream = np.frombuffer(blob, dtype=f"<u{width}")
    texts = dict(zip(*(demo_rows(300, seed=0)[k] for k in ("id", "text")), strict=False))
    first = json.loads(storage.get(join(result["uri"], "eval/index.jsonl")).decode().splitlines()[0])
    want = [*tok.encode(texts[first["id"]], add_special_tokens=False).ids, 1]
    assert stream[first["start"] : first["end"]].tolist() == want
    # a different tokenizer file is a different version
    storage.put(tok_uri, _word_tokenizer(extra + 1))
    again = stage_dataset(storage, file_root, source["uri"], "hf", tokenizer=tok_uri, shard_tokens=2000)
    assert again["version"] != result["version"]


def test_the_trainer_reads_uint32_shards_from_the_manifest(file_root, raw_uri, tmp_path):
    pytest.importorskip("torch")
    from trainer.data import open_split, read_manifest

    source = write_demo_dataset(raw_uri, rows=100, seed=0, files=1)
    storage = open_storage(file_root)
    tok_uri = f"file://{tmp_path}/tokenizer.json"
    storage.put(tok_uri, _word_tokenizer(70000))
    result = stage_dataset(storage, file_root, source["uri"], "hf32", tokenizer=tok_uri)
    manifest = read_manifest(storage, result["uri"])
    stream = open_split(storage, result["uri"], manifest, "train")
    assert len(stream) == result["train_tokens"]
    assert int(stream.read(0, len(stream)).max()) < manifest["tokenizer"]["vocab_size"]
    assert (stream.read(0, len(stream)) == 1).sum() == manifest["rows"]["train"]  # one EOS each


def test_tokenizer_problems_are_named(tmp_path, monkeypatch):
    uri = f"file://{tmp_path}/tokenizer.json"
    storage = open_storage(uri)
    with pytest.raises(StagingError, match=r"does not exist: save the tokenizer.json there"):
        load_tokenizer(check_tokenizer(uri))
    storage.put(uri, b'{"not": "a tokenizer"}')
    with pytest.raises(StagingError, match=r"is not a Hugging Face tokenizer.json"):
        load_tokenizer(check_tokenizer(uri))
    storage.put(uri, _word_tokenizer(eos=None))
    with pytest.raises(StagingError, match=re.escape("has no end-of-record token </s> or <|endoftext|>")):
        load_tokenizer(check_tokenizer(uri))
    assert load_tokenizer(check_tokenizer({"uri": uri, "eos_token": "[UNK]"})).eos_id == 0
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(StagingError, match="'tokenizers' package is not installed"):
        load_tokenizer(check_tokenizer(uri))
