"""A fake cloud metadata endpoint on 127.0.0.1, in the shape of AWS IMDSv2, GCE or Azure.

It serves what the real ones serve to a VM (``trainer.runtime.notice_sources`` names the
paths) and refuses what they refuse: AWS reads without a session token (401), GCE reads
without ``Metadata-Flavor: Google`` (403), Azure reads without ``Metadata: true`` (400).
:meth:`MetadataServer.announce` makes it announce an interruption with a deadline (and, for
AWS, a rebalance recommendation with ``advise``); :meth:`clear` takes it back. Faults:
``fail_next`` answers the next reads with an HTTP error, ``hang_next`` holds them past the
client's timeout.
"""

from __future__ import annotations

import email.utils
import json
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

VM_NAME = "vm-spot-7"
AWS_TOKEN = "AQAEAFake-token=="


class MetadataServer:
    def __init__(self, shape: str):
        assert shape in ("aws", "gce", "azure"), shape
        self.shape = shape
        self.deadline: float | None = None  # an interruption is announced while set
        self.advisory = False
        self.reads = 0
        self.refused = 0
        self._fail: list[int] = []
        self._hang = 0
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def announce(self, deadline: float) -> None:
        self.deadline = deadline

    def advise(self) -> None:
        self.advisory = True

    def clear(self) -> None:
        self.deadline, self.advisory = None, False

    def fail_next(self, count: int, status: int = 500) -> None:
        with self._lock:
            self._fail += [status] * count

    def hang_next(self, count: int) -> None:
        with self._lock:
            self._hang += count

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # --- answers -------------------------------------------------------------------------
    def answer(self, method: str, path: str, headers) -> tuple[int, bytes]:
        with self._lock:
            if self._hang:
                self._hang -= 1
                hang = True
            else:
                hang = False
            fail = self._fail.pop(0) if self._fail else None
        if hang:
            time.sleep(3)  # past the client's 1 s timeout
        if fail is not None:
            return fail, b"injected"
        self.reads += 1
        return {"aws": self._aws, "gce": self._gce, "azure": self._azure}[self.shape](method, path, headers)

    def _aws(self, method: str, path: str, headers) -> tuple[int, bytes]:
        if method == "PUT" and path == "/latest/api/token":
            if not headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                return 400, b"missing TTL"
            return 200, AWS_TOKEN.encode()
        if headers.get("X-aws-ec2-metadata-token") != AWS_TOKEN:
            self.refused += 1
            return 401, b""
        if path == "/latest/meta-data/instance-id":
            return 200, b"i-0fake"
        if path == "/latest/meta-data/spot/instance-action":
            if self.deadline is None:
                return 404, b""
            when = datetime.fromtimestamp(self.deadline, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            return 200, json.dumps({"action": "terminate", "time": when}).encode()
        if path == "/latest/meta-data/events/recommendations/rebalance":
            if not self.advisory:
                return 404, b""
            return 200, json.dumps({"noticeTime": "2026-12-06T05:00:00Z"}).encode()
        return 404, b""

    def _gce(self, method: str, path: str, headers) -> tuple[int, bytes]:
        if headers.get("Metadata-Flavor") != "Google":
            self.refused += 1
            return 403, b"Missing Metadata-Flavor:Google header."
        prefix = "/computeMetadata/v1/instance/"
        if path == prefix + "id":
            return 200, b"4520031799277581759"
        if path == prefix + "preempted":
            return 200, b"TRUE" if self.deadline is not None else b"FALSE"
        if path == prefix + "maintenance-event":
            return 200, b"TERMINATE_ON_HOST_MAINTENANCE" if self.advisory else b"NONE"
        return 404, b""

    def _azure(self, method: str, path: str, headers) -> tuple[int, bytes]:
        if headers.get("Metadata") != "true":
            self.refused += 1
            return 400, b'{"error": "Bad request. Required metadata header not specified"}'
        if path.startswith("/metadata/instance/compute/name"):
            return 200, VM_NAME.encode()
        if path.startswith("/metadata/scheduledevents"):
            events = []
            if self.deadline is not None:
                events = [
                    {  # another VM's event first: it must be left alone
                        "EventId": "0A0A",
                        "EventType": "Preempt",
                        "ResourceType": "VirtualMachine",
                        "Resources": ["vm-other"],
                        "EventStatus": "Scheduled",
                        "NotBefore": email.utils.formatdate(self.deadline - 5, usegmt=True),
                    },
                    {
                        "EventId": "F1A3",
                        "EventType": "Preempt",
                        "ResourceType": "VirtualMachine",
                        "Resources": [VM_NAME],
                        "EventStatus": "Scheduled",
                        "NotBefore": email.utils.formatdate(self.deadline, usegmt=True),
                        "Description": "Virtual machine is being preempted.",
                        "EventSource": "Platform",
                        "DurationInSeconds": -1,
                    },
                ]
            return 200, json.dumps({"DocumentIncarnation": 2 if events else 1, "Events": events}).encode()
        return 404, b""

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, method: str) -> None:
                status, body = server.answer(method, self.path, self.headers)
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # a client that gave up on a held read

            def do_GET(self) -> None:
                self._reply("GET")

            def do_PUT(self) -> None:
                self._reply("PUT")

            def log_message(self, *args) -> None:
                pass

        return Handler
