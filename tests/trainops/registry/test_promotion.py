"""Promotion on real storage: file:// and s3:// (moto over HTTP)."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import trainops
from tests.trainops.registry.helpers import (
    BeforePointerWrite,
    Candidate,
    card_for,
    do_promote,
    gate_for,
    make_run,
    promote_candidate,
    rival_first,
    two_candidates_gated_against_v1,
)
from trainer.contract import join, model_version_prefix, production_pointer
from trainer.storage import open_storage
from trainops.registry.promotion import (
    ProductionMovedError,
    PromotionError,
    RegateRejected,
    allocate_version,
    config_sha256,
    next_version,
    promote,
    read_production,
    version_numbers,
)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


# ------------------------------------------------------------------------------ pure


def test_next_version():
    assert next_version([]) == 1
    assert next_version([1, 2, 3]) == 4
    assert next_version([7, 2]) == 8


# ------------------------------------------------------------------------ versions


def test_allocate_version_takes_the_next_free_number(root):
    storage = open_storage(root)
    assert allocate_version(storage, root, "demo-lm") == 1
    assert allocate_version(storage, root, "demo-lm") == 2
    assert allocate_version(storage, root, "other") == 1
    assert version_numbers(storage, root, "demo-lm") == [1, 2]
    claim = storage.get_json(join(model_version_prefix(root, "demo-lm", 2), "_claim.json"))
    assert claim["version"] == 2 and claim["model"] == "demo-lm"


def test_concurrent_allocations_get_distinct_versions(file_root):
    storage = open_storage(file_root)
    barrier = threading.Barrier(6)

    def claim(_):
        barrier.wait()
        return allocate_version(storage, file_root, "demo-lm")

    with ThreadPoolExecutor(6) as pool:
        versions = sorted(pool.map(claim, range(6)))
    assert versions == [1, 2, 3, 4, 5, 6]


# ------------------------------------------------------------------------- promote


def test_promote_twice_copies_files_writes_card_and_grows_history(root):
    storage = open_storage(root)
    run1, run2 = make_run(storage, root, "run-1"), make_run(storage, root, "run-2")
    assert read_production(storage, root, "demo-lm") is None

    first = do_promote(storage, root, run1, None)
    v1_uri = model_version_prefix(root, "demo-lm", 1)
    assert first == {
        "version": 1,
        "version_uri": v1_uri,
        "card_uri": join(v1_uri, "card.json"),
        "production_uri": production_pointer(root, "demo-lm"),
        "previous_version": None,
        "regated_against": [],
    }
    assert storage.get(join(v1_uri, "model.safetensors")) == b"weights of run-1"
    assert storage.get(join(v1_uri, "tokenizer", "vocab.json")) == b'{"a": 1}'

    card = storage.get_json(join(v1_uri, "card.json"))
    assert card["version"] == 1 and card["model"] == "demo-lm"
    assert card["run_uri"] == run1
    assert card["dataset"]["version"] == "v3"
    assert card["steps"] == 100 and card["preemptions_survived"] == 2
    assert card["trainops_version"] == getattr(trainops, "__version__", "0.1.0")
    assert card["promoted_at"].endswith("+00:00")
    assert {f["path"] for f in card["files"]} == {"model.safetensors", "tokenizer/vocab.json"}

    second = do_promote(storage, root, run2, 1)
    assert second["version"] == 2 and second["previous_version"] == 1
    pointer = read_production(storage, root, "demo-lm")
    assert pointer["version"] == 2 and pointer["model"] == "demo-lm"
    assert pointer["uri"] == model_version_prefix(root, "demo-lm", 2)
    assert pointer["run_uri"] == run2
    assert [(h["version"], h["action"], h["run_uri"]) for h in pointer["history"]] == [
        (1, "promote", run1),
        (2, "promote", run2),
    ]
    assert storage.get(join(pointer["uri"], "model.safetensors")) == b"weights of run-2"


def test_retry_after_a_completed_promotion_reports_it_instead_of_failing(file_root):
    storage = open_storage(file_root)
    do_promote(storage, file_root, make_run(storage, file_root, "run-1"), None)
    run2 = make_run(storage, file_root, "run-2")
    first = do_promote(storage, file_root, run2, 1)
    again = do_promote(storage, file_root, run2, 1)
    assert again == first and again["version"] == 2
    assert version_numbers(storage, file_root, "demo-lm") == [1, 2]
    assert len(read_production(storage, file_root, "demo-lm")["history"]) == 2


def test_config_sha256_hashes_the_config_bytes(file_root):
    storage = open_storage(file_root)
    run = make_run(storage, file_root)
    expected = hashlib.sha256(b"model: tiny\nrun: run-1\n").hexdigest()
    assert config_sha256(storage, join(run, "config.yaml")) == expected
    with pytest.raises(PromotionError, match=r"missing.yaml"):
        config_sha256(storage, join(run, "missing.yaml"))


def test_stale_expected_version_fails_before_copying(file_root):
    storage = open_storage(file_root)
    do_promote(storage, file_root, make_run(storage, file_root, "run-1"), None)
    do_promote(storage, file_root, make_run(storage, file_root, "run-2"), 1)
    with pytest.raises(ProductionMovedError) as err:
        do_promote(storage, file_root, make_run(storage, file_root, "run-3"), 1)
    assert str(err.value) == (
        "production of 'demo-lm' moved from v1 to v2 while this run was gated; re-run to evaluate against v2"
    )
    assert (err.value.expected_version, err.value.current_version) == (1, 2)
    assert version_numbers(storage, file_root, "demo-lm") == [1, 2]
    assert read_production(storage, file_root, "demo-lm")["version"] == 2


def test_empty_export_is_refused_and_its_version_is_not_reused(file_root):
    storage = open_storage(file_root)
    run = join(file_root, "runs", "empty")
    storage.put(join(run, "config.yaml"), b"x: 1\n")
    with pytest.raises(PromotionError, match=r"holds no files"):
        promote(
            storage,
            file_root,
            "demo-lm",
            export_uri=join(run, "export"),
            card=card_for(run),
            expected_production_version=None,
        )
    assert read_production(storage, file_root, "demo-lm") is None
    v1 = model_version_prefix(file_root, "demo-lm", 1)
    assert storage.list(v1) == [join(v1, "_claim.json")]
    assert "holds no files" in storage.get_json(join(v1, "_claim.json"))["reason"]
    assert do_promote(storage, file_root, make_run(storage, file_root), None)["version"] == 2


def test_lost_compare_and_swap_rereads_and_reports_the_winner(root):
    storage = open_storage(root)
    do_promote(storage, root, make_run(storage, root, "run-1"), None)
    rival_run, my_run = make_run(storage, root, "rival"), make_run(storage, root, "mine")
    pointer_uri = production_pointer(root, "demo-lm")
    # The rival moves production after this promotion read the pointer's etag.
    racy = BeforePointerWrite(storage, pointer_uri, lambda: do_promote(storage, root, rival_run, 1))
    # This promotion claimed v2 before the rival ran, so the rival is v3.
    with pytest.raises(ProductionMovedError, match="moved from v1 to v3"):
        do_promote(racy, root, my_run, 1)
    pointer = read_production(storage, root, "demo-lm")
    assert pointer["version"] == 3 and pointer["run_uri"] == rival_run
    assert [h["version"] for h in pointer["history"]] == [1, 3]
    # The loser's version keeps only its claim, with the reason, so v2 is never reused.
    loser = model_version_prefix(root, "demo-lm", 2)
    assert storage.list(loser) == [join(loser, "_claim.json")]
    assert "moved from v1 to v3" in storage.get_json(join(loser, "_claim.json"))["reason"]
    assert version_numbers(storage, root, "demo-lm") == [1, 2, 3]


def test_pointer_rewritten_without_moving_does_not_block_promotion(file_root):
    storage = open_storage(file_root)
    do_promote(storage, file_root, make_run(storage, file_root, "run-1"), None)
    pointer_uri = production_pointer(file_root, "demo-lm")

    def touch_pointer():
        storage.put_json(pointer_uri, {**storage.get_json(pointer_uri), "note": "annotated"})

    racy = BeforePointerWrite(storage, pointer_uri, touch_pointer)
    assert do_promote(racy, file_root, make_run(storage, file_root, "run-2"), 1)["version"] == 2
    pointer = read_production(storage, file_root, "demo-lm")
    # The compare-and-swap lost to the rewrite, re-read, and then replaced it.
    assert pointer["version"] == 2 and "note" not in pointer
    assert [h["version"] for h in pointer["history"]] == [1, 2]


# --------------------------------------------------------------------------- races


def race_threads(storage, root, runs, expected, name="demo-lm"):
    """Promote ``runs`` at once; all of them have read the pointer before any writes it."""
    barrier = threading.Barrier(len(runs))
    pointer_uri = production_pointer(root, name)

    def one(run):
        racer = BeforePointerWrite(storage, pointer_uri, lambda: barrier.wait(timeout=30))
        try:
            return do_promote(racer, root, run, expected, name=name)["version"]
        except ProductionMovedError as exc:
            return exc

    with ThreadPoolExecutor(len(runs)) as pool:
        return list(pool.map(one, runs))


def assert_one_winner(storage, root, outcomes, runs, name="demo-lm", expected=None):
    winners = [(v, run) for v, run in zip(outcomes, runs, strict=False) if isinstance(v, int)]
    losers = [o for o in outcomes if not isinstance(o, int)]
    assert len(winners) == 1, outcomes
    assert len(losers) == len(runs) - 1
    version, run = winners[0]
    pointer = read_production(storage, root, name)
    assert (pointer["version"], pointer["run_uri"]) == (version, run)
    for loser in losers:
        assert isinstance(loser, ProductionMovedError)
        assert loser.expected_version == expected
        assert loser.current_version == version


def test_two_threads_racing_from_v1_one_wins(file_root):
    storage = open_storage(file_root)
    do_promote(storage, file_root, make_run(storage, file_root, "base"), None)
    runs = [make_run(storage, file_root, f"racer-{i}") for i in range(2)]
    outcomes = race_threads(storage, file_root, runs, 1)
    assert_one_winner(storage, file_root, outcomes, runs, expected=1)
    assert len(read_production(storage, file_root, "demo-lm")["history"]) == 2


# Each racer announces it has read the pointer and waits for the other before writing it.
_RACER = """
import json, os, sys, time
from trainer.contract import production_pointer
from trainer.storage import open_storage
from trainops.registry.promotion import ProductionMovedError, promote
root, run, me, other = sys.argv[1:5]
storage = open_storage(root)
pointer_uri = production_pointer(root, "demo-lm")

