"""The clouds' interruption notices, read from each node's instance metadata endpoint.

A spot or preemptible VM learns it is going away before anything signals its pods:

- **AWS** (IMDSv2): ``/latest/meta-data/spot/instance-action`` answers 404 until EC2 decides to
  reclaim the instance, then ``{"action": "terminate", "time": "<UTC deadline>"}``, about two
  minutes ahead; ``/latest/meta-data/events/recommendations/rebalance`` answers
  ``{"noticeTime": ...}`` when the instance is at elevated risk (a hint, not a notice). Every
  read needs a session token from ``PUT /latest/api/token``.
- **GCE**: ``/computeMetadata/v1/instance/preempted`` turns ``TRUE`` when a Spot or preemptible
  VM is preempted, about 30 s before it stops (no deadline is given: Compute Engine documents
  30 s); ``instance/maintenance-event`` names a coming host maintenance
  (``TERMINATE_ON_HOST_MAINTENANCE`` for GPU VMs, which cannot live-migrate, often an hour ahead).
  Every read needs ``Metadata-Flavor: Google``.
- **Azure**: ``/metadata/scheduledevents`` lists events with their ``NotBefore`` deadline;
  ``Preempt`` (a Spot eviction, at least 30 s ahead), ``Terminate``, ``Reboot`` and ``Redeploy``
  end what runs on the VM. Events name the VMs they hit (``Resources``); every read needs
  ``Metadata: true``.

Each source turns what its endpoint says into :class:`Notice` records; the parsing is pure
(``parse_*``), the HTTP is in the ``*Source`` classes. An **interruption** ends the VM: the
trainer saves and stops at once. An **advisory** (a rebalance recommendation, a maintenance
that may come much later) only asks for a checkpoint now; training goes on.
"""

from __future__ import annotations

import contextlib
import email.utils
import json
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

Kind = Literal["interruption", "advisory"]
PROVIDERS = ("aws", "gce", "azure")
DEFAULT_BASE_URLS = {
    "aws": "http://169.254.169.254",
    "gce": "http://metadata.google.internal",
    "azure": "http://169.254.169.254",
}
GCE_PREEMPTION_NOTICE_S = 30.0  # Compute Engine's documented preemption notice
REQUEST_TIMEOUT_S = 1.0  # a link-local endpoint answers in milliseconds, or not at all
AWS_TOKEN_TTL_S = 21600
AZURE_API_VERSION = "2020-07-01"
AZURE_ENDING_EVENTS = ("Preempt", "Terminate", "Reboot", "Redeploy")


@dataclass(frozen=True)
class Notice:
    """One thing the cloud announced about this VM.

    :param provider: ``aws``, ``gce`` or ``azure``.
    :param kind: ``interruption`` (the VM goes away) or ``advisory`` (save now, go on).
    :param event: what the endpoint said, for the log and the record (``spot/instance-action:
        terminate``).
    :param noticed_at: epoch seconds when the watcher first read it.
    :param deadline: epoch seconds when the VM goes away, as announced (None: not announced).
    :param node: the Kubernetes Node it is about (``$TRAINOPS_NODE_NAME``; None elsewhere).
    """

    provider: str
    kind: Kind
    event: str
    noticed_at: float
    deadline: float | None = None
    node: str | None = None

    @property
    def lead_s(self) -> float | None:
        """Seconds from the notice to the announced deadline (None: no deadline announced)."""
        return None if self.deadline is None else round(self.deadline - self.noticed_at, 3)

    def describe(self) -> str:
        lead = f", {self.lead_s:.0f} s before the announced deadline" if self.lead_s is not None else ""
        return f"{self.provider} {self.event}{lead}"


class MetadataError(Exception):
    """The metadata endpoint could not be read (refused, timed out, an unexpected answer)."""


# --- pure parsing ------------------------------------------------------------------------------
def _iso_epoch(text: object) -> float | None:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def parse_aws_instance_action(status: int, body: bytes, now: float) -> Notice | None:
    """``spot/instance-action``: 404 is no notice; 200 is ``{"action", "time"}``."""
    if status == 404:
        return None
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise MetadataError(f"spot/instance-action answered {body[:200]!r}, not JSON") from exc
    if not isinstance(data, dict) or "action" not in data:
        raise MetadataError(f"spot/instance-action answered {data!r}, without an action")
    return Notice(
        "aws", "interruption", f"spot/instance-action: {data['action']}", now, _iso_epoch(data.get("time"))
    )


def parse_aws_rebalance(status: int, body: bytes, now: float) -> Notice | None:
    """``events/recommendations/rebalance``: 404 is none; 200 is ``{"noticeTime"}``."""
    if status == 404:
        return None
    return Notice("aws", "advisory", "rebalance recommendation", now)


def parse_gce_preempted(body: bytes, now: float) -> Notice | None:
    """``instance/preempted``: ``TRUE`` once preempted; the deadline is the documented 30 s."""
    if body.strip().upper() != b"TRUE":
        return None
    return Notice("gce", "interruption", "instance/preempted: TRUE", now, now + GCE_PREEMPTION_NOTICE_S)


def parse_gce_maintenance(body: bytes, now: float) -> Notice | None:
    """``instance/maintenance-event``: ``NONE``, else the coming maintenance (an advisory: it
    may be an hour away, and the VM's own shutdown signal comes when it starts)."""
    value = body.strip().decode(errors="replace")
    if not value or value.upper() == "NONE":
        return None
    return Notice("gce", "advisory", f"instance/maintenance-event: {value}", now)


