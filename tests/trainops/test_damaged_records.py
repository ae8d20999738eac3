"""A damaged or foreign ``job.json``, ``card.json``, production pointer or dataset manifest,
through every report page and every command that reads it: a message that names the file, the
field and what was expected; never a 500, never a traceback.

The fuzz replaces one field at a time (every top-level field, and the nested fields the pages
and commands read) by a value of another JSON type, then reads the record the way a person
does: the report app through Airflow's API server (as ``tests/trainops/reports/test_app.py``),
the commands in this process (two of them once as ``python -m trainops``, for the exit status
and stderr a shell sees).
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.trainops.cost.fixtures import one_preemption_job
from tests.trainops.registry.helpers import promote_runs
from tests.trainops.reports.helpers import main_text
from tests.trainops.reports.test_app import bearer, get
from tests.trainops.reports.test_card_page import CARD
from trainer.contract import RunLayout, join, metrics_part_name, model_version_prefix, production_pointer
from trainer.storage import open_storage
from trainops.cli.main import main

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# One value of every JSON type (NaN too: json writes and reads it), each put in place of a field.
WRONG = (None, 7, "x", [1], {"a": 1}, True, float("nan"))
# Fields whose insides no page or command reads: only their own type is checked.
JOB_OPAQUE = {"job", "args", "spec", "manifests", "nodes"}
CARD_OPAQUE = {"config", "eval_basis", "check_definitions"}
MESSAGE = re.compile(r"(\S+): field '([^']*)' should be ")


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


def _field(path: tuple) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _paths(value: object, opaque: set[str], path: tuple = ()) -> Iterator[tuple]:
    """Every key of every object and the first item of every list, not inside ``opaque``."""
    if isinstance(value, dict):
        items: list = list(value.items())
    elif isinstance(value, list):
        items = list(enumerate(value[:1]))
    else:
        return
    for key, inner in items:
        yield (*path, key)
        if key not in opaque:
            yield from _paths(inner, opaque, (*path, key))


def mutations(record: dict, opaque: set[str]) -> Iterator[tuple[str, object, dict | list, bool]]:
    """``(field, wrong value, damaged record, must be refused)`` for each field and wrong value:
    one of another JSON type than the field's (null aside: many fields may be null) must be.
    A wrong list or object may be refused for a field inside it (``attempts[0]`` for ``[1]``)."""
    for path in _paths(record, opaque):
        original = record
        for part in path:
            original = original[part]
        inside_opaque = any(part in opaque for part in path[:-1])
        for wrong in WRONG:
            damaged = copy.deepcopy(record)
            target = damaged
            for part in path[:-1]:
                target = target[part]
            target[path[-1]] = wrong
            must = (
                wrong is not None
                and original is not None  # a field that may be null: its type is not known here
                and _json_type(wrong) != _json_type(original)
                and not inside_opaque
            )
            yield _field(path), wrong, damaged, must


def _check_message(text: str, uri: str, field: str, must: bool, where: str) -> list[str]:
    """What is wrong with how ``text`` told of the damage to ``field`` of ``uri`` (nothing: [])."""
    found = MESSAGE.findall(text)
    if must and not found:
        return [f"{where}: {field}: no message naming the field in {text[:300]!r}"]
    if found and (found[0][0] != uri or not re.fullmatch(re.escape(field) + r"([.\[].*)?", found[0][1])):
        return [f"{where}: {field}: the message names {found[0]}, not {(uri, field)}"]
    return []


def full_job(run_uri: str) -> dict:
    """A finished run's job.json with every field the pages and commands read: two attempts
    (a preemption, then success), its bill, its Airflow ids and budget window."""
    from tests.trainops.cost.fixtures import FIXTURE_PRICES
    from trainops.cost.accounting import account

    job, metrics = one_preemption_job()
    job = {**job, "run_uri": run_uri, "config_uri": join(run_uri, "config.yaml")}
    cost = dict(account(job, metrics, FIXTURE_PRICES))
    airflow = {"dag_id": "retrain", "run_id": "r1", "task_id": "train", "map_index": -1}
    return json.loads(json.dumps({**job, "cost": cost, "airflow": airflow}))


def full_card() -> dict:
    """A model card with every field the card page and rollback read."""
    card = copy.deepcopy(CARD)
    card["gate"]["regates"] = [
        {"production_version": 2, "moved_from": 1, "approved": True, "reason": "re-gated"}
    ]
    card["gate"]["check_definitions"] = [{"kind": "threshold", "metric": "eval_loss", "max": 3.5}]
    card["metrics"]["candidate"]["slices"] = {"source": {"web": {"eval_loss": 1.2, "tokens": 9000}}}
    card["metrics"]["production"]["slices"] = {"source": {"web": {"eval_loss": 1.4, "tokens": 9000}}}
    card["training_cost"].update(
        savings=0.78, billed_gpu_hours=0.5, productive_gpu_hours=0.25, lost_gpu_hours=0.1, job_uri=None
    )
    card["promoted_by"] = {"user": "ada", "trigger": "manual", "run_id": "r3"}
    card["preemptions_survived"], card["steps"] = 1, 120
    return card


@pytest.fixture(scope="module")
def api(airflow_db):
    """``(client, auth manager)`` for Airflow's API app with the trainops plugin mounted."""
    from airflow.api_fastapi.app import create_app, get_auth_manager
    from fastapi.testclient import TestClient

    return TestClient(create_app(apps="core")), get_auth_manager()


