"""A fault-injecting S3 for tests: an HTTP proxy on 127.0.0.1, in a thread, in front of moto's
server. Point an S3 client at :attr:`S3FaultProxy.url` instead of moto and choose what goes wrong:

- **refuse**: answer ``503 SlowDown`` (S3's XML error) without forwarding;
- **reset before**: drop the connection (TCP RST) before forwarding: S3 never saw the request;
- **reset after**: forward, let S3 act, then drop the connection instead of relaying the reply
  (the lost reply: the client cannot tell this from "reset before").

Each applies to a chosen fraction of requests, drawn from a seeded generator (a run repeats),
optionally only to some operations (:data:`OPERATIONS`). A **blackout** refuses or resets
every request until it is switched off or for a given time. Everything else is relayed as S3
sent it: status, headers in order (a ``HEAD`` keeps its ``Content-Length`` and has no body),
body; only the transfer framing may change (a chunked reply is relayed with its length).
Every request is recorded in :attr:`S3FaultProxy.events` as (operation, what the proxy did).

Used by ``tests/conftest.py`` (fixtures ``s3_faults`` and ``faulty_s3_root``).
"""

from __future__ import annotations

import contextlib
import http.client
import random
import socket
import socketserver
import struct
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Literal
from urllib.parse import parse_qs, urlsplit

# What a request is, as far as faults go (see :func:`operation`).
OPERATIONS = frozenset(
    {
        "PUT",  # PutObject
        "GET",  # GetObject
        "HEAD",  # HeadObject
        "LIST",  # ListObjects(V2), ListMultipartUploads
        "DELETE",  # DeleteObject, DeleteObjects
        "COPY",  # CopyObject
        "PART",  # UploadPart, UploadPartCopy
        "CREATE_MULTIPART",  # CreateMultipartUpload
        "COMPLETE_MULTIPART",  # CompleteMultipartUpload
        "ABORT_MULTIPART",  # AbortMultipartUpload
        "LIST_PARTS",  # ListParts
        "BUCKET",  # bucket-level requests (CreateBucket, HeadBucket, ...)
    }
)

# What the proxy did with a request.
Action = Literal["forwarded", "refused", "reset_before", "reset_after"]

_LIST_PARAMS = {"list-type", "prefix", "delimiter", "continuation-token", "marker", "uploads"}
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "expect", "te", "upgrade"}

_SLOWDOWN = (
    '<?xml version="1.0" encoding="UTF-8"?>\n'
    "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message>"
    "<RequestId>{rid}</RequestId><HostId>s3-faults</HostId></Error>"
)


def operation(method: str, target: str, headers: dict[str, str]) -> str:
    """The operation a path-style S3 request performs, one of :data:`OPERATIONS`.

    :param target: the request target (path and query), e.g. ``/bucket/key?partNumber=2&uploadId=x``.
    :param headers: the request's headers, names lower-cased.
    """
    parts = urlsplit(target)
    query = parse_qs(parts.query, keep_blank_values=True)
    _bucket, _, key = parts.path.lstrip("/").partition("/")
    method = method.upper()
    if not key:
        if method == "GET" and (not query or query.keys() & _LIST_PARAMS):
            return "LIST"
        return "DELETE" if method == "POST" and "delete" in query else "BUCKET"
    if method == "HEAD":
        return "HEAD"
    if method == "GET":
        return "LIST_PARTS" if "uploadId" in query else "GET"
    if method == "PUT":
        if "partNumber" in query:
            return "PART"
        return "COPY" if "x-amz-copy-source" in headers else "PUT"
    if method == "POST":
        if "delete" in query:
            return "DELETE"
        if "uploads" in query:
            return "CREATE_MULTIPART"
        if "uploadId" in query:
            return "COMPLETE_MULTIPART"
    if method == "DELETE":
        return "ABORT_MULTIPART" if "uploadId" in query else "DELETE"
    return "BUCKET"


