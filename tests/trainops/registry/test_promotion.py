"""Promotion on real storage: file:// and s3:// (moto over HTTP)."""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import trainops
from tests.trainops.registry.helpers import (
    CHECKS,
    STRICT_CHECKS,
    BeforePointerWrite,
    Candidate,
    KeyFaults,
    OutageAfterWrite,
    card_for,
    do_promote,
    gate_for,
    make_run,
    promote_candidate,
    rival_first,
    two_candidates_gated_against_v1,
)
from trainer.contract import join, model_version_prefix, production_pointer, safe_segment
from trainer.storage import StorageUnavailable, open_storage
from trainops.registry.model_readme import render
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
from trainops.registry.rollback import rollback

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
        "production_version": 1,
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


@pytest.mark.parametrize("reserved", ["card.json", "README.md", "_claim.json"])
def test_an_export_holding_a_name_promotion_writes_is_refused_and_abandoned(file_root, reserved):
    storage = open_storage(file_root)
    run = make_run(storage, file_root)
    storage.put(join(run, "export", reserved), b"the export's own")
    with pytest.raises(PromotionError, match=rf"contains '{re.escape(reserved)}', a name promotion reserves"):
        do_promote(storage, file_root, run, None)
    assert read_production(storage, file_root, "demo-lm") is None
    v1 = model_version_prefix(file_root, "demo-lm", 1)
    assert storage.list(v1) == [join(v1, "_claim.json")]


def test_each_version_has_a_readme_model_card_rendered_from_its_card(file_root):
    storage = open_storage(file_root)
    result = do_promote(storage, file_root, make_run(storage, file_root), None)
    readme = storage.get(join(result["version_uri"], "README.md")).decode()
    card = storage.get_json(result["card_uri"])
    assert readme == render(card)
    assert readme.startswith("---\nlibrary_name: transformers\npipeline_tag: text-generation\n")
    assert "# demo-lm v1" in readme and "Trained from scratch" in readme
    # the card lists the export's files; the README names them and the two promotion adds
    assert {f["path"] for f in card["files"]} == {"model.safetensors", "tokenizer/vocab.json"}
    assert "- `README.md`" in readme and "- `tokenizer/vocab.json`" in readme


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


@pytest.mark.slow
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


def race_round(storage, root: str, model: str, losses: list[float], checks: list[dict] = CHECKS):
    """Promote one base version, then ``losses`` candidates at once, all gated against it.

    Every promoter reads the pointer before any writes it (a barrier at the first pointer
    write), so every round has a real compare-and-swap collision.
    """
    base = Candidate(storage, root, f"{model}-base", 3.0)
    promote_candidate(storage, root, base, gate_for(storage, base, None, None, model, checks), model)
    cands = [Candidate(storage, root, f"{model}-{i}", loss) for i, loss in enumerate(losses)]
    gates = [gate_for(storage, c, base, 1, model, checks) for c in cands]
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


def check_round(storage, root: str, model: str, base, cands, outcomes, *, strict: bool = False) -> dict:
    """Assert the invariants of one round; return its counts.

    :param strict: the round's gate asks for strict improvement (``STRICT_CHECKS``), not for
        no regression at tolerance 0 (``CHECKS``).
    """
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
        # Re-gated against what was production then.
        if strict:
            assert cands[i].loss < loss_of[before["version"]]
        else:
            assert cands[i].loss <= loss_of[before["version"]]
        loss_of[entry["version"]] = cands[i].loss
    # Version numbers are unique: one per promoter and the base, claimed once each.
    assert version_numbers(storage, root, model) == list(range(1, len(cands) + 2))
    failing = STRICT_CHECKS[0]["name"] if strict else "no regression"
    for i, exc in stopped.items():
        against = exc.decision["production_version"]
        assert re.fullmatch(
            rf"production of '{model}' moved from v\d+ to v{against} while this run was gated; "
            rf"re-gated against v{against}, the candidate fails: {failing} .*",
            str(exc),
        )
        assert cands[i].loss >= loss_of[against] if strict else cands[i].loss > loss_of[against]
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


@pytest.mark.slow
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


# ------------------------------------------------------------- lost replies, over HTTP through the proxy