@pytest.fixture
def root(file_root, monkeypatch):
    monkeypatch.setenv("TRAINOPS_STORAGE_ROOT", file_root)
    monkeypatch.delenv("TRAINOPS_REPORT_ROOTS", raising=False)
    return file_root


def _answered(response, where: str) -> list[str]:
    if response.status_code not in (200, 422) or "Traceback" in response.text:
        return [f"{where}: HTTP {response.status_code}: {response.text[:300]!r}"]
    return []


# ----------------------------------------------------------------------------- report pages


@pytest.mark.slow
def test_a_damaged_job_json_is_a_message_on_its_report_page_never_a_500(api, root):
    storage = open_storage(root)
    layout = RunLayout(join(root, "runs", "retrain", "r1", "train"))
    job = full_job(layout.run_uri)
    problems, refused = [], 0
    for field, wrong, damaged, must in mutations(job, JOB_OPAQUE):
        storage.put(layout.job, json.dumps(damaged).encode())
        response = get(api, layout.job)
        where = f"report page, {field} = {wrong!r}"
        problems += _answered(response, where)
        problems += _check_message(main_text(response.text), layout.job, field, must, where)
        refused += bool(MESSAGE.search(main_text(response.text)))
    assert problems == []
    assert refused > 100  # the fuzz reached the fields it meant to


def test_a_damaged_job_json_is_a_row_saying_why_on_the_home_and_fleet_pages(api, root):
    storage = open_storage(root)
    runs = join(root, "runs", "retrain")
    cases = list(mutations(full_job(join(runs, "r0", "train")), JOB_OPAQUE))[::3]
    problems = []
    for start in range(0, len(cases), 20):  # the home page lists the newest 20 runs
        shutil.rmtree(runs[len("file://") :], ignore_errors=True)
        batch = cases[start : start + 20]
        for i, (_, _, damaged, _) in enumerate(batch):
            storage.put(join(runs, f"r{i}", "train", "job.json"), json.dumps(damaged).encode())
        home = api[0].get("/trainops/", headers=bearer(api))
        fleet = api[0].get("/trainops/fleet", params={"limit": "100"}, headers=bearer(api))
        problems += _answered(home, f"home page, cases {start}-") + _answered(fleet, f"fleet page, {start}-")
        for i, (field, wrong, _, must) in enumerate(batch):
            uri = join(runs, f"r{i}", "train", "job.json")
            if must:
                for page, response in (("home", home), ("fleet", fleet)):
                    if f"{uri}: field '{field}' should be " not in main_text(response.text):
                        problems.append(f"{page} page: {field} = {wrong!r} is not named for {uri}")
    assert problems == []