@dataclass(frozen=True)
class Faults:
    """Fractions of requests to fail, each in ``[0, 1]``, together at most 1.

    :param ops: the operations they apply to (names from :data:`OPERATIONS`); None: all.
    :param seed: seeds the draws; requests outside ``ops`` draw nothing, so the sequence
        of faults on the chosen operations repeats whatever else is sent.
    :param limit: inject at most this many faults into each operation, then relay it
        (``refuse=1, limit=1``: the first request of each operation is refused, its retry
        passes); None: no limit.
    """

    refuse: float = 0.0
    reset_before: float = 0.0
    reset_after: float = 0.0
    ops: frozenset[str] | None = None
    seed: int = 0
    limit: int | None = None

    def __post_init__(self) -> None:
        fractions = (self.refuse, self.reset_before, self.reset_after)
        if any(not 0.0 <= f <= 1.0 for f in fractions) or sum(fractions) > 1.0:
            raise ValueError(f"fault fractions {fractions} must each be in [0, 1] and add up to at most 1")
        if self.ops is not None:
            unknown = set(self.ops) - OPERATIONS
            if unknown:
                raise ValueError(f"unknown operations {sorted(unknown)}: use some of {sorted(OPERATIONS)}")
        if self.limit is not None and self.limit < 0:
            raise ValueError(f"fault limit {self.limit} must be >= 0, or None for no limit")


@dataclass(frozen=True)
class Event:
    """One request the proxy saw, and what it did with it."""

    op: str
    method: str
    target: str
    action: Action
    status: int | None  # the status S3 (or the proxy) answered; None when reset before forwarding


class _Dropped(Exception):
    """The connection was reset on purpose; stop serving it."""


class S3FaultProxy:
    """The proxy (see the module docstring). ``start()`` it, or use it as a context manager."""

    def __init__(self, upstream: str) -> None:
        """:param upstream: moto's endpoint, ``http://host:port``."""
        split = urlsplit(upstream)
        if split.scheme != "http" or not split.hostname or not split.port:
            raise ValueError(f"upstream {upstream!r} must be http://host:port")
        self.upstream = (split.hostname, split.port)
        self._lock = threading.Lock()
        self._faults = Faults()
        self._rng = random.Random(0)
        self._injected: Counter[str] = Counter()  # faults injected per operation since inject()
        self._blackout_until: float | None = None  # monotonic; inf: until switched off
        self._blackout_mode: Literal["refuse", "reset"] = "refuse"
        self.events: list[Event] = []
        # request headers removed before forwarding (lower case): {"if-none-match", "if-match"}
        # makes a store that ignores S3's conditional writes, as some S3-compatible servers do
        self.drop_headers: frozenset[str] = frozenset()
        self._server: socketserver.ThreadingTCPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the proxy is not started: call start() first")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> S3FaultProxy:
        proxy = self

        class Handler(_Handler):
            owner = proxy

        server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler, bind_and_activate=False)
        server.daemon_threads = True
        server.allow_reuse_address = True
        server.server_bind()
        server.server_activate()
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="s3-faults", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> S3FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ control
    def inject(
        self,
        *,
        refuse: float = 0.0,
        reset_before: float = 0.0,
        reset_after: float = 0.0,
        ops: set[str] | frozenset[str] | None = None,
        seed: int = 0,
        limit: int | None = None,
    ) -> None:
        """Fail these fractions of the requests from now on, replacing any earlier choice
        (the parameters are :class:`Faults`')."""
        chosen = frozenset(o.upper() for o in ops) if ops else None
        faults = Faults(refuse, reset_before, reset_after, chosen, seed, limit)
        with self._lock:
            self._faults = faults
            self._rng = random.Random(seed)
            self._injected = Counter()

    def blackout(self, seconds: float | None = None, *, mode: Literal["refuse", "reset"] = "refuse") -> None:
        """Refuse (503 SlowDown) or reset every request, for ``seconds`` or until :meth:`end_blackout`."""
        if mode not in ("refuse", "reset"):
            raise ValueError(f"blackout mode {mode!r} must be 'refuse' or 'reset'")
        with self._lock:
            self._blackout_mode = mode
            self._blackout_until = float("inf") if seconds is None else time.monotonic() + seconds

    def end_blackout(self) -> None:
        with self._lock:
            self._blackout_until = None

    def clear(self) -> None:
        """No faults, no blackout, no events: as freshly started."""
        with self._lock:
            self._faults = Faults()
            self._rng = random.Random(0)
            self._injected = Counter()
            self._blackout_until = None
            self.events = []
            self.drop_headers = frozenset()

    def counts(self, op: str | None = None) -> Counter[str]:
        """How many requests (of ``op``, or all) were forwarded, refused, reset before, reset after."""
        with self._lock:
            return Counter(e.action for e in self.events if op is None or e.op == op.upper())

    # ------------------------------------------------------------------ decisions
    def _decide(self, op: str) -> Action:
        with self._lock:
            if self._blackout_until is not None:
                if time.monotonic() < self._blackout_until:
                    return "refused" if self._blackout_mode == "refuse" else "reset_before"
                self._blackout_until = None
            faults = self._faults
            if faults.ops is not None and op not in faults.ops:
                return "forwarded"
            if not (faults.refuse or faults.reset_before or faults.reset_after):
                return "forwarded"
            if faults.limit is not None and self._injected[op] >= faults.limit:
                return "forwarded"
            draw = self._rng.random()
            action: Action = "forwarded"
            if draw < faults.refuse:
                action = "refused"
            elif draw < faults.refuse + faults.reset_before:
                action = "reset_before"
            elif draw < faults.refuse + faults.reset_before + faults.reset_after:
                action = "reset_after"
            if action != "forwarded":
                self._injected[op] += 1
            return action

    def _record(self, event: Event) -> None:
        with self._lock:
            self.events.append(event)