def parse_azure_events(body: bytes, now: float, vm_name: str | None) -> list[Notice]:
    """``scheduledevents``: an interruption for each ending event that names this VM (or names
    none: a single VM's events may leave ``Resources`` empty)."""
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise MetadataError(f"scheduledevents answered {body[:200]!r}, not JSON") from exc
    events = data.get("Events") if isinstance(data, dict) else None
    if not isinstance(events, list):
        raise MetadataError(f"scheduledevents answered {str(data)[:200]}, without an Events list")
    out = []
    for event in events:
        if not isinstance(event, dict) or event.get("EventType") not in AZURE_ENDING_EVENTS:
            continue
        resources = event.get("Resources") or []
        if vm_name and resources and vm_name not in resources:
            continue
        deadline = None
        if event.get("NotBefore"):
            try:
                deadline = email.utils.parsedate_to_datetime(str(event["NotBefore"])).timestamp()
            except (TypeError, ValueError):
                deadline = None
        name = f"scheduledevents: {event['EventType']} {event.get('EventId', '')}".rstrip()
        out.append(Notice("azure", "interruption", name, now, deadline))
    return out


# --- HTTP ----------------------------------------------------------------------------------------
Fetch = Callable[[urllib.request.Request], tuple[int, bytes]]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None  # a metadata endpoint never redirects; whatever does is not one


# Straight to the link-local endpoint: never through $HTTP_PROXY (a proxy would see the IMDSv2
# token, and could answer with a notice of its own), and never redirected.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())


def http_fetch(request: urllib.request.Request) -> tuple[int, bytes]:
    """``(status, body)`` of ``request``; a 404 is an answer, any other failure a MetadataError."""
    try:
        with _OPENER.open(request, timeout=REQUEST_TIMEOUT_S) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return 404, b""
        raise MetadataError(f"{request.get_method()} {request.full_url}: HTTP {exc.code}") from exc
    except (OSError, ValueError) as exc:
        raise MetadataError(f"{request.get_method()} {request.full_url}: {exc}") from exc


class AwsSource:
    """EC2's instance metadata, IMDSv2: a session token, then the two notices."""

    provider = "aws"

    def __init__(self, base_url: str, fetch: Fetch = http_fetch):
        self.base, self.fetch = base_url.rstrip("/"), fetch
        self._token: str | None = None

    def _get(self, path: str) -> tuple[int, bytes]:
        if self._token is None:
            request = urllib.request.Request(
                f"{self.base}/latest/api/token",
                method="PUT",
                headers={"X-aws-ec2-metadata-token-ttl-seconds": str(AWS_TOKEN_TTL_S)},
            )
            status, body = self.fetch(request)
            if status != 200 or not body:
                raise MetadataError(f"PUT {self.base}/latest/api/token answered {status}: no token")
            self._token = body.decode().strip()
        try:
            return self.fetch(
                urllib.request.Request(
                    f"{self.base}/latest/meta-data/{path}", headers={"X-aws-ec2-metadata-token": self._token}
                )
            )
        except MetadataError:
            self._token = None  # expired or refused: the next poll asks for a new one
            raise

    def probe(self) -> None:
        """Raise MetadataError unless this is EC2's metadata endpoint."""
        self._get("instance-id")

    def poll(self, now: float) -> list[Notice]:
        found = [parse_aws_instance_action(*self._get("spot/instance-action"), now)]
        found.append(parse_aws_rebalance(*self._get("events/recommendations/rebalance"), now))
        return [n for n in found if n is not None]


class GceSource:
    """Compute Engine's metadata server."""

    provider = "gce"

    def __init__(self, base_url: str, fetch: Fetch = http_fetch):
        self.base, self.fetch = base_url.rstrip("/"), fetch

    def _get(self, path: str) -> bytes:
        status, body = self.fetch(
            urllib.request.Request(
                f"{self.base}/computeMetadata/v1/instance/{path}", headers={"Metadata-Flavor": "Google"}
            )
        )
        if status != 200:
            raise MetadataError(f"GET {self.base}/computeMetadata/v1/instance/{path} answered {status}")
        return body

    def probe(self) -> None:
        self._get("id")

    def poll(self, now: float) -> list[Notice]:
        found = [parse_gce_preempted(self._get("preempted"), now)]
        found.append(parse_gce_maintenance(self._get("maintenance-event"), now))
        return [n for n in found if n is not None]


class AzureSource:
    """Azure's Scheduled Events, for this VM (its name from the instance metadata)."""

    provider = "azure"

    def __init__(self, base_url: str, fetch: Fetch = http_fetch):
        self.base, self.fetch = base_url.rstrip("/"), fetch
        self.vm_name: str | None = None

    def _get(self, path: str) -> bytes:
        status, body = self.fetch(
            urllib.request.Request(f"{self.base}/metadata/{path}", headers={"Metadata": "true"})
        )
        if status != 200:
            raise MetadataError(f"GET {self.base}/metadata/{path} answered {status}")
        return body

    def probe(self) -> None:
        name = self._get("instance/compute/name?api-version=2021-02-01&format=text").decode().strip()
        self.vm_name = name or None

    def poll(self, now: float) -> list[Notice]:
        if self.vm_name is None:
            # unknown: events that name VMs are then taken as this VM's (better a save too many)
            with contextlib.suppress(MetadataError):
                self.probe()
        return parse_azure_events(
            self._get(f"scheduledevents?api-version={AZURE_API_VERSION}"), now, self.vm_name
        )


Source = AwsSource | GceSource | AzureSource
SOURCES: dict[str, type[AwsSource] | type[GceSource] | type[AzureSource]] = {
    "aws": AwsSource,
    "gce": GceSource,
    "azure": AzureSource,
}


def source_for(provider: str, base_url: str | None, fetch: Fetch = http_fetch) -> Source:
    """The source of ``provider`` at ``base_url`` (None: the provider's own endpoint)."""
    return SOURCES[provider](base_url or DEFAULT_BASE_URLS[provider], fetch)
