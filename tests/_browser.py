"""A headless chromium driven over the DevTools protocol, and the page scripts that wait on its video.

The fixture ``chromium`` is defined here and imported into tests/conftest.py: it skips where chromium is
missing outside CI, and fails in CI (``CI=true``), since ``.ci/run`` installs it.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from itertools import count
from pathlib import Path
from typing import Any

import httpx
import pytest

CHROMIUM = shutil.which("chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--autoplay-policy=no-user-gesture-required",
    "--window-size=720,840",  # the whole page, status line included
    "--remote-debugging-port=0",  # chromium picks a free port and prints it
]
#: the frame rate of the demo app's videos
FPS = 16


@pytest.fixture(name="chromium")
def chromium_fixture(tmp_path: Path) -> Iterator[str]:
    """A headless chromium with a fresh profile; yields its DevTools HTTP address."""
    if CHROMIUM is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is missing in CI: .ci/run installs it with apt-get")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    with headless_chromium(CHROMIUM, tmp_path / "profile") as address:
        yield address


@contextlib.contextmanager
def headless_chromium(executable: str, profile: Path) -> Iterator[str]:
    """Run headless chromium with ``profile``; yields its DevTools HTTP address; ends it on leaving."""
    process = subprocess.Popen(
        [executable, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = first_line(
            process, lambda line: line.startswith("DevTools listening on ws://"), timeout=60, what="chromium"
        )
        host_port = line.split("ws://", 1)[1].split("/", 1)[0]
        yield f"http://{host_port}"
    finally:
        end_process(process, grace=20)


def first_line(
    process: subprocess.Popen[str], found: Callable[[str], bool], *, timeout: float, what: str
) -> str:
    """The first line of ``process``'s stderr that ``found`` takes (the rest is drained meanwhile, so the
    child never blocks on a full pipe); an AssertionError if it exits first or says nothing for
    ``timeout`` seconds (a hang guard)."""
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, name=f"{what}-stderr", daemon=True).start()
    seen: list[str] = []
    while True:
        line = lines.get(timeout=timeout)
        if line is None:
            raise AssertionError(f"{what} exited before it was ready:\n" + "".join(seen))
        seen.append(line)
        if found(line):
            return line


def end_process(process: subprocess.Popen[str], *, grace: float) -> None:
    """Terminate ``process``, kill it if it outlives ``grace`` seconds, and close its stderr pipe."""
    process.terminate()
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    assert process.stderr is not None
    process.stderr.close()


class DevTools:
    """A minimal DevTools protocol client for one page: commands, their replies, and waiting for an event."""

    def __init__(self, websocket_url: str) -> None:
        import websocket  # websocket-client

        self._socket = websocket.create_connection(websocket_url, timeout=120, suppress_origin=True)
        self._ids = count(1)
        self._events: list[dict[str, Any]] = []  # events that arrived while waiting for a reply

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        message_id = next(self._ids)
        self._socket.send(json.dumps({"id": message_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self._socket.recv())
            if reply.get("id") != message_id:
                self._events.append(reply)
                continue
            if "error" in reply:
                raise AssertionError(f"{method}: {reply['error']}")
            result: dict[str, Any] = reply["result"]
            return result

    def wait_for_event(self, method: str) -> dict[str, Any]:
        """The next event ``method`` (``Page.loadEventFired``), including one that came during a call."""
        while True:
            event = self._events.pop(0) if self._events else json.loads(self._socket.recv())
            if event.get("method") == method:
                params: dict[str, Any] = event.get("params", {})
                return params

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def close(self) -> None:
        self._socket.close()


# Resolves once the video has played to its end (the whole stream has arrived by then), with its state.
WAIT_FOR_END = """
new Promise((resolve, reject) => {
  const video = document.getElementById("video");
  const report = () => resolve({
    readyState: video.readyState, duration: video.duration, ended: video.ended,
    videoWidth: video.videoWidth, videoHeight: video.videoHeight,
    error: video.error && video.error.message, status: document.getElementById("status").textContent,
  });
  if (video.ended) { report(); return; }
  video.addEventListener("ended", report);
  video.addEventListener("error", () => reject(new Error("video error: " + video.error.message)));
  setTimeout(() => reject(new Error("the video did not end in 90 s: readyState " + video.readyState)), 90000);
})
"""


@contextlib.contextmanager
def page_at(chromium: str, address: str) -> Iterator[DevTools]:
    """Chromium's page navigated to ``address`` and loaded, over the DevTools protocol; closed after."""
    targets = httpx.get(f"{chromium}/json/list", timeout=30).json()
    page = next(t for t in targets if t["type"] == "page")
    devtools = DevTools(page["webSocketDebuggerUrl"])
    try:
        devtools.call("Page.enable")
        devtools.call("Page.navigate", url=address)
        devtools.wait_for_event("Page.loadEventFired")
        yield devtools
    finally:
        devtools.close()