class Racer:
    def put_json(self, uri, obj, **conditions):
        if uri == pointer_uri and not os.path.exists(me):
            open(me, "w").close()
            deadline = time.monotonic() + 30
            while not os.path.exists(other) and time.monotonic() < deadline:
                time.sleep(0.001)
        return storage.put_json(uri, obj, **conditions)
    def __getattr__(self, name):
        return getattr(storage, name)

try:
    out = promote(Racer(), root, "demo-lm", export_uri=run + "/export", card={"run_uri": run},
                  expected_production_version=1)
    print(json.dumps({"won": out["version"]}))
except ProductionMovedError as exc:
    print(json.dumps({"moved": [exc.expected_version, exc.current_version]}))
"""


def test_two_processes_racing_on_file_storage_one_wins(file_root, tmp_path):
    storage = open_storage(file_root)
    do_promote(storage, file_root, make_run(storage, file_root, "base"), None)
    runs = [make_run(storage, file_root, f"proc-{i}") for i in range(2)]
    flags = [str(tmp_path / "ready-0"), str(tmp_path / "ready-1")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(REPO, "plugins"), REPO])}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, file_root, run, mine, theirs],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        for run, mine, theirs in zip(runs, flags, reversed(flags), strict=False)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        results.append(json.loads(out))
    winners = [(r["won"], run) for r, run in zip(results, runs, strict=False) if "won" in r]
    assert len(winners) == 1, results
    [(version, run)] = winners
    assert [r["moved"] for r in results if "moved" in r] == [[1, version]]
    pointer = read_production(storage, file_root, "demo-lm")
    assert (pointer["version"], pointer["run_uri"]) == (version, run)
    assert [h["version"] for h in pointer["history"]] == [1, version]


def test_twenty_thread_races_on_s3_each_have_exactly_one_winner(s3_root):
    storage = open_storage(s3_root)
    run_a = make_run(storage, s3_root, "a", small=True)
    run_b = make_run(storage, s3_root, "b", small=True)
    for i in range(20):
        name = f"race-{i}"
        outcomes = race_threads(storage, s3_root, [run_a, run_b], None, name=name)
        assert_one_winner(storage, s3_root, outcomes, [run_a, run_b], name=name)
        assert len(read_production(storage, s3_root, name)["history"]) == 1


# ----------------------------------------------------------------- promotion with a re-gate


def test_production_that_moved_before_promotion_started_is_regated_before_copying(file_root):
    storage = open_storage(file_root)
    _, mine, rival, my_gate, rival_gate = two_candidates_gated_against_v1(storage, file_root, 2.9, 2.5)
    promote_candidate(storage, file_root, rival, rival_gate)
    with pytest.raises(RegateRejected, match="moved from v1 to v2"):
        promote_candidate(storage, file_root, mine, my_gate)
    # Refused before a version was claimed: no files copied, no number spent.
    assert version_numbers(storage, file_root, "demo-lm") == [1, 2]


def test_retry_of_a_regated_promotion_reports_it_instead_of_promoting_twice(file_root):
    storage = open_storage(file_root)
    _, mine, rival, my_gate, rival_gate = two_candidates_gated_against_v1(storage, file_root, 2.5, 2.8)
    first = promote_candidate(rival_first(storage, file_root, rival, rival_gate), file_root, mine, my_gate)
    again = promote_candidate(storage, file_root, mine, my_gate)
    assert (again["version"], again["previous_version"]) == (first["version"], 3)
    assert version_numbers(storage, file_root, "demo-lm") == [1, 2, 3]


# ------------------------------------------------------------- concurrent promotions, many times

PROMOTERS = 4


def race_round(storage, root: str, model: str, losses: list[float]):
    """Promote one base version, then ``losses`` candidates at once, all gated against it.

    Every promoter reads the pointer before any writes it (a barrier at the first pointer
    write), so every round has a real compare-and-swap collision.
    """
    base = Candidate(storage, root, f"{model}-base", 3.0)
    promote_candidate(storage, root, base, gate_for(storage, base, None, None, model), model)
    cands = [Candidate(storage, root, f"{model}-{i}", loss) for i, loss in enumerate(losses)]
    gates = [gate_for(storage, c, base, 1, model) for c in cands]
    assert all(g["approved"] for g in gates)
    barrier = threading.Barrier(len(cands))
    pointer_uri = production_pointer(root, model)

    def one(i):
        racer = BeforePointerWrite(storage, pointer_uri, lambda: barrier.wait(timeout=30))
        try:
            return promote_candidate(racer, root, cands[i], gates[i], model)
        except RegateRejected as exc:
            return exc

    with ThreadPoolExecutor(len(cands)) as pool:
        return base, cands, list(pool.map(one, range(len(cands))))


def check_round(storage, root: str, model: str, base, cands, outcomes) -> dict:
    """Assert the invariants of one round; return its counts."""
    promoted = {i: r for i, r in enumerate(outcomes) if isinstance(r, dict)}
    stopped = {i: r for i, r in enumerate(outcomes) if isinstance(r, RegateRejected)}
    assert len(promoted) + len(stopped) == len(cands), outcomes
    winners = [i for i, r in promoted.items() if not r["regated_against"]]
    assert len(winners) == 1, outcomes
    assert promoted[winners[0]]["previous_version"] == 1
    # No lost update: the history is the base plus every promotion, each once, and each
    # promotion moved the pointer from the entry before it.
    history = read_production(storage, root, model)["history"]
    assert [h["run_uri"] for h in history[:1]] == [base.run_uri]
    by_version = {r["version"]: (i, r) for i, r in promoted.items()}
    assert sorted(h["version"] for h in history[1:]) == sorted(by_version)
    loss_of = {1: base.loss}
    for before, entry in itertools.pairwise(history):
        i, result = by_version[entry["version"]]
        assert entry["run_uri"] == cands[i].run_uri
        assert result["previous_version"] == before["version"]
        assert result["regated_against"][-1:] in ([], [before["version"]])
        # Re-gated against what was production then, with no_regression at tolerance 0.
        assert cands[i].loss <= loss_of[before["version"]]
        loss_of[entry["version"]] = cands[i].loss
    # Version numbers are unique: one per promoter and the base, claimed once each.
    assert version_numbers(storage, root, model) == list(range(1, len(cands) + 2))
    for i, exc in stopped.items():
        against = exc.decision["production_version"]
        assert re.fullmatch(
            rf"production of '{model}' moved from v\d+ to v{against} while this run was gated; "
            rf"re-gated against v{against}, the candidate fails: no regression .*",
            str(exc),
        )
        assert cands[i].loss > loss_of[against]
    return {"promoted": len(promoted), "stopped": len(stopped)}


def run_races(root: str, rounds: int) -> list[dict]:
    storage = open_storage(root)
    counts = []
    for n in range(rounds):
        model = f"race-{n}"
        # Even rounds: every candidate ties the base and each other, so all pass every
        # re-gate. Odd rounds: distinct losses, so whoever loses to a better model stops.
        losses = [3.0] * PROMOTERS if n % 2 == 0 else random.Random(n).sample([2.9, 2.8, 2.7, 2.6], PROMOTERS)
        base, cands, outcomes = race_round(storage, root, model, losses)
        count = check_round(storage, root, model, base, cands, outcomes)
        if n % 2 == 0:
            assert count == {"promoted": PROMOTERS, "stopped": 0}
        counts.append(count)
    return counts


def test_twenty_rounds_of_four_concurrent_promotions_on_s3(s3_root):
    started = time.monotonic()
    counts = run_races(s3_root, 20)
    elapsed = time.monotonic() - started
    promoted = sum(c["promoted"] for c in counts)
    stopped = sum(c["stopped"] for c in counts)
    print(
        f"s3 (moto over HTTP): 20 rounds x {PROMOTERS} promoters: 20 first-try winners, "
        f"{promoted - 20} promoted after re-gate, {stopped} stopped, {elapsed:.1f}s"
    )
    assert promoted + stopped == 20 * PROMOTERS
    assert stopped > 0  # the odd rounds exercise rejection on re-gate


def test_twenty_rounds_of_four_concurrent_promotions_on_file_storage(file_root):
    counts = run_races(file_root, 20)
    assert sum(c["promoted"] + c["stopped"] for c in counts) == 20 * PROMOTERS
