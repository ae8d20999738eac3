"""Deterministic demo data: short templated English a tiny byte-level model can learn.

Each source (``news``, ``forum``, ``docs``) has its own templates and words, so
per-slice evaluation shows different losses. Same arguments, same bytes: every
value, timestamps included, derives from ``seed``, never from the clock.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from trainer.contract import join
from trainer.storage import open_storage

SOURCES = ("news", "forum", "docs")

_WORDS = {
    "city": ["paris", "oslo", "lima", "cairo", "tokyo", "quito"],
    "group": ["the council", "the mayor", "local teams", "the port", "the school board"],
    "act": ["opened", "closed", "approved", "delayed", "funded"],
    "thing": ["a new bridge", "the old market", "a bus line", "the city park", "a water plant"],
    "day": ["monday", "tuesday", "friday", "sunday"],
    "item": ["my laptop", "the new phone", "this camera", "my old bike", "the blue kettle"],
    "state": ["works fine", "keeps crashing", "is too slow", "feels great", "broke again"],
    "ask": ["any ideas?", "thanks!", "help please.", "same here?", "worth it?"],
    "verb": ["install", "update", "remove", "configure", "restart"],
    "obj": ["the server", "the client", "a plugin", "the cache", "the database"],
    "flag": ["--force", "--dry-run", "--verbose", "--all", "--quiet"],
    "file": ["config.yaml", "setup.cfg", "main.py", "notes.md"],
}

_TEMPLATES = {
    "news": [
        "{group} {act} {thing} in {city} on {day}.",
        "in {city}, {group} {act} {thing}.",
        "on {day} {group} of {city} {act} {thing}.",
    ],
    "forum": [
        "{item} {state} since {day}, {ask}",
        "has anyone seen this? {item} {state}. {ask}",
        "update: {item} {state} now. {ask}",
    ],
    "docs": [
        "to {verb} {obj}, run: tool {verb} {flag}",
        "edit {file} before you {verb} {obj}.",
        "use {flag} to {verb} {obj} safely.",
    ],
}

_EPOCH = datetime(2024, 1, 1, tzinfo=UTC)


def demo_rows(rows: int = 4000, *, seed: int = 0, corrupt: bool = False) -> dict[str, list]:
    """Column lists ``id``, ``text``, ``source``, ``created_at`` (pure, deterministic).

    With ``corrupt`` the data breaks the default suite in known places: 2 null ids,
    ids repeated (first id reused at the end and in the middle), and 3 empty texts.
    """
    if rows < 1:
        raise ValueError(f"rows must be at least 1, got {rows}")
    rng = random.Random(seed)
    start = _EPOCH + timedelta(days=seed)
    cols: dict[str, list] = {"id": [], "text": [], "source": [], "created_at": []}
    for i in range(rows):
        source = SOURCES[rng.randrange(len(SOURCES))]
        template = rng.choice(_TEMPLATES[source])
        text = template.format(**{k: rng.choice(v) for k, v in _WORDS.items()})
        cols["id"].append(f"{source[0]}{seed:03d}-{i:07d}")
        cols["text"].append(text)
        cols["source"].append(source)
        cols["created_at"].append(start + timedelta(minutes=7 * i))
    if corrupt:
        _corrupt(cols)
    return cols


def _corrupt(cols: dict[str, list]) -> None:
    n = len(cols["id"])
    if n < 12:
        raise ValueError(f"corrupt demo data needs at least 12 rows, got {n}")
    cols["id"][3] = None
    cols["id"][n // 3] = None
    cols["id"][n - 1] = cols["id"][0]  # a duplicate across files when written as several
    cols["id"][n // 2] = cols["id"][1]
    for i in (5, n // 4, n - 3):
        cols["text"][i] = ""


def write_demo_dataset(
    uri: str, *, rows: int = 4000, seed: int = 0, files: int = 2, corrupt: bool = False, storage=None
) -> dict:
    """Write ``<uri>/part-NNNNN.parquet`` (``files`` parts); return ``{"uri", "rows", "files"}``.

    :param storage: a ``trainer.storage`` client; by default ``open_storage(uri)``.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if files < 1 or files > rows:
        raise ValueError(f"files must be between 1 and rows ({rows}), got {files}")
    storage = storage or open_storage(uri)
    cols = demo_rows(rows, seed=seed, corrupt=corrupt)
    schema = pa.schema(
        [
            ("id", pa.string()),
            ("text", pa.string()),
            ("source", pa.string()),
            ("created_at", pa.timestamp("us", tz="UTC")),
        ]
    )
    table = pa.table(cols, schema=schema)
    written = []
    bounds = [rows * k // files for k in range(files + 1)]
    for k in range(files):
        sink = pa.BufferOutputStream()
        pq.write_table(table.slice(bounds[k], bounds[k + 1] - bounds[k]), sink)
        part = join(uri, f"part-{k:05d}.parquet")
        storage.put(part, sink.getvalue().to_pybytes())
        written.append(part)
    return {"uri": uri.rstrip("/"), "rows": rows, "files": written}