def strict_pair(storage, root: str, mine_loss: float, rival_loss: float | None = None):
    """A base v1 (loss 3.0) and candidates gated against it with a strict-improvement gate."""
    base = Candidate(storage, root, "base", 3.0)
    promote_candidate(storage, root, base, gate_for(storage, base, None, None, checks=STRICT_CHECKS))
    mine = Candidate(storage, root, "mine", mine_loss)
    my_gate = gate_for(storage, mine, base, 1, checks=STRICT_CHECKS)
    if rival_loss is None:
        return mine, my_gate, None, None
    rival = Candidate(storage, root, "rival", rival_loss)
    return mine, my_gate, rival, gate_for(storage, rival, base, 1, checks=STRICT_CHECKS)


def assert_every_version_in_history_is_whole(storage, root: str, model: str = "demo-lm") -> list:
    """Each version the pointer names has its card and the weights of the run it came from."""
    pointer = read_production(storage, root, model)
    for entry in pointer["history"]:
        version_uri = model_version_prefix(root, model, entry["version"])
        card = storage.get_json(join(version_uri, "card.json"))
        assert card["run_uri"] == entry["run_uri"]
        name = entry["run_uri"].rstrip("/").split("/")[-2]
        assert storage.get(join(version_uri, "model.safetensors")) == f"weights {name}".encode()
    return [(h["version"], h["action"], h["run_uri"]) for h in pointer["history"]]


def test_a_lost_reply_to_the_pointer_write_with_a_strict_regate_keeps_production_whole(
    faulty_s3_root, s3_faults, monkeypatch
):
    """The defect as filed: the compare-and-swap of production.json succeeds at S3 and its reply
    is lost. The old client's retry got 412 and took the write for a rival's; the candidate was
    re-gated against itself, a strict gate rejected it, and the version production now pointed
    at was abandoned, its weights deleted, the task skipped."""
    root = faulty_s3_root
    storage = open_storage(root)
    mine, my_gate, _, _ = strict_pair(storage, root, 2.8)
    faults = KeyFaults(s3_faults, monkeypatch, "models/demo-lm/production.json", actions={1: "reset_after"})

    result = promote_candidate(storage, root, mine, my_gate)

    assert faults.puts == 2  # the write, its reply lost, and the client's retry
    assert (result["version"], result["previous_version"], result["production_version"]) == (2, 1, 2)
    assert result["regated_against"] == []
    assert assert_every_version_in_history_is_whole(storage, root) == [
        (1, "promote", join(root, "runs", "retrain", "base", "train")),
        (2, "promote", mine.run_uri),
    ]
    assert "regates" not in storage.get_json(my_gate["gate_uri"])  # never re-gated against itself


def test_a_write_reported_lost_after_a_rival_moved_on_is_reported_as_promoted_and_kept(
    faulty_s3_root, s3_faults, moto_server, monkeypatch
):
    """What the write token cannot tell: the pointer write took effect, its reply was lost, and
    before the client's retry a rival promoted on top of it, so the read-back finds the rival's
    token and the client reports PreconditionFailed. Before the history was consulted, the
    promotion re-gated against the rival, was rejected, and deleted the weights of a version the
    history names (a rollback target), reporting it as not promoted."""
    root = faulty_s3_root
    storage = open_storage(root)
    direct = open_storage(root, endpoint_url=moto_server)  # the rival's own client, no proxy
    mine, my_gate, rival, rival_gate = strict_pair(storage, root, 2.8, 2.5)
    KeyFaults(
        s3_faults,
        monkeypatch,
        "models/demo-lm/production.json",
        actions={1: "reset_after"},
        before={2: lambda: promote_candidate(direct, root, rival, rival_gate)},
    )

    result = promote_candidate(storage, root, mine, my_gate)

    # v2 was production (the rival re-gated against it, and moved production on to v3).
    assert (result["version"], result["previous_version"], result["production_version"]) == (2, 1, 3)
    assert assert_every_version_in_history_is_whole(storage, root) == [
        (1, "promote", join(root, "runs", "retrain", "base", "train")),
        (2, "promote", mine.run_uri),
        (3, "promote", rival.run_uri),
    ]
    assert "abandoned_at" not in storage.get_json(
        join(model_version_prefix(root, "demo-lm", 2), "_claim.json")
    )
    back = rollback(storage, root, "demo-lm", 2, reason="the rival regressed", by="alice")
    assert (back["changed"], back["previous_version"]) == (True, 3)


