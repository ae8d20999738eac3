"""Regenerate the screenshots in docs/reports.md: the trainops home page, the demo run's report,
its training charts, its model card and the fleet page, as a real browser shows them when a user opens them in Airflow.

    .venv/bin/python docs/img/screenshots.py [--demo-dir DIR] [--chromium /usr/bin/chromium]

1. Runs the demo pipeline as ``make demo`` does (``python -m trainops demo``), twice (the
   fleet page's trend needs two runs; the second with ``--seed 2``, a model that passes the gate
   and becomes v2, as docs/promotion.md's rollback walkthrough makes it), with every folder (Airflow home, its SQLite database,
   storage root, local cluster state) in a temporary folder, or in ``--demo-dir``, whose
   finished demo runs count. The report shown is the newest run's.
2. Starts Airflow's API server (``python -m airflow api-server``) on that home, with the
   simple auth manager's ``all_admins`` switch so a headless browser needs no login; the
   trainops plugin mounts the report app at ``/trainops`` as on any deployment.
3. Opens ``/trainops/`` (the home page), ``/trainops/report?uri=<the run's job.json>`` (its
   top, and its charts cut from a tall screenshot), ``/trainops/report?uri=<the newest
   version's card.json>`` and ``/trainops/fleet`` in headless Chromium and writes
   ``docs/img/home.png``, ``report.png``, ``charts.png``, ``card.png`` and ``fleet.png``,
   reduced to at most 256 colours (the pages are flat colours, so nothing visible is lost and
   each file stays well under 300 KB). ``--shots card charts`` takes only those.

Not a test: it needs Chromium and takes about three minutes.

    .venv/bin/python docs/img/screenshots.py --measure-run STORAGE_ROOT/runs/<dag>/<run>/train/job.json

measures instead how tall a stored run's report is at a 1,400 px wide window (the issue's aim:
under 3,000 px): the page exactly as the report app's ``GET /report`` renders it
(:func:`trainops.reports.app.report_page`, without Airflow's login, with the run's storage
root served), in headless Chromium, which prints the document's height (a measuring script is
added to a copy of the page: the app's pages run none). Seconds, no demo and no API server.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]
# (file, path under the API server, window width x height): tall enough for the section shown
SHOTS = (
    ("home.png", "home", (1280, 1100)),
    ("report.png", "report", (1280, 1380)),
    ("charts.png", "report", (1280, 4000)),  # kept from the loss chart down: CHARTS_CROP
    ("card.png", "card", (1280, 1300)),
    ("fleet.png", "fleet", (1280, 900)),
)
# The charts' screenshot: from just above the first pixel of the loss chart's first colour
# (#0969da, which only the charts use), this many rows. A URL fragment (#loss) does not scroll
# a headless screenshot, and the page has no script to do it.
CHARTS_CROP = ((0x09, 0x69, 0xDA), 130, 1000)


def demo_env(demo_dir: Path) -> dict[str, str]:
    """The environment of the demo and the API server: everything under ``demo_dir``."""
    home = demo_dir / "airflow"
    home.mkdir(parents=True, exist_ok=True)
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(PROJECT / "plugins"), str(PROJECT)]),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(PROJECT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
        "TRAINOPS_STORAGE_ROOT": f"file://{demo_dir / 'storage'}",
        "TRAINOPS_LOCAL_STATE": str(demo_dir / "local"),
    }


def demo_card(demo_dir: Path) -> Path:
    """The ``card.json`` of the newest version the demo promoted under ``demo_dir``."""
    cards = (demo_dir / "storage" / "models" / "demo-lm" / "versions").glob("*/card.json")
    return max(cards, key=lambda card: int(card.parent.name))


def demo_jobs(demo_dir: Path) -> list[Path]:
    """The ``job.json`` of each demo run under ``demo_dir``, oldest first."""
    return sorted((demo_dir / "storage" / "runs" / "trainops_demo").glob("*/train/job.json"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(url: str, server: subprocess.Popen, timeout_s: float = 180.0) -> None:
    """Until ``url`` answers 200; fails naming the URL when the server exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the API server exited with {server.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise SystemExit(f"{url} did not answer within {timeout_s:.0f} s")


def shoot(chromium: str, url: str, target: Path, size: tuple[int, int], crop=None) -> None:
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [
                chromium,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={profile}",
                f"--window-size={size[0]},{size[1]}",
                f"--screenshot={target}",
                url,
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=120,
        )
    before = target.stat().st_size
    target.write_bytes(palette_png(target.read_bytes(), crop))
    print(
        f"{target}: {before // 1024} KB from the browser, {target.stat().st_size // 1024} KB with a palette"
    )


# ----------------------------------------------------------------------------- PNG to 256 colours
# No image library is among the project's dependencies, so the screenshots are reduced here with
# zlib and numpy: decode the browser's 8-bit RGB(A) PNG, keep its 256 most frequent colours (a
# page of flat colours and anti-aliased text has few that matter), map every other colour to the
# nearest of them, and write an indexed PNG.


def _chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG file")
    out, at = [], 8
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        out.append((data[at + 4 : at + 8], data[at + 8 : at + 8 + length]))
        at += 12 + length
    return out


def _unfilter(raw: bytes, width: int, height: int, bpp: int):
    """The pixel bytes of a non-interlaced 8-bit PNG, its five row filters undone."""
    import numpy as np

    stride = width * bpp
    rows = np.zeros((height, stride), dtype=np.uint8)
    previous = np.zeros(stride, dtype=np.uint8)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], np.frombuffer(raw, np.uint8, stride, start + 1)
        if kind == 0:
            row = line.copy()
        elif kind == 1:  # Sub: a running sum per channel, modulo 256
            row = (np.cumsum(line.reshape(width, bpp).astype(np.uint32), axis=0) % 256).astype(np.uint8)
            row = row.reshape(stride)
        elif kind == 2:  # Up
            row = line + previous
        else:  # Average (3) and Paeth (4) depend on the byte to the left: byte by byte
            out, up = bytearray(line.tobytes()), previous.tobytes()
            for i in range(stride):
                a = out[i - bpp] if i >= bpp else 0
                b = up[i]
                if kind == 3:
                    out[i] = (out[i] + (a + b) // 2) & 255
                else:
                    c = up[i - bpp] if i >= bpp else 0
                    pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                    out[i] = (out[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
            row = np.frombuffer(bytes(out), np.uint8)
        rows[y] = row
        previous = row
    return rows.reshape(height, width, bpp)


def palette_png(data: bytes, crop: tuple[tuple[int, int, int], int, int] | None = None) -> bytes:
    """``data`` (an 8-bit RGB or RGBA PNG, opaque) as an indexed PNG of at most 256 colours;
    with ``crop`` ``(colour, above, rows)``, only ``rows`` rows from ``above`` rows over the
    first row holding ``colour`` (the whole picture when no row does)."""
    import numpy as np

    chunks = _chunks(data)
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    if depth != 8 or colour not in (2, 6) or interlace:
        return data  # not what a browser writes: leave it as it is
    raw = zlib.decompress(b"".join(body for kind, body in chunks if kind == b"IDAT"))
    pixels = _unfilter(raw, width, height, 4 if colour == 6 else 3)[:, :, :3]
    if crop is not None:
        found = np.nonzero((pixels == np.array(crop[0], dtype=np.uint8)).all(axis=2).any(axis=1))[0]
        if found.size:
            start = max(0, int(found[0]) - crop[1])
            pixels = pixels[start : start + crop[2]]
            height = pixels.shape[0]
    pixels = pixels.reshape(-1, 3)
    keys = (pixels[:, 0].astype(np.uint32) << 16) | (pixels[:, 1].astype(np.uint32) << 8) | pixels[:, 2]
    colours, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    rgb = np.stack([(colours >> 16) & 255, (colours >> 8) & 255, colours & 255], axis=1).astype(np.int32)
    kept = np.argsort(-counts, kind="stable")[:256]
    nearest = np.empty(len(colours), dtype=np.uint8)
    for start in range(0, len(colours), 4096):  # each colour to the closest kept one
        block = rgb[start : start + 4096, None, :] - rgb[None, kept, :]
        nearest[start : start + 4096] = np.argmin((block * block).sum(axis=2), axis=1)
    index = nearest[inverse.reshape(-1)].reshape(height, width)
    lines = np.zeros((height, width + 1), dtype=np.uint8)  # filter 0 before each row
    lines[:, 1:] = index

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 3, 0, 0, 0)
    return b"".join(
        [
            b"\x89PNG\r\n\x1a\n",
            chunk(b"IHDR", header),
            chunk(b"PLTE", rgb[kept].astype(np.uint8).tobytes()),
            chunk(b"IDAT", zlib.compress(lines.tobytes(), 9)),
            chunk(b"IEND", b""),
        ]
    )


# ----------------------------------------------------------------------------- page height
MEASURE_WIDTH = 1400  # px: the window a report page is measured at
_HEIGHT_SCRIPT = (
    "<script>document.body.setAttribute('data-page-height',"
    "String(document.documentElement.scrollHeight))</script>"
)


def page_height(chromium: str, html: str, width: int = MEASURE_WIDTH) -> int:
    """The height in CSS pixels of the page ``html`` laid out in a ``width`` px wide window
    (folded ``<details>`` closed, as a reader first sees it)."""
    with tempfile.TemporaryDirectory() as scratch:
        page = Path(scratch) / "page.html"
        page.write_text(html.replace("</body>", _HEIGHT_SCRIPT + "</body>", 1), encoding="utf-8")
        dom = subprocess.run(
            [
                chromium,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={Path(scratch) / 'profile'}",
                f"--window-size={width},900",
                "--dump-dom",
                page.as_uri(),
            ],
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
    found = re.search(r'data-page-height="(\d+)"', dom)
    if found is None:
        raise SystemExit("Chromium printed no page height (did the page load?)")
    return int(found.group(1))


def rendered_report(job_json: Path) -> str:
    """The report page of the stored ``job_json`` as the report app serves it, its run's
    storage root (the folder above ``runs/``) being the served root."""
    parts = job_json.resolve().parts
    if "runs" not in parts:
        raise SystemExit(f"{job_json} is not below a storage root's runs/ folder")
    root = Path(*parts[: len(parts) - 1 - parts[::-1].index("runs")])
    os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="trainops-measure-airflow-"))
    os.environ["TRAINOPS_STORAGE_ROOT"] = root.as_uri()
    os.environ.pop("TRAINOPS_REPORT_ROOTS", None)
    # The report app loads FastAPI and Airflow's API modules: only this command needs them.
    from trainops.reports.app import allowed_roots, check_report_uri, report_page

    roots = allowed_roots()
    return report_page(check_report_uri(job_json.resolve().as_uri(), roots), roots, None)


def measure_run(chromium: str, job_json: Path, width: int = MEASURE_WIDTH) -> int:
    """Print and return the height of ``job_json``'s report page at ``width`` px."""
    html = rendered_report(job_json)
    height = page_height(chromium, html, width)
    print(
        f"{job_json}: the report page is {height:,} px tall at {width:,} px wide ({len(html):,} bytes of HTML)"
    )
    return height


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo-dir", type=Path, help="a folder for the demo (reused when it holds a run)")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument(
        "--runs", type=int, default=2, help="demo runs to have (the fleet page's trend needs two)"
    )
    names = [name.removesuffix(".png") for name, _, _ in SHOTS]
    parser.add_argument("--shots", nargs="+", choices=names, default=names, help="the screenshots to take")
    parser.add_argument(
        "--measure-run",
        type=Path,
        metavar="JOB_JSON",
        help="only measure the height of this stored run's report page, at --width px",
    )
    parser.add_argument(
        "--width", type=int, default=MEASURE_WIDTH, help="the window's width for --measure-run"
    )
    args = parser.parse_args(argv)
    if args.measure_run is not None:
        measure_run(args.chromium, args.measure_run, args.width)
        return 0
    demo_dir = (args.demo_dir or Path(tempfile.mkdtemp(prefix="trainops-screenshots-"))).resolve()
    env = demo_env(demo_dir)
    while len(demo_jobs(demo_dir)) < args.runs:
        before = len(demo_jobs(demo_dir))
        seed = ["--seed", "2"] if before else []  # another model: v2 (the same seed makes no new version)
        subprocess.run([sys.executable, "-m", "trainops", "demo", *seed], env=env, cwd=PROJECT, check=True)
        if len(demo_jobs(demo_dir)) == before:
            raise SystemExit(f"the demo wrote no training run under {demo_dir}")
    job = demo_jobs(demo_dir)[-1]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "airflow", "api-server", "--apps", "core", "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        cwd=PROJECT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(f"{base}/api/v2/monitor/health", server)
        report = f"{base}/trainops/report?uri={urllib.parse.quote(job.as_uri(), safe='')}"
        card = f"{base}/trainops/report?uri={urllib.parse.quote(demo_card(demo_dir).as_uri(), safe='')}"
        urls = {
            "home": f"{base}/trainops/",
            "report": report,
            "card": card,
            "fleet": f"{base}/trainops/fleet",
        }
        for name, path, size in SHOTS:
            if name.removesuffix(".png") not in args.shots:
                continue
            wait_for(urls[path], server)
            shoot(args.chromium, urls[path], OUT / name, size, CHARTS_CROP if name == "charts.png" else None)
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)
    print(f"demo run: {job}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