@pytest.mark.slow
def test_a_damaged_card_json_is_a_message_on_its_report_page_never_a_500(api, root):
    storage = open_storage(root)
    uri = join(model_version_prefix(root, "demo-lm", 3), "card.json")
    problems, refused = [], 0
    for field, wrong, damaged, must in mutations(full_card(), CARD_OPAQUE):
        storage.put(uri, json.dumps(damaged).encode())
        response = get(api, uri)
        where = f"card page, {field} = {wrong!r}"
        problems += _answered(response, where)
        problems += _check_message(main_text(response.text), uri, field, must, where)
        refused += bool(MESSAGE.search(main_text(response.text)))
    assert problems == []
    assert refused > 100


def _tree(root: str) -> dict[str, str]:
    """A run, a promoted model with its pointer and card, and a staged dataset version (by hand:
    staging is not what is tested); the URI of each of the four records."""
    storage = open_storage(root)
    promote_runs(storage, root, 1)
    layout = RunLayout(join(root, "runs", "retrain", "r1", "train"))
    storage.put_json(layout.job, full_job(layout.run_uri))
    version = join(root, "datasets", "web-text", "aaa111")
    storage.put_json(join(version, "validation.json"), {"success": True, "rows": 10})
    storage.put_json(
        join(version, "manifest.json"),
        {
            "format": "trainops.dataset/v1",
            "name": "web-text",
            "version": "aaa111",
            "created_at": "2026-01-02T00:00:00+00:00",
            "splits": {
                "train": {"tokens": 900, "shards": [{"path": "train/00000.bin", "tokens": 900}]},
                "eval": {"tokens": 90, "shards": [{"path": "eval/00000.bin", "tokens": 90}]},
            },
            "rows": {"total": 10, "train": 9, "eval": 1},
        },
    )
    return {
        "job": layout.job,
        "card": join(model_version_prefix(root, "demo-lm", 1), "card.json"),
        "pointer": production_pointer(root, "demo-lm"),
        "manifest": join(version, "manifest.json"),
    }