def test_a_promotion_whose_pointer_write_failed_in_doubt_is_found_in_the_pointer(file_root):
    """The storage client gave up (outage) after the pointer write took effect: the promotion
    reads the pointer before abandoning anything, and reports the promotion it finds there."""
    storage = open_storage(file_root)
    mine, my_gate, _, _ = strict_pair(storage, file_root, 2.8)
    outage = OutageAfterWrite(storage, production_pointer(file_root, "demo-lm"))

    result = promote_candidate(outage, file_root, mine, my_gate)

    assert outage.failed == 1
    assert (result["version"], result["previous_version"]) == (2, 1)
    assert [v for v, *_ in assert_every_version_in_history_is_whole(storage, file_root)] == [1, 2]


def test_a_failed_promotion_keeps_its_files_when_the_pointer_cannot_be_read(file_root):
    storage = open_storage(file_root)
    mine, my_gate, _, _ = strict_pair(storage, file_root, 2.8)
    pointer_uri = production_pointer(file_root, "demo-lm")
    outage = OutageAfterWrite(storage, pointer_uri, took_effect=False, then_unreadable=True)

    with pytest.raises(StorageUnavailable):
        promote_candidate(outage, file_root, mine, my_gate)

    # Nothing was known about the pointer, so nothing was deleted or marked abandoned.
    v2 = model_version_prefix(file_root, "demo-lm", 2)
    assert storage.get(join(v2, "model.safetensors")) == b"weights mine"
    assert "abandoned_at" not in storage.get_json(join(v2, "_claim.json"))
    assert read_production(storage, file_root, "demo-lm")["version"] == 1


# ------------------------------------------------- forty promotions with a fifth of the replies lost

LOSSY_ROUNDS = 10  # x PROMOTERS = 40 promotions, besides each round's base


def check_registry(storage, root: str, model: str, cands) -> dict:
    """What a user relies on, whatever replies were lost; returns what was measured.

    - production, and every version the history names, has its card and the weights of the
      run the history says it came from;
    - no run appears twice in the history;
    - versions have no gaps: every number from 1 to the highest is claimed, by one promotion
      each (no run holds two claims), and every claimed version is either in the history or
      abandoned with its reason and only its claim left.
    """
    history = assert_every_version_in_history_is_whole(storage, root, model)
    runs = [run for _, action, run in history if action == "promote"]
    assert len(runs) == len(set(runs)), history
    numbers = version_numbers(storage, root, model)
    assert numbers == list(range(1, len(numbers) + 1)), numbers
    claimed_by = []
    named = {v for v, _, _ in history}
    for v in numbers:
        version_uri = model_version_prefix(root, model, v)
        claim = storage.get_json(join(version_uri, "_claim.json"))
        claimed_by.append(claim["run_uri"])
        if v not in named:
            assert claim["reason"] and claim["abandoned_at"], claim
            assert storage.list(version_uri) == [join(version_uri, "_claim.json")]
    assert len(claimed_by) == len(set(claimed_by)), claimed_by
    return {"versions": len(numbers), "abandoned": len(numbers) - len(named)}


def check_rollbacks(storage, root: str, model: str, n: int) -> int:
    """Roll back to v1, then again (nothing to change), then forward; every report must be what
    the pointer shows. Returns how many reports were checked."""
    before = read_production(storage, root, model)
    back = rollback(storage, root, model, 1, reason=f"round {n}", by="ops")
    after = read_production(storage, root, model)
    assert (back["changed"], back["previous_version"], back["production_version"]) == (
        True,
        before["version"],
        1,
    )
    assert after["version"] == 1 and len(after["history"]) == len(before["history"]) + 1
    assert (after["history"][-1]["from_version"], after["history"][-1]["at"]) == (
        before["version"],
        back["at"],
    )
    again = rollback(storage, root, model, 1, reason=f"round {n}", by="ops")
    assert (again["changed"], again["since"]) == (False, after["history"][-1])
    assert read_production(storage, root, model) == after
    forward = rollback(storage, root, model, before["version"], reason=f"round {n}, forward", by="ops")
    assert (forward["changed"], forward["previous_version"]) == (True, 1)
    assert len(read_production(storage, root, model)["history"]) == len(after["history"]) + 1
    return 3