# Resolves once the video's playback position has moved past its start, with what the page knew then.
WAIT_FOR_WS_PLAYBACK = """
new Promise((resolve, reject) => {
  const video = document.getElementById("video");
  const check = () => {
    const state = window.streamvaeState;
    if (state.error) reject(new Error("page error: " + state.error));
    if (video.currentTime > 0) resolve({position: video.currentTime, done: state.done, chunks: state.chunks});
  };
  video.addEventListener("timeupdate", check);
  video.addEventListener("error", () => reject(new Error("video error: " + video.error.message)));
  setTimeout(() => reject(new Error("no playback in 60 s: readyState " + video.readyState)), 60000);
  check();
})
"""


# ---------------------------------------------------------------------------------------------------------
# hls.js: a player of the app's Low-Latency HLS playlists (installed by the Makefile, never fetched here)
# ---------------------------------------------------------------------------------------------------------

#: hls.js as the Makefile installs it (npm, into the project's own folder); the app serves it at GET /hls.js
HLS_JS = Path(__file__).resolve().parent.parent / ".hlsjs" / "node_modules" / "hls.js" / "dist" / "hls.min.js"


@pytest.fixture(name="hls_js")
def hls_js_fixture() -> Path:
    """hls.js's file; skips where it is missing outside CI, fails in CI (the Makefile installs it)."""
    if not HLS_JS.is_file():
        if os.environ.get("CI") == "true":
            pytest.fail(f"hls.js is missing in CI: the Makefile installs it ({HLS_JS})")
        pytest.skip("hls.js is not installed (make, or npm install --prefix .hlsjs hls.js@1.7)")
    return HLS_JS


#: the hls.js settings the app's page plays with (src/streamvae/server/page.html), so that the tests and
#: bench/broadcast.py play what a user gets: ``lowLatencyMode``, and :data:`HLS_LOW_LATENCY`
HLS_CONFIG: dict[str, Any] = {"lowLatencyMode": True}

#: The app's page (its ``holdNearTheEdge`` is read from it, never copied).
PAGE = Path(__file__).resolve().parent.parent / "src" / "streamvae" / "server" / "page.html"


def page_function(name: str) -> str:
    """The JavaScript function ``name`` of the app's page, as the page has it (dedented)."""
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    first = next(i for i, line in enumerate(lines) if line.lstrip().startswith(f"function {name}("))
    indent = lines[first][: len(lines[first]) - len(lines[first].lstrip())]
    last = next(i for i in range(first + 1, len(lines)) if lines[i] == f"{indent}}}")
    return "\n".join(line.removeprefix(indent) for line in lines[first : last + 1])


#: The page's function that holds hls.js near the live edge (see its comment in page.html): hls.js aims at
#: PART-HOLD-BACK behind the edge but begins up to a segment back and never makes that up, so it plays at
#: 1.5× while more than a part behind its target with a part buffered, and a stall adds one part to its
#: target (``liveSyncOnStallIncrease``), not 1 s. The tests and bench/broadcast.py play with it, so they
#: play what a user of the page gets.
HLS_LOW_LATENCY = page_function("holdNearTheEdge")


