"""Chromium plays ``streamvae serve``'s page on a machine without libx264, libx265 and AAC: AV1 or VP9 with
Opus, over HTTP and through the WebSocket's Media Source buffer, with sound.

AV1: the server is the command itself, in a child process whose PyAV cannot open those encoders
(``tests/_absent_encoders``). VP9 (SVT-AV1 absent too): the same app in this process, under uvicorn, with
the same PyAV patch (a second child would cost its ~10 s start again). The browser and its DevTools client
are tests/_browser.py's.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamvae.server import create_app
from tests._absent_encoders import NO_GPL_NO_AAC, absent_encoders, child_environment
from tests._browser import FPS, WAIT_FOR_END, WAIT_FOR_WS_PLAYBACK, end_process, first_line, page_at
from tests._server import running_server

pytestmark = pytest.mark.browser

#: what each machine lacks → how the codec string of the rung that opens there starts
MACHINES = {"av1": (NO_GPL_NO_AAC, "av01."), "vp9": ((*NO_GPL_NO_AAC, "libsvtav1"), "vp09.")}
FRAMES, SIZE, STEP_DELAY = 17, 64, 0.1
#: seconds the server may take to start before the test fails instead of hanging
START_GUARD = 120


@contextlib.contextmanager
def streamvae_serve(absent: tuple[str, ...]) -> Iterator[str]:
    """``streamvae serve`` in a child process whose PyAV lacks ``absent``; yields its URL once it listens."""
    with socket.socket() as probe:  # a free port for the child (the command takes a number)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = Path(sys.executable).with_name("streamvae")
    argv = [str(command)] if command.exists() else [sys.executable, "-m", "streamvae"]
    process = subprocess.Popen(
        [*argv, "serve", "--port", str(port)],
        env=child_environment(absent),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first_line(process, lambda line: "Uvicorn running on" in line, timeout=START_GUARD, what="serve")
        yield f"http://127.0.0.1:{port}"
    finally:
        end_process(process, grace=30)


@contextlib.contextmanager
def served(machine: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The demo server of ``machine``: AV1 from ``streamvae serve``, VP9 from its app in this process."""
    absent, _ = MACHINES[machine]
    if machine == "av1":
        with streamvae_serve(absent) as url:
            yield url
        return
    absent_encoders(monkeypatch, absent)
    with running_server(create_app(session_options={"video_codec": "auto"})) as url:  # serve's options
        yield url


@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_chromium_plays_the_served_rung_with_opus_over_http_and_the_websocket(
    chromium: str,
    machine: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, prefix = MACHINES[machine]
    query = f"frames={FRAMES}&size={SIZE}&seed=0&delay={STEP_DELAY}"
    with served(machine, monkeypatch) as url:
        with page_at(chromium, f"{url}/?{query}") as devtools:
            http = devtools.evaluate(WAIT_FOR_END)
        with page_at(chromium, f"{url}/?{query}&transport=ws&audio=1") as devtools:
            playing = devtools.evaluate(WAIT_FOR_WS_PLAYBACK)
            ws = devtools.evaluate(WAIT_FOR_END)
            page_state = devtools.evaluate("window.streamvaeState")
            heard = devtools.evaluate('document.getElementById("video").webkitAudioDecodedByteCount')
    # HTTP: the plain element plays the fragmented MP4 to its end.
    assert http["error"] is None and http["ended"]
    assert (http["videoWidth"], http["videoHeight"]) == (SIZE, SIZE)
    assert http["duration"] == pytest.approx(FRAMES / FPS, abs=1.5 / FPS)
    # The WebSocket: the Media Source buffer took the server's codec string, video and Opus, and played both.
    assert page_state["codecs"].startswith(prefix) and page_state["codecs"].endswith(", opus")
    assert page_state["audio"] and heard > 0
    assert playing["position"] > 0  # currentTime advanced
    assert ws["error"] is None and ws["ended"] and page_state["error"] is None
    assert page_state["done"] and page_state["frames"] == FRAMES
    assert ws["duration"] == pytest.approx(FRAMES / FPS, abs=1.5 / FPS)