@pytest.mark.parametrize("kind", ["job", "card", "pointer", "manifest"])
@pytest.mark.parametrize("damage", ["truncated", "a list"])
def test_a_truncated_or_listed_record_is_a_message_on_every_page(api, root, kind, damage):
    uris = _tree(root)
    storage = open_storage(root)
    uri = uris[kind]
    data = storage.get(uri)
    storage.put(uri, data[: len(data) // 2] if damage == "truncated" else b"[1, 2]")
    said = f"{uri} is not valid JSON (" if damage == "truncated" else f"{uri} should hold a JSON object ("
    report = get(api, uri)
    home = api[0].get("/trainops/", headers=bearer(api))
    fleet = api[0].get("/trainops/fleet", headers=bearer(api))
    assert _answered(report, "report") + _answered(home, "home") + _answered(fleet, "fleet") == []
    assert said in main_text(report.text)
    if kind != "card":  # the home page reads the runs, pointers and manifests, not the cards
        assert said in main_text(home.text)
    if kind == "job":
        assert said in main_text(fleet.text)


# ----------------------------------------------------------------------------- commands


def _one_line_naming(err: str, command: str, uri: str) -> bool:
    return err.count("\n") == 1 and err.startswith(f"{command}: ") and uri in err


def test_cost_names_the_damaged_field_of_job_json_and_exits_1_never_a_traceback(tmp_path, capsys):
    layout = RunLayout((tmp_path / "runs" / "nightly" / "r1" / "train").as_uri())
    store = open_storage(layout.run_uri)
    _, metrics = one_preemption_job()
    for attempt in (1, 2):
        body = "".join(json.dumps(r) + "\n" for r in metrics if r["attempt"] == attempt)
        store.put(f"{layout.metrics_parts}/{metrics_part_name(attempt, 1)}", body.encode())
    job = full_job(layout.run_uri)
    problems, refused = [], 0
    for field, wrong, damaged, must in mutations(job, JOB_OPAQUE):
        store.put(layout.job, json.dumps(damaged).encode())
        code = main(["cost", layout.run_uri])  # an exception here is the traceback a user would see
        _, err = capsys.readouterr()
        where = f"cost, {field} = {wrong!r}"
        if code not in (0, 1) or (code == 1 and not _one_line_naming(err, "cost", layout.job)):
            problems.append(f"{where}: exit {code}, stderr {err!r}")
        problems += _check_message(err, layout.job, field, must, where)
        refused += code == 1
    for damage in (b'{"run_uri": "file:///x", "attem', b"[1, 2]"):
        store.put(layout.job, damage)
        code = main(["cost", layout.run_uri])
        err = capsys.readouterr().err
        if code != 1 or not _one_line_naming(err, "cost", layout.job):
            problems.append(f"cost, {damage!r}: exit {code}, stderr {err!r}")
    assert problems == []
    assert refused > 100


def test_rollback_names_the_damaged_field_of_the_card_and_exits_1_never_a_traceback(file_root, capsys):
    storage = open_storage(file_root)
    promote_runs(storage, file_root, 2)
    card_uri = join(model_version_prefix(file_root, "demo-lm", 1), "card.json")
    pointer_uri = production_pointer(file_root, "demo-lm")
    card = {**full_card(), **storage.get_json(card_uri)}  # its own uri and files, which exist
    pointer = storage.get(pointer_uri)
    argv = ["rollback", "demo-lm", "1", "--reason", "fuzz", "--by", "ci", "--storage-root", file_root]
    problems, refused = [], 0
    for field, wrong, damaged, must in mutations(card, CARD_OPAQUE):
        storage.put(card_uri, json.dumps(damaged).encode())
        storage.put(pointer_uri, pointer)  # production back at v2
        code = main(argv)
        _, err = capsys.readouterr()
        where = f"rollback, {field} = {wrong!r}"
        if code not in (0, 1) or (code == 1 and not err.startswith("rollback failed: ")):
            problems.append(f"{where}: exit {code}, stderr {err!r}")
        problems += _check_message(err, card_uri, field, must, where)
        refused += bool(MESSAGE.search(err))
    for uri in (card_uri, pointer_uri):
        for damage in (b'{"version": 1, "fi', b"[1, 2]"):
            storage.put(card_uri, json.dumps(card).encode())
            storage.put(pointer_uri, pointer)
            storage.put(uri, damage)
            code = main(argv)
            err = capsys.readouterr().err
            if code != 1 or err.count("\n") != 1 or uri not in err:
                problems.append(f"rollback, {uri} = {damage!r}: exit {code}, stderr {err!r}")
    assert problems == []
    assert refused > 100


def _python_m_trainops(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainops", *args], capture_output=True, text=True, cwd=REPO, timeout=120
    )


def test_python_m_trainops_says_a_truncated_record_in_one_line_with_status_1(file_root):
    storage = open_storage(file_root)
    promote_runs(storage, file_root, 2)
    card_uri = join(model_version_prefix(file_root, "demo-lm", 1), "card.json")
    storage.put(card_uri, storage.get(card_uri)[:40])
    layout = RunLayout(join(file_root, "runs", "nightly", "r1", "train"))
    job = json.dumps(full_job(layout.run_uri)).encode()
    storage.put(layout.job, job[: len(job) // 2])

    rollback = _python_m_trainops(
        "rollback", "demo-lm", "1", "--reason", "x", "--by", "ci", "--storage-root", file_root
    )
    cost = _python_m_trainops("cost", layout.run_uri)
    assert (rollback.returncode, cost.returncode) == (1, 1)
    assert "Traceback" not in rollback.stderr + cost.stderr
    assert rollback.stderr.startswith(f"rollback failed: v1 of 'demo-lm': {card_uri} is not valid JSON (")
    assert rollback.stderr.count("\n") == 1
    assert cost.stderr.startswith(f"cost: {layout.job} is not valid JSON (") and cost.stderr.count("\n") == 1
