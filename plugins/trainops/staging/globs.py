"""Glob patterns in source URIs (``s3://b/raw/*.parquet``, ``file:///d/**/*.jsonl``), pure.

``*`` and ``?`` match within one path segment, ``[abc]`` / ``[!abc]`` one character of a
set, and a segment that is exactly ``**`` matches any number of segments, none included.
Object stores have no directories, so a pattern is matched against the keys listed under
its fixed prefix (everything before the first segment with a wildcard).
"""

from __future__ import annotations

import re

GLOB_CHARS = "*?["


def split_glob(uri: str) -> tuple[str, str | None]:
    """``(prefix, pattern)``: the fixed part of ``uri`` and the rest, or ``(uri, None)``.

    ``split_glob("s3://b/raw/2026-*/part-*.parquet") == ("s3://b/raw", "2026-*/part-*.parquet")``
    """
    scheme, sep, rest = uri.partition("://")
    if not sep:
        return uri, None
    parts = rest.split("/")
    for i, part in enumerate(parts):
        if any(c in part for c in GLOB_CHARS):
            if scheme == "s3" and i == 0:
                raise ValueError(
                    f"source_uri {uri!r} has a wildcard in the bucket name: name the bucket and "
                    "put wildcards in the key, e.g. s3://bucket/raw/*.parquet"
                )
            return f"{scheme}://{'/'.join(parts[:i])}", "/".join(parts[i:])
    return uri, None


def glob_regex(pattern: str) -> re.Pattern:
    """A compiled regex that matches a key relative to the prefix (no leading slash)."""
    segments = pattern.strip("/").split("/")
    out = []
    for n, segment in enumerate(segments):
        last = n == len(segments) - 1
        if segment == "**":
            # zero or more whole segments, each followed by "/" (or the end, if last)
            out.append(".*" if last else "(?:[^/]+/)*")
            continue
        out.append(_segment_regex(segment) + ("" if last else "/"))
    return re.compile("".join(out) + r"\Z")


def _segment_regex(segment: str) -> str:
    out, i = [], 0
    while i < len(segment):
        c = segment[i]
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = segment.find("]", i + 2 if segment[i + 1 : i + 2] in ("!", "]") else i + 1)
            if end < 0:
                out.append(re.escape(c))
            else:
                body = segment[i + 1 : end]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def glob_filter(prefix: str, pattern: str, uris: list[str]) -> list[str]:
    """The ``uris`` (listed under ``prefix``) whose part after ``prefix/`` matches."""
    regex = glob_regex(pattern)
    base = prefix.rstrip("/") + "/"
    return [u for u in uris if u.startswith(base) and regex.match(u[len(base) :])]
