import copy

from trainops.staging.expectations import DEFAULT_EXPECTATIONS
from trainops.staging.tokenize import TOKENIZER, split_rule
from trainops.staging.version import dataset_version, version_inputs

OBJECTS = [
    {"uri": "file:///d/part-1.parquet", "size": 10, "etag": "b"},
    {"uri": "file:///d/part-0.parquet", "size": 12, "etag": "a"},
]


def _version(**changes):
    args = {
        "objects": OBJECTS,
        "expectations": DEFAULT_EXPECTATIONS,
        "tokenizer": TOKENIZER,
        "split_rule": split_rule(10),
        "shard_tokens": 1 << 20,
        "slice_columns": ["source"],
    }
    args.update(changes)
    objects = args.pop("objects")
    return dataset_version(version_inputs(objects, **args))


def test_version_is_12_hex_and_ignores_listing_order_and_key_order():
    v = _version()
    assert len(v) == 12 and int(v, 16) >= 0
    reordered = [dict(reversed(list(o.items()))) for o in reversed(OBJECTS)]
    assert _version(objects=reordered) == v
    assert _version(expectations=copy.deepcopy(DEFAULT_EXPECTATIONS)) == v


def test_version_changes_with_everything_that_changes_the_bytes():
    v = _version()
    changed_object = [dict(OBJECTS[0], etag="c"), OBJECTS[1]]
    stricter = copy.deepcopy(DEFAULT_EXPECTATIONS)
    stricter[3]["kwargs"]["max_value"] = 500
    variants = {
        "object etag": _version(objects=changed_object),
        "object added": _version(objects=[*OBJECTS, {"uri": "file:///d/p2", "size": 1, "etag": "z"}]),
        "suite": _version(expectations=stricter),
        "tokenizer": _version(tokenizer=dict(TOKENIZER, vocab_size=258)),
        "split rule": _version(split_rule=split_rule(20)),
        "shard size": _version(shard_tokens=1 << 16),
        "slice columns": _version(slice_columns=["source", "lang"]),
    }
    assert v not in variants.values()
    assert len(set(variants.values())) == len(variants)


def test_quarantine_options_count_only_when_set():
    v = _version()
    assert _version(quarantine=None) == v  # versions staged before quarantine existed stay
    q1 = _version(quarantine={"max_fraction": 0.01, "sample_rows": 100})
    q2 = _version(quarantine={"max_fraction": 0.02, "sample_rows": 100})
    assert len({v, q1, q2}) == 3
