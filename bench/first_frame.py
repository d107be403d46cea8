"""First painted frame in a browser: ``<video src="/video.mp4">`` (HTTP) vs the WebSocket into Media Source.

The project's goal: the page paints its first frame within 250 ms of the first fragment arriving. Headless
chromium (``/usr/bin/chromium``, driven over the DevTools protocol as ``tests/_browser.py`` drives it)
opens the app's page for each request and transport, their order alternating between repetitions, and
reads the page's own timing (``window.streamvaeState``, in ms from the page's request):

- first fragment: over the WebSocket, the first binary frame's arrival; over HTTP, the response's
  ``responseStart`` in the resource timing (the server sends its status line with the first fragment);
- first frame: ``requestVideoFrameCallback``'s first call (the first frame handed to the compositor).

The server side is the app's ``/stats`` latency for the HTTP requests (decode start to first fragment
holding a frame, median). Both transports decode the demo VAE's seeded latent of the same frames and size:
HTTP decodes it whole, the WebSocket's stand-in generator feeds it a latent frame a step, back to back.

    .venv/bin/python bench/first_frame.py --repeats 5
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))
from _report import write_section

from streamvae.server import create_app
from tests._browser import WAIT_FOR_END, DevTools, headless_chromium
from tests._server import running_server

CONFIGS = ((33, 128), (65, 256))  # (frames, size)
TRANSPORTS = ("http", "ws")
GOAL_MS = 250.0


def _run(devtools: DevTools, url: str, transport: str, frames: int, size: int) -> dict[str, Any]:
    """One page load in ``transport``, played to its end; the page's state."""
    devtools.call("Page.navigate", url=f"{url}/?transport={transport}&frames={frames}&size={size}&seed=0")
    devtools.wait_for_event("Page.loadEventFired")
    ended = devtools.evaluate(WAIT_FOR_END)
    state: dict[str, Any] = devtools.evaluate("window.streamvaeState")
    if ended["error"] or state["error"] or state["firstFragmentMs"] is None or state["firstFrameMs"] is None:
        raise RuntimeError(f"{transport} {frames}×{size}: {ended} {state}")
    return state


def _median(values: list[float]) -> float:
    return statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-write", action="store_true", help="print the table, leave the docs alone")
    args = parser.parse_args()
    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("chromium is not installed (apt-get install chromium)")
    results: dict[tuple[int, int, str], list[dict[str, Any]]] = {}
    server_ms: dict[tuple[int, int], float | None] = {}
    with tempfile.TemporaryDirectory() as profile, headless_chromium(chromium, Path(profile)) as address:
        target = next(t for t in httpx.get(f"{address}/json/list", timeout=30).json() if t["type"] == "page")
        devtools = DevTools(target["webSocketDebuggerUrl"])
        devtools.call("Page.enable")
        for frames, size in CONFIGS:
            with running_server(create_app()) as url:  # an app per request: /stats counts its own
                _run(devtools, url, "http", frames, size)  # warm-up: the page, the codec, the threads
                _run(devtools, url, "ws", frames, size)
                for repeat in range(args.repeats):
                    order = TRANSPORTS if repeat % 2 == 0 else TRANSPORTS[::-1]
                    for transport in order:
                        state = _run(devtools, url, transport, frames, size)
                        results.setdefault((frames, size, transport), []).append(state)
                        print(
                            f"{frames}×{size} {transport:4} fragment {state['firstFragmentMs']:7.1f} ms"
                            f"  frame {state['firstFrameMs']:7.1f} ms",
                            flush=True,
                        )
                latency = httpx.get(f"{url}/stats", timeout=30).json()["latency"]
                median = latency.get("first_fragment_median")
                server_ms[(frames, size)] = None if median is None else median * 1000
        devtools.close()

    rows = []
    for frames, size in CONFIGS:
        for transport in TRANSPORTS:
            states = results[(frames, size, transport)]
            fragment = _median([s["firstFragmentMs"] for s in states])
            frame = _median([s["firstFrameMs"] for s in states])
            gaps = [s["firstFrameMs"] - s["firstFragmentMs"] for s in states]
            gap, worst = _median(gaps), max(gaps)
            server = server_ms[(frames, size)] if transport == "http" else None
            rows.append(
                f"| {frames} × {size}² | {'HTTP `<video src>`' if transport == 'http' else 'WebSocket + MSE'} "
                f"| {fragment:.0f} | {frame:.0f} | {gap:.0f} (max {worst:.0f}) "
                f"| {'yes' if worst <= GOAL_MS else 'no'} "
                f"| {'—' if server is None else f'{server:.0f}'} |"
            )
    table = "\n".join(
        [
            "| request | transport | first fragment (ms) | first painted frame (ms) "
            "| frame − fragment (ms) | within 250 ms | server first fragment (ms) |",
            "|---|---|---:|---:|---:|:---:|---:|",
            *rows,
        ]
    )
    body = f"""## First painted frame in the browser (`bench/first_frame.py`)

Goal: the page paints its first frame within {GOAL_MS:.0f} ms of the first fragment arriving. Headless
chromium opens the app's page for each request over HTTP (`<video src="/video.mp4?...">`) and over the
WebSocket (`/v1/realtime/video` into a Media Source buffer), the transports alternating, {args.repeats}
repeats each after a warm-up; medians of the page's own timing, in ms from the page's request (first
fragment: the first binary frame over the WebSocket, the response's `responseStart` over HTTP; first
painted frame: `requestVideoFrameCallback`). "within 250 ms" holds for the worst repeat. The server's
first fragment is `/stats` (decode start to the first fragment holding a frame, HTTP requests, median).

    .venv/bin/python bench/first_frame.py --repeats {args.repeats}

{table}
"""
    print(table)
    if not args.no_write:
        print(f"wrote {write_section('first_frame', body)}")


if __name__ == "__main__":
    main()