def play_hls(source: str, config: dict[str, Any] | None = None) -> str:
    """A page script that loads hls.js from the app (``GET /hls.js``), then plays ``source`` (a playlist's
    URL) in a new muted ``<video>`` with ``config`` (default :data:`HLS_CONFIG` and :data:`HLS_LOW_LATENCY`,
    the page's; a ``config`` of its own is taken as it is); resolves
    with hls.js's version once playback is asked for. What the player does is kept in ``window.hlsState``:
    every error, the last playlist's ``live``, part target, hold-back and first segment's duration, each
    media fragment or part loaded, where it began to play, its stalls (``waiting`` events), its jumps
    (``seeking`` events) once playing, ``ended``."""
    script = """
new Promise((resolve, reject) => {
  const script = document.createElement("script");
  script.src = "/hls.js";
  script.onerror = () => reject(new Error("GET /hls.js did not load"));
  script.onload = () => {
    if (!Hls.isSupported()) { reject(new Error("hls.js: no Media Source in this browser")); return; }
    const video = document.createElement("video");
    video.id = "hls-video"; video.muted = true;
    document.body.appendChild(video);
    const state = window.hlsState = {
      version: Hls.version, errors: [], fatal: null, live: null, partTarget: null, partHoldBack: null,
      segment: null, loaded: [], ended: false, playingAt: null, stalls: 0, seeks: 0,
    };
    const hls = window.hls = new Hls(CONFIG);
    LOW_LATENCY
    hls.on(Hls.Events.ERROR, (_, data) => {
      state.errors.push(data.details);
      if (data.fatal) state.fatal = data.type + ": " + data.details;
    });
    hls.on(Hls.Events.LEVEL_LOADED, (_, data) => {
      state.live = data.details.live;
      state.partTarget = data.details.partTarget;
      state.partHoldBack = data.details.partHoldBack;
      if (data.details.fragments.length) state.segment = data.details.fragments[0].duration;
    });
    hls.on(Hls.Events.FRAG_LOADED, (_, data) => {
      if (data.frag.sn === "initSegment") return;
      const part = data.part;
      state.loaded.push({
        url: part ? part.url : data.frag.url, sn: data.frag.sn, part: part ? part.index : null,
        independent: part ? part.independent : null,
      });
    });
    hls.on(Hls.Events.MANIFEST_PARSED, () => {
      video.play().catch((error) => state.errors.push("play: " + error.message));
    });
    video.addEventListener("playing", () => {
      if (state.playingAt === null) state.playingAt = video.currentTime;
    });
    video.addEventListener("ended", () => { state.ended = true; });
    video.addEventListener("waiting", () => { if (state.playingAt !== null) state.stalls += 1; });
    video.addEventListener("seeking", () => { if (state.playingAt !== null) state.seeks += 1; });
    hls.loadSource(SOURCE);
    hls.attachMedia(video);
    resolve(Hls.version);
  };
  document.head.appendChild(script);
})
"""
    return (
        script.replace("SOURCE", json.dumps(source))
        .replace("CONFIG", json.dumps(HLS_CONFIG if config is None else config))
        .replace(
            "LOW_LATENCY", f"{HLS_LOW_LATENCY}\n    holdNearTheEdge(hls, video);" if config is None else ""
        )
    )


def hls_playing(video_id: str) -> str:
    """A page script that resolves once the hls.js player's position has moved a quarter second past where
    it began to play, with that position, where it began and the video's ``state`` in ``GET /v1/videos``
    asked right then (``live``: it played before the generation ended). A fatal hls.js error rejects it."""
    return """
new Promise((resolve, reject) => {
  const video = document.getElementById("hls-video");
  const state = window.hlsState;
  let done = false;
  const check = async () => {
    if (done) return;
    if (state.fatal) { done = true; reject(new Error("hls.js: " + state.fatal)); return; }
    if (state.playingAt === null || video.currentTime < state.playingAt + 0.25) return;
    done = true;
    const position = video.currentTime;
    const listed = (await (await fetch("/v1/videos")).json()).videos.find((v) => v.id === VIDEO_ID);
    resolve({
      position, playingAt: state.playingAt, state: listed && listed.state, frames: listed && listed.frames,
    });
  };
  video.addEventListener("timeupdate", check);
  // a hang guard: a player that never plays fails the test instead of hanging it
  setTimeout(() => {
    if (!done) reject(new Error("hls.js did not play in 60 s: " + JSON.stringify(state)));
  }, 60000);
  check();
})
""".replace("VIDEO_ID", json.dumps(video_id))


# Resolves once the hls.js player's video has ended, with what the element and the player knew then.
HLS_ENDED = """
new Promise((resolve, reject) => {
  const video = document.getElementById("hls-video");
  const state = window.hlsState;
  const report = () => resolve({
    ended: video.ended, currentTime: video.currentTime, duration: video.duration,
    videoWidth: video.videoWidth, videoHeight: video.videoHeight,
    decodedFrames: video.getVideoPlaybackQuality().totalVideoFrames,
    error: video.error && video.error.message, hls: state,
  });
  if (video.ended) { report(); return; }
  video.addEventListener("ended", report);
  video.addEventListener("error", () => reject(new Error("video error: " + video.error.message)));
  // a hang guard: a player that never ends fails the test instead of hanging it
  setTimeout(() => reject(new Error("hls.js did not end in 90 s: " + JSON.stringify(state))), 90000);
})
"""
