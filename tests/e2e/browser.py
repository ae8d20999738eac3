"""Headless Chromium as a person's browser for the e2e tests: load a page as a browser loads it
(``--dump-dom``: the report pages run no script; Airflow's UI is given virtual time to fetch and
render), read its title, links, frames and the outcomes its rows show, and follow a link by its
text. :class:`SigningProxy` lets it reach an API server that wants a token: it adds the
``Authorization`` header a logged-in browser's cookie would stand for."""

from __future__ import annotations

import http.client
import subprocess
import threading
from html.parser import HTMLParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urljoin, urlsplit

CHROMIUM = "/usr/bin/chromium"

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


class _Anchors(HTMLParser):
    """The document's title (not an SVG's), the page's links as (text, href), its iframes'
    sources and the outcomes its rows show, as (kind, text) from their ``outcome-<kind>`` spans."""

    def __init__(self, dom: str):
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self.frames: list[str] = []
        self.outcomes: list[tuple[str, str]] = []
        self._all_text: list[str] = []
        self._outcome: str | None = None
        self.title = ""
        self._href: str | None = None
        self._text: list[str] = []
        self._in_title = False
        self.feed(dom)

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self._href, self._text = dict(attrs).get("href"), []
        elif tag == "iframe":
            self.frames.append(dict(attrs).get("src") or "")
        elif tag == "title" and not self.title:
            self._in_title = True
        elif tag == "span":
            kinds = [
                c[len("outcome-") :]
                for c in (dict(attrs).get("class") or "").split()
                if c.startswith("outcome-")
            ]
            if kinds:
                self._outcome, self._outcome_text = kinds[0], []

    def handle_endtag(self, tag):
        if tag == "a" and self._href is not None:
            self.links.append((" ".join("".join(self._text).split()), self._href))
            self._href = None
        elif tag == "title":
            self._in_title = False
        elif tag == "span" and self._outcome is not None:
            self.outcomes.append((self._outcome, " ".join("".join(self._outcome_text).split())))
            self._outcome = None

    @property
    def text(self) -> str:
        """The page's visible text, whitespace collapsed."""
        return " ".join("".join(self._all_text).split())

    def handle_data(self, data):
        self._all_text.append(data)
        if self._href is not None:
            self._text.append(data)
        if self._outcome is not None:
            self._outcome_text.append(data)
        if self._in_title:
            self.title += data


def browse(url: str, profile: Path, *, virtual_time_ms: int | None = None) -> _Anchors:
    """The page at ``url`` as headless Chromium has rendered it."""
    args = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", url]
    if virtual_time_ms:
        args.insert(-2, f"--virtual-time-budget={virtual_time_ms}")
    out = subprocess.run(args, capture_output=True, timeout=180, check=True)
    return _Anchors(out.stdout.decode("utf-8", errors="replace"))


def click(page: _Anchors, url: str, text: str) -> str:
    """The absolute URL of the one link on ``page`` (loaded from ``url``) whose text is ``text``."""
    hrefs = [href for label, href in page.links if label == text]
    assert len(hrefs) == 1, f"no single link {text!r} on {url}: {page.links}"
    return urljoin(url, hrefs[0])


class SigningProxy:
    """An HTTP proxy on 127.0.0.1 in front of ``upstream`` (``http://host:port``) that adds
    ``Authorization: Bearer <token>`` to every GET; use as a context manager, browse :attr:`url`."""

    def __init__(self, upstream: str, token: str):
        split = urlsplit(upstream)
        target, bearer = (split.hostname, split.port), f"Bearer {token}"

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                conn = http.client.HTTPConnection(*target, timeout=60)
                try:
                    headers = {
                        k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")
                    }
                    conn.request("GET", self.path, headers={**headers, "Authorization": bearer})
                    reply = conn.getresponse()
                    body = reply.read()
                finally:
                    conn.close()
                self.send_response(reply.status, reply.reason)
                for name, value in reply.getheaders():
                    if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> SigningProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