@pytest.mark.slow
def test_forty_promotions_with_a_fifth_of_the_replies_lost_keep_the_registry_true(
    faulty_s3_root, s3_faults, caplog
):
    """Forty concurrent promotions (10 rounds of 4 promoters racing from the same version) and
    three rollbacks a round, over moto's S3 through the fault proxy, with 20% of the writes'
    replies (PUT, COPY, DELETE) lost after S3 performed them. Even rounds tie with no regression
    allowed, so every re-gate accepts; odd rounds ask for strict improvement on every slice, so
    a promoter re-gated against a better model is rejected (and one re-gated against itself
    would be)."""
    root = faulty_s3_root
    storage = open_storage(root)
    s3_faults.inject(reset_after=0.2, ops={"PUT", "COPY", "DELETE"}, seed=12)
    caplog.set_level(logging.INFO, logger="trainer.storage")
    caplog.set_level(logging.INFO, logger="trainops.registry.pointer")
    started = time.monotonic()
    counts = []
    reports = 0
    for n in range(LOSSY_ROUNDS):
        model = f"lossy-{n}"
        strict = n % 2 == 1
        losses = random.Random(n).sample([2.9, 2.8, 2.7, 2.6], PROMOTERS) if strict else [3.0] * PROMOTERS
        base, cands, outcomes = race_round(storage, root, model, losses, STRICT_CHECKS if strict else CHECKS)
        count = check_round(storage, root, model, base, cands, outcomes, strict=strict)
        count.update(check_registry(storage, root, model, cands))
        reports += check_rollbacks(storage, root, model, n)
        check_registry(storage, root, model, cands)
        counts.append(count)
    elapsed = time.monotonic() - started
    lost = [e for e in s3_faults.events if e.action == "reset_after"]
    # Replies lost after S3 performed the write (the rest were refusals: a claim or a
    # compare-and-swap that lost its race, whose 412 never arrived).
    performed = [e for e in lost if e.status is not None and e.status < 300]
    on_pointer = sum(e.target.split("?")[0].endswith("/production.json") for e in performed)
    on_claims = sum(e.target.split("?")[0].endswith("/_claim.json") for e in performed)
    writes = sum(1 for e in s3_faults.events if e.op in ("PUT", "COPY", "DELETE"))
    promoted = sum(c["promoted"] for c in counts)
    stopped = sum(c["stopped"] for c in counts)
    messages = [r.getMessage() for r in caplog.records]
    by_token = sum("carries its write token" in m for m in messages)
    by_history = sum("already records this" in m for m in messages)
    print(
        f"{LOSSY_ROUNDS * PROMOTERS} promotions ({promoted} promoted, {stopped} rejected on re-gate) "
        f"and {reports} rollback reports over S3 with {len(lost)} of {writes} write replies lost, "
        f"{len(performed)} of them after the write took effect ({on_pointer} on production.json, "
        f"{on_claims} on claims; {by_token} conditional writes recognised by "
        f"their token, {by_history} pointer moves by the history): production always whole, "
        f"0 runs twice in a history, {sum(c['versions'] for c in counts)} versions without a gap "
        f"({sum(c['abandoned'] for c in counts)} abandoned with their reason), {reports} of "
        f"{reports} rollback reports true; {elapsed:.1f}s"
    )
    assert promoted + stopped == LOSSY_ROUNDS * PROMOTERS
    assert stopped > 0 and on_pointer > 0 and on_claims > 0  # every hazard was exercised


# ------------------------------------------------------------- one registry per model name


@pytest.mark.parametrize(
    "names",
    [("fraud model", "fraud_model", "fraud/model"), ("модель", "данные"), ("a" * 128, "a" * 127 + "b")],
    ids=["ascii", "cyrillic", "longest"],
)
def test_names_that_once_shared_a_folder_each_promote_into_a_registry_of_their_own(root, names):
    storage = open_storage(root)
    for name in names:
        result = do_promote(
            storage, root, make_run(storage, root, f"run-{names.index(name)}"), None, name=name
        )
        assert (result["version"], result["previous_version"]) == (1, None)
    for i, name in enumerate(names):
        pointer = read_production(storage, root, name)
        assert (pointer["model"], pointer["version"], len(pointer["history"])) == (name, 1, 1)
        card = storage.get_json(join(model_version_prefix(root, name, 1), "card.json"))
        assert (card["model"], card["run_uri"]) == (name, join(root, "runs", "retrain", f"run-{i}", "train"))
        assert version_numbers(storage, root, name) == [1]


