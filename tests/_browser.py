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
