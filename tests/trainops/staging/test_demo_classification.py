"""The classification demo's data and tokenizer: deterministic, learnable, built without the hub."""

from __future__ import annotations

import hashlib
import json

from trainer.storage import open_storage
from trainops.staging.demo_classification import (
    SPECIAL_TOKENS,
    TOKENIZER_VOCAB,
    demo_classifier_tokenizer_json,
    demo_labelled,
    write_demo_classifier_tokenizer,
)


def test_each_text_is_a_post_and_its_label_the_source_that_wrote_it():
    from trainops.staging.demo_data import demo_rows

    rows = demo_labelled(30, seed=1)
    assert rows == demo_labelled(30, seed=1)  # the same arguments, the same records
    posts = demo_rows(30, seed=1)
    assert rows["text"] == list(posts["text"]) and rows["label"] == list(posts["source"])
    assert set(rows["label"]) <= {"news", "forum", "docs"} and len(set(rows["id"])) == 30
    for text, length in zip(rows["text"], rows["length"], strict=True):  # the slice column
        assert length == ("short" if len(text.split()) < 9 else "long")
    assert set(demo_labelled(2000)["length"]) == {"short", "long"}


def test_the_tokenizer_frames_a_text_as_bert_does_and_pads_with_id_0(tmp_path):
    from tokenizers import Tokenizer

    data = demo_classifier_tokenizer_json()
    assert hashlib.sha256(data).digest() == hashlib.sha256(demo_classifier_tokenizer_json()).digest()
    tokenizer = Tokenizer.from_str(data.decode())
    assert tokenizer.get_vocab_size() == TOKENIZER_VOCAB
    assert [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]  # [PAD] is the model's 0
    post = demo_labelled(1)["text"][0]
    framed = tokenizer.encode(post)
    assert framed.tokens[0] == "[CLS]" and framed.tokens[-1] == "[SEP]"
    assert tokenizer.decode(framed.ids) == post  # byte-level: every text round-trips
    uri = (tmp_path / "tok" / "tokenizer.json").as_uri()
    write_demo_classifier_tokenizer(uri)
    config = json.loads(open_storage(uri).get(uri.replace("tokenizer.json", "tokenizer_config.json")))
    assert config["pad_token"] == "[PAD]"  # the export ships it: AutoTokenizer pads with it
    open_storage(uri).put(uri, b"kept")  # written once: a second demo run keeps what is there
    write_demo_classifier_tokenizer(uri)
    assert open_storage(uri).get(uri) == b"kept"
