"""Version claims, and the versions of promotions that died part way (swept by the next one)."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import pytest

from tests.trainops.registry.helpers import card_for, do_promote, make_run, promote_runs
from trainer.contract import join, model_version_prefix, production_pointer
from trainer.storage import open_storage
from trainops.registry.claims import (
    CLAIM_NAME,
    STALE_AFTER_S,
    ClaimLost,
    allocate_version,
    interrupted,
)
from trainops.registry.pointer import read_production
from trainops.registry.promotion import promote

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
MODEL = "demo-lm"


def ago(seconds: float) -> str:
    return (NOW - timedelta(seconds=seconds)).isoformat(timespec="seconds")


def claim(run_uri="file:///r/runs/a", claimed=60.0, **fields) -> dict:
    return {"model": MODEL, "version": 2, "run_uri": run_uri, "claimed_at": ago(claimed), **fields}


def why(found, *, run_uri="file:///r/runs/me", pointer=None, version=2):
    return interrupted(found, version=version, name=MODEL, pointer=pointer, run_uri=run_uri, now=NOW)


# ------------------------------------------------------------------------------ pure


def test_an_earlier_try_of_the_same_promotion_is_interrupted_at_once():
    assert why(claim(run_uri="file:///r/runs/me", claimed=5)) == (
        "interrupted: an earlier try of this promotion (run file:///r/runs/me) claimed v2 at "
        f"{ago(5)} and never moved the pointer"
    )


def test_another_runs_claim_is_interrupted_only_once_it_is_stale():
    assert why(claim(claimed=STALE_AFTER_S - 60)) is None  # it may be copying right now
    assert why(claim(claimed=STALE_AFTER_S + 60)) == (
        f"interrupted: the promotion of run file:///r/runs/a claimed v2 at {ago(STALE_AFTER_S + 60)} "
        "and never moved the pointer (no sign of it for over 6 hours)"
    )
    assert why(claim(claimed=STALE_AFTER_S + 60), run_uri=None) is not None


@pytest.mark.parametrize(
    ("found", "pointer", "run_uri"),
    [
        (claim(run_uri="file:///r/runs/me", abandoned_at=ago(10), reason="lost"), None, "file:///r/runs/me"),
        (claim(run_uri="file:///r/runs/me", model="other-lm"), None, "file:///r/runs/me"),
        (claim(claimed=STALE_AFTER_S * 2, swept_at=ago(30)), None, "file:///r/runs/me"),  # being swept
        (
            claim(run_uri="file:///r/runs/me", swept_at=ago(30), swept_by="file:///r/runs/b"),
            None,
            "file:///r/runs/me",
        ),
        (claim(claimed=STALE_AFTER_S * 2, claimed_at="yesterday"), None, "file:///r/runs/me"),
        (claim(run_uri=None, claimed=5), None, None),  # no run: no way to know it is ours
        ("not a claim", None, "file:///r/runs/me"),
        # named by the pointer: production now, or anywhere in its history
        (claim(run_uri="file:///r/runs/me"), {"version": 2, "history": []}, "file:///r/runs/me"),
        (
            claim(claimed=STALE_AFTER_S * 2),
            {"version": 3, "history": [{"version": 2, "action": "promote"}]},
            "file:///r/runs/me",
        ),
    ],
    ids=[
        "abandoned",
        "another-model",
        "sweep-under-way",
        "sweep-under-way-of-mine",
        "unknown-time",
        "no-run",
        "not-an-object",
        "production",
        "in-history",
    ],
)
def test_what_is_never_swept(found, pointer, run_uri):
    assert why(found, pointer=pointer, run_uri=run_uri) is None


def test_a_sweep_that_died_is_swept_again_at_once_by_its_own_retry_or_later_by_anyone():
    assert why(claim(claimed=STALE_AFTER_S * 3, swept_at=ago(STALE_AFTER_S * 2))) is not None
    mine = "file:///r/runs/me"
    assert why(claim(run_uri=mine, swept_at=ago(5), swept_by=mine)) is not None  # taking its own over
    assert why(claim(claimed=STALE_AFTER_S * 3, swept_at=ago(5), swept_by=mine)) is not None


# ------------------------------------------------------------------------- storage I/O


def killed_try(storage, root: str, run_uri: str, *, name: str = MODEL, claimed_at: str | None = None) -> str:
    """What a promotion killed while copying leaves: its claim, part of the export and (on
    file://) the temp file of the copy it was in. Returns the version's folder."""
    version = allocate_version(storage, root, name, claim={"run_uri": run_uri})
    version_uri = model_version_prefix(root, name, version)
    if claimed_at is not None:
        uri = join(version_uri, CLAIM_NAME)
        storage.put_json(uri, {**storage.get_json(uri), "claimed_at": claimed_at})
    storage.copy(join(run_uri, "export", "model.safetensors"), join(version_uri, "model.safetensors"))
    if root.startswith("file://"):
        folder = version_uri[len("file://") :] + "/tokenizer"
        os.makedirs(folder, exist_ok=True)
        with open(f"{folder}/.vocab.json.tmp-{'0' * 32}", "wb") as half:
            half.write(b'{"a"')
    return version_uri


def long_ago() -> str:
    """A claim time past :data:`STALE_AFTER_S` from now."""
    return (datetime.now(UTC) - timedelta(seconds=STALE_AFTER_S + 600)).isoformat(timespec="seconds")


def on_disk(version_uri: str) -> list[str]:
    """Every file under a file:// folder, the storage client's temp files included."""
    root = version_uri[len("file://") :]
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def test_a_retried_promotion_takes_its_own_interrupted_version_over(root):
    storage = open_storage(root)
    promote_runs(storage, root, 1)
    run = make_run(storage, root, "killed")
    version_uri = killed_try(storage, root, run)
    assert version_uri == model_version_prefix(root, MODEL, 2)

    result = do_promote(storage, root, run, 1)

    assert (result["version"], result["previous_version"]) == (2, 1)  # the number its first try took
    assert read_production(storage, root, MODEL)["version"] == 2
    names = ["README.md", CLAIM_NAME, "card.json", "model.safetensors", "tokenizer/vocab.json"]
    assert storage.list(version_uri) == [join(version_uri, n) for n in names]
    if root.startswith("file://"):
        assert on_disk(version_uri) == sorted(names)  # the killed copy's temp file is gone too
    claim = storage.get_json(join(version_uri, CLAIM_NAME))
    assert claim["run_uri"] == run and "abandoned_at" not in claim
    assert storage.list(model_version_prefix(root, MODEL, 3)) == []


def test_another_runs_stale_interrupted_version_is_swept_and_keeps_a_tombstone(file_root):
    storage = open_storage(file_root)
    promote_runs(storage, file_root, 1)
    dead = make_run(storage, file_root, "dead")
    version_uri = killed_try(storage, file_root, dead, claimed_at=long_ago())
    run = make_run(storage, file_root, "next")

    result = do_promote(storage, file_root, run, 1)

    assert result["version"] == 3
    assert on_disk(version_uri) == [CLAIM_NAME]  # weights and the temp file gone
    tombstone = storage.get_json(join(version_uri, CLAIM_NAME))
    assert (tombstone["run_uri"], tombstone["swept_by"]) == (dead, run) and tombstone["abandoned_at"]
    assert tombstone["reason"].startswith(f"interrupted: the promotion of run {dead} claimed v2 at ")
    # A later promotion reads the tombstone and leaves it as it is.
    before = storage.get(join(version_uri, CLAIM_NAME))
    do_promote(storage, file_root, make_run(storage, file_root, "later"), 3)
    assert storage.get(join(version_uri, CLAIM_NAME)) == before


def test_another_runs_recent_claim_is_left_alone(file_root):
    """It may be a live promotion copying right now."""
    storage = open_storage(file_root)
    promote_runs(storage, file_root, 1)
    version_uri = killed_try(storage, file_root, make_run(storage, file_root, "copying"))
    before = {uri: storage.get(uri) for uri in storage.list(version_uri)}

    assert do_promote(storage, file_root, make_run(storage, file_root, "next"), 1)["version"] == 3

    assert {uri: storage.get(uri) for uri in storage.list(version_uri)} == before


def test_a_promotion_whose_claim_was_swept_meanwhile_publishes_nothing(file_root):
    """A promotion that showed no sign of life for hours was taken for dead and its version swept
    (the claim now names another promotion): it must not move the pointer to it."""
    storage = open_storage(file_root)
    promote_runs(storage, file_root, 1)
    run = make_run(storage, file_root, "slow")
    claim_uri = join(model_version_prefix(file_root, MODEL, 2), CLAIM_NAME)

    class SweptWhileCopying:
        def __init__(self, inner):
            self._inner = inner

        def put_json(self, uri, obj, **conditions):
            if uri.endswith("/card.json"):  # the copy is done: another promotion swept v2 by now
                self._inner.put_json(claim_uri, {**self._inner.get_json(claim_uri), "token": "theirs"})
            return self._inner.put_json(uri, obj, **conditions)

        def __getattr__(self, name):
            return getattr(self._inner, name)

    pointer_before = storage.get(production_pointer(file_root, MODEL))
    with pytest.raises(ClaimLost) as lost:
        promote(
            SweptWhileCopying(storage),
            file_root,
            MODEL,
            export_uri=join(run, "export"),
            card=card_for(run),
            expected_production_version=1,
        )
    assert str(lost.value).startswith(f"v2 of 'demo-lm' is no longer this promotion's: its claim {claim_uri}")
    assert storage.get(production_pointer(file_root, MODEL)) == pointer_before
    assert storage.get_json(claim_uri)["token"] == "theirs"  # not marked abandoned by the loser
    assert "abandoned_at" not in storage.get_json(claim_uri)