def legacy_registry(storage, root: str) -> str:
    """``fraud model``'s registry as trainops before #25 wrote it: in ``models/fraud_model/``,
    the folder of the name ``fraud_model`` now."""
    do_promote(storage, root, make_run(storage, root, "old"), None, name="fraud_model")
    for uri in storage.list(join(root, "models", "fraud_model")):
        if uri.endswith(("/production.json", "/_claim.json", "/card.json")):
            storage.put_json(uri, {**storage.get_json(uri), "model": "fraud model"})
    return production_pointer(root, "fraud_model")


def test_promoting_a_name_whose_folder_holds_another_models_registry_is_refused(file_root):
    storage = open_storage(file_root)
    pointer_uri = legacy_registry(storage, file_root)
    before = {uri: storage.get(uri) for uri in storage.list(join(file_root, "models"))}
    run = make_run(storage, file_root, "new")

    with pytest.raises(PromotionError) as refused:
        do_promote(storage, file_root, run, 1, name="fraud_model")

    assert str(refused.value) == (
        f"{pointer_uri} records model 'fraud model', not 'fraud_model': this folder is 'fraud model''s "
        "registry (trainops before #25 gave both names this folder; it now looks for 'fraud model''s in "
        f"{file_root}/models/{safe_segment('fraud model')}/), so 'fraud_model' may not use it; nothing "
        "was changed. Give 'fraud_model' another name, or move 'fraud model''s registry out of this folder "
        "first"
    )
    assert {uri: storage.get(uri) for uri in storage.list(join(file_root, "models"))} == before


def test_a_registry_left_in_its_old_folder_is_named_not_replaced_by_a_second_one(file_root):
    """After the upgrade ``fraud model`` maps to a folder of its own; its registry is still in
    ``fraud_model/``. A promotion would start it again at v1, a warm start from production
    would train from scratch: both are refused, saying where it is and how to move it."""
    from trainops.registry.errors import LegacyRegistry
    from trainops.registry.pointer import read_production

    storage = open_storage(file_root)
    legacy_registry(storage, file_root)
    before = {uri: storage.get(uri) for uri in storage.list(join(file_root, "models"))}
    models, new = join(file_root, "models"), safe_segment("fraud model")

    with pytest.raises(LegacyRegistry) as refused:
        do_promote(storage, file_root, make_run(storage, file_root, "new"), None, name="fraud model")
    assert str(refused.value) == (
        f"model 'fraud model' has no registry in {models}/{new}/ yet, but its registry from before trainops "
        f"mapped names injectively is in {models}/fraud_model/ (a folder another name, 'fraud_model', "
        f"could claim): nothing was read or changed. Copy that folder's objects to {models}/{new}/ (for "
        f"example `aws s3 sync {models}/fraud_model/ {models}/{new}/`, or `cp -a` on file://), keep the old "
        "folder (its versions' URIs stay in the history), then run again"
    )
    with pytest.raises(LegacyRegistry):
        read_production(storage, file_root, "fraud model")  # what init.from: auto reads
    assert {uri: storage.get(uri) for uri in storage.list(join(file_root, "models"))} == before

    shutil.copytree(
        join(models, "fraud_model").removeprefix("file://"), join(models, new).removeprefix("file://")
    )
    assert read_production(storage, file_root, "fraud model")["version"] == 1
    do_promote(storage, file_root, make_run(storage, file_root, "moved"), 1, name="fraud model")
    assert storage.get_json(production_pointer(file_root, "fraud model"))["version"] == 2


def test_a_registry_with_no_pointer_belongs_to_the_model_of_its_newest_claim(file_root):
    storage = open_storage(file_root)
    allocate_version(storage, file_root, "fraud_model", claim={"run_uri": "file:///r/runs/x"})
    claim_uri = join(model_version_prefix(file_root, "fraud_model", 1), "_claim.json")
    storage.put_json(claim_uri, {**storage.get_json(claim_uri), "model": "fraud model"})
    with pytest.raises(PromotionError, match=rf"^{re.escape(claim_uri)} records model 'fraud model', not"):
        do_promote(storage, file_root, make_run(storage, file_root), None, name="fraud_model")
    assert version_numbers(storage, file_root, "fraud_model") == [1]


