"""Pictures of the built site as a reader sees it: the quickstart and a reference page, in headless chromium.

Run after ``make docs``: ``.venv/bin/python docs/screenshots.py``. It serves ``docs/_build/html`` on a free
local port and writes ``docs/screenshots/quickstart.png`` and ``docs/screenshots/reference.png``
(``.ci/run`` installs Debian's ``chromium``; elsewhere ``apt-get install chromium``).
"""

from __future__ import annotations

import argparse
import functools
import http.server
import subprocess
import tempfile
import threading
from pathlib import Path

DOCS = Path(__file__).resolve().parent
#: picture name → the page it shows, and how much of it (pixels from the top)
PAGES = {
    "quickstart": ("quickstart.html", 900),
    "reference": ("reference/streamvae.server.html", 1400),  # a module, then a class with its methods
}
#: flags that keep a headless chromium off the network and out of the user's profile
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


def screenshot(chromium: str, url: str, path: Path, *, width: int, height: int) -> None:
    """Write the viewport of ``url`` after it loaded to ``path``; a fresh profile each time."""
    with tempfile.TemporaryDirectory() as profile:
        command = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"]
        command += [f"--screenshot={path}", url]
        # A hang guard, not a time limit: a screenshot of a local page takes a few seconds.
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if result.returncode != 0 or not path.exists():
        raise SystemExit(f"chromium failed on {url} ({result.returncode}):\n{result.stderr}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", type=Path, default=DOCS / "_build" / "html")
    parser.add_argument("--out", type=Path, default=DOCS / "screenshots")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--width", type=int, default=1280)
    args = parser.parse_args()
    if not (args.site / "index.html").exists():
        raise SystemExit(f"no site at {args.site}: run `make docs` first")
    args.out.mkdir(parents=True, exist_ok=True)
    handler = functools.partial(QuietHandler, directory=str(args.site))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            for name, (page, height) in PAGES.items():
                path = args.out / f"{name}.png"
                url = f"http://127.0.0.1:{server.server_address[1]}/{page}"
                screenshot(args.chromium, url, path, width=args.width, height=height)
                print(f"{path}: {url}")
        finally:
            server.shutdown()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    """Serves the site without a log line per request."""

    def log_message(self, format: str, *args: object) -> None:
        pass


if __name__ == "__main__":
    main()