class _Handler(BaseHTTPRequestHandler):
    """Serves one client connection: parse a request, decide, forward or fail, repeat."""

    owner: S3FaultProxy
    protocol_version = "HTTP/1.1"  # keep-alive, and "100 Continue" for Expect: 100-continue

    def handle(self) -> None:
        # A connection reset on purpose, or one the client dropped: nothing more to serve.
        with contextlib.suppress(_Dropped, ConnectionError):
            super().handle()

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the events say what happened."""

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _reset(self) -> None:
        """Drop the connection with a TCP RST: no reply, not even a clean close."""
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.rfile.close()
        self.wfile.close()
        self.connection.close()
        raise _Dropped

    def _forward(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        # A connection per request: a kept-alive one that moto closed while idle would fail the
        # next request, a fault nobody asked for.
        conn = http.client.HTTPConnection(*self.owner.upstream, timeout=60)
        try:
            return self._exchange(conn, body)
        finally:
            conn.close()

    def _exchange(
        self, conn: http.client.HTTPConnection, body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
        for name, value in self.headers.items():
            lower = name.lower()
            if (
                lower not in _HOP_BY_HOP
                and lower != "content-length"
                and lower not in self.owner.drop_headers
            ):
                conn.putheader(name, value)
        if body or self.command in ("PUT", "POST"):
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body or None)
        response = conn.getresponse()
        data = response.read()  # nothing for HEAD: http.client knows the method
        return response.status, response.reason, response.getheaders(), data

    def _reply(self, status: int, reason: str, headers: list[tuple[str, str]], body: bytes) -> None:
        chunked = any(n.lower() == "transfer-encoding" and "chunked" in v.lower() for n, v in headers)
        lines = [f"HTTP/1.1 {status} {reason}"]
        for name, value in headers:
            if name.lower() in ("connection", "keep-alive", "transfer-encoding"):
                continue
            lines.append(f"{name}: {value}")
        if chunked and self.command != "HEAD":
            lines.append(f"Content-Length: {len(body)}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        self.wfile.write(head if self.command == "HEAD" else head + body)
        self.wfile.flush()

    def _serve(self) -> None:
        body = self._body()
        op = operation(self.command, self.path, {k.lower(): v for k, v in self.headers.items()})
        action = self.owner._decide(op)
        if action == "reset_before":
            self.owner._record(Event(op, self.command, self.path, action, None))
            self._reset()
        if action == "refused":
            self.owner._record(Event(op, self.command, self.path, action, 503))
            rid = uuid.uuid4().hex[:16].upper()
            xml = _SLOWDOWN.format(rid=rid).encode()
            headers = [
                ("x-amz-request-id", rid),
                ("Content-Type", "application/xml"),
                ("Content-Length", str(len(xml))),
            ]
            self._reply(503, "Slow Down", headers, xml)
            return
        status, reason, headers, data = self._forward(body)
        self.owner._record(Event(op, self.command, self.path, action, status))
        if action == "reset_after":
            self._reset()
        self._reply(status, reason, headers, data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _serve