def test_a_name_that_is_not_one_is_refused_before_anything_is_written(file_root):
    storage = open_storage(file_root)
    run = make_run(storage, file_root)
    with pytest.raises(ValueError, match=r"model name 'xxxx.*is 300 characters long; at most 128"):
        do_promote(storage, file_root, run, None, name="x" * 300)
    assert storage.list(join(file_root, "models")) == []


# ------------------------------------------------------------- a promotion killed part way

_KILLED = """
import json, os, signal, sys
from trainer.storage import FileStorage, open_storage
from trainops.registry.promotion import promote
root, run, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
calls = [0]

def counted(method):
    def call(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # as a lost node or the OOM killer: no cleanup
        return method(self, *args, **kwargs)
    return call

# Every storage call, and _commit: between a write's temp file and its rename.
for name in ("put", "get_with_etag", "head", "list", "delete", "delete_prefix", "copy", "_commit"):
    setattr(FileStorage, name, counted(getattr(FileStorage, name)))
out = promote(open_storage(root), root, "demo-lm", export_uri=run + "/export", card={"run_uri": run},
              expected_production_version=1)
print(json.dumps({"version": out["version"], "calls": calls[0]}))
"""


def run_promotion(root: str, run: str, kill_at: int) -> subprocess.CompletedProcess:
    """Promote ``run`` in a process of its own, killed with SIGKILL at its ``kill_at``-th storage
    call (0: never)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(REPO, "plugins"), REPO])}
    return subprocess.run(
        [sys.executable, "-c", _KILLED, root, run, str(kill_at)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.mark.parametrize("seed", range(8))
def test_a_promotion_killed_at_any_point_then_run_again_leaves_one_whole_version(file_root, seed):
    """SIGKILL at a random storage call (twice: the rerun may be killed while it sweeps), then a
    rerun: production is the run's version, under the next number, with exactly the export's
    files, and nothing else is left under models/ (no partial version, no temp file)."""
    storage = open_storage(file_root)
    do_promote(storage, file_root, make_run(storage, file_root, "base"), None)
    run = make_run(storage, file_root, "mine")
    clean = run_promotion(file_root, make_run(storage, file_root, "probe"), 0)  # counts the calls
    assert clean.returncode == 0, clean.stderr
    rollback(storage, file_root, "demo-lm", 1, reason="the probe only counted calls", by="test")
    calls = json.loads(clean.stdout)["calls"]
    rng = random.Random(seed)
    kills = [rng.randint(1, calls), rng.randint(1, calls)]

    outcomes = [run_promotion(file_root, run, kill_at).returncode for kill_at in kills]
    final = run_promotion(file_root, run, 0)

    assert final.returncode == 0, final.stderr
    assert -9 in outcomes, outcomes
    version = json.loads(final.stdout)["version"]
    assert version == 3  # v1 base, v2 the probe: the killed tries took no number of their own
    pointer = read_production(storage, file_root, "demo-lm")
    assert (pointer["version"], pointer["run_uri"]) == (3, run)
    assert [h["run_uri"] for h in pointer["history"] if h["action"] == "promote"].count(run) == 1
    assert version_numbers(storage, file_root, "demo-lm") == [1, 2, 3]
    models = file_root[len("file://") :] + "/models/demo-lm"
    files = sorted(
        os.path.relpath(os.path.join(d, f), models)
        for d, _, fs in os.walk(models)
        for f in fs
        if not f.endswith(".trainops-lock")
    )
    whole = ["README.md", "_claim.json", "card.json", "model.safetensors", "tokenizer/vocab.json"]
    # A kill inside the write of the pointer, or of a claim that never landed, leaves that write's
    # temp file (the file:// client's: a few hundred bytes of JSON, never read). Nothing of the
    # weights, card or model card is left anywhere: the sweep deletes those with their version.
    json_temp = r"(versions/\d+/)?\.(production|_claim)\.json\.tmp-[0-9a-f]{32}"
    assert [f for f in files if not re.fullmatch(json_temp, f)] == sorted(
        ["production.json", *[f"versions/{v}/{name}" for v in (1, 2, 3) for name in whole]]
    ), files
    assert storage.get(join(model_version_prefix(file_root, "demo-lm", 3), "model.safetensors")) == (
        b"weights of mine"
    )
