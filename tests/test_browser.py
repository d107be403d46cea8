"""A real browser plays the streamed video: headless Debian chromium, driven over the DevTools protocol
(``tests/_browser``).

Skipped only where chromium is missing outside CI; in CI (``CI=true``) a missing chromium fails the test,
since ``.ci/run`` installs it. Set ``STREAMVAE_SCREENSHOT=docs/server.png`` to refresh the README's picture.
"""

from __future__ import annotations

import base64
import io
import os
from pathlib import Path

import av
import httpx
import pytest

from streamvae.server import create_app
from tests._browser import FPS, WAIT_FOR_END, WAIT_FOR_WS_PLAYBACK, page_at
from tests._server import EventLog, running_server

pytestmark = pytest.mark.browser

FRAMES, SIZE = 33, 128


def test_chromium_plays_the_streamed_video_to_its_end(chromium: str, tmp_path: Path) -> None:
    events = EventLog()
    with (
        running_server(create_app(on_event=events)) as url,
        page_at(chromium, f"{url}/?frames={FRAMES}&size={SIZE}&seed=0") as devtools,
    ):
        state = devtools.evaluate(WAIT_FOR_END)
        screenshot = base64.b64decode(devtools.call("Page.captureScreenshot", format="png")["data"])
    events.wait_for("completed")
    assert state["error"] is None
    assert state["ended"] and state["readyState"] >= 2
    # empty_moov carries no duration: the element learns it from the fragments, so compare at the end.
    # For a stream without Content-Length chromium's figure is within a frame of the true one (it counts
    # the last frame's start, and x264's B-frame delay shifts it when no edit list compensates).
    assert state["duration"] == pytest.approx(FRAMES / FPS, abs=1.5 / FPS)
    assert (state["videoWidth"], state["videoHeight"]) == (SIZE, SIZE)
    assert screenshot.startswith(b"\x89PNG")
    (tmp_path / "server.png").write_bytes(screenshot)
    target = os.environ.get("STREAMVAE_SCREENSHOT")
    if target:
        Path(target).write_bytes(screenshot)


# 33 steps a quarter second apart keep the response open ~8 s: chromium buffers a while before it plays.
REALTIME_FRAMES, REALTIME_SIZE, REALTIME_DELAY = 129, 64, 0.25
# Resolves once the video's playback position has moved past its start.
WAIT_FOR_PLAYBACK = """
new Promise((resolve, reject) => {
  const video = document.getElementById("video");
  const check = () => { if (video.currentTime > 0) resolve(video.currentTime); };
  video.addEventListener("timeupdate", check);
  video.addEventListener("error", () => reject(new Error("video error: " + video.error.message)));
  setTimeout(() => reject(new Error("no playback in 60 s: readyState " + video.readyState)), 60000);
  check();
})
"""


def test_chromium_plays_a_realtime_stream_before_its_response_ends(chromium: str) -> None:
    query = f"frames={REALTIME_FRAMES}&size={REALTIME_SIZE}&realtime=1&delay={REALTIME_DELAY}"
    events = EventLog()
    with running_server(create_app(on_event=events)) as url:
        with page_at(chromium, f"{url}/?{query}") as devtools:
            position = devtools.evaluate(WAIT_FOR_PLAYBACK)
            # The server sends "completed" only after the last byte: none yet means the response is open.
            endings_before_playback = [
                e.kind for e in events.events if e.kind != "queued" and e.kind != "started"
            ]
            state = devtools.evaluate(WAIT_FOR_END)
        events.wait_for("completed")
        body = httpx.get(f"{url}/video.mp4?{query}", timeout=120).content
    assert position > 0 and endings_before_playback == []
    assert state["error"] is None and state["ended"]
    assert events.events[0].request.realtime
    # One fragment per chunk, a keyframe a second: more fragments than keyframes, so some fragment after
    # the first starts on a frame that is not a keyframe (and the browser played it all the same).
    fragments, keyframes = _fragments_and_keyframes(body)
    assert fragments > keyframes >= 1


def _fragments_and_keyframes(body: bytes) -> tuple[int, int]:
    """The ``moof`` boxes at the top level of a fragmented MP4, and its keyframes (PyAV)."""
    fragments, offset = 0, 0
    while offset < len(body):
        size = int.from_bytes(body[offset : offset + 4], "big")
        fragments += body[offset + 4 : offset + 8] == b"moof"
        assert size >= 8, f"a box of {size} bytes at {offset}"
        offset += size
    with av.open(io.BytesIO(body)) as container:
        packets = [p for p in container.demux(container.streams.video[0]) if p.size]
        return fragments, sum(p.is_keyframe for p in packets)


# 25 latent steps a quarter second apart keep the session generating ~6 s, the video 6 s long.
WS_FRAMES, WS_SIZE, WS_STEP_DELAY = 97, 64, 0.25


def test_chromium_plays_the_websocket_stream_with_sound_while_it_is_steered(chromium: str) -> None:
    app = create_app()
    query = f"transport=ws&frames={WS_FRAMES}&size={WS_SIZE}&seed=0&delay={WS_STEP_DELAY}&audio=1"
    with running_server(app) as url, page_at(chromium, f"{url}/?{query}") as devtools:
        playing = devtools.evaluate(WAIT_FOR_WS_PLAYBACK)
        event_id = devtools.evaluate('window.streamvaeSteer("a red fox", 0)')  # the page's prompt box
        state = devtools.evaluate(WAIT_FOR_END)
        page_state = devtools.evaluate("window.streamvaeState")
        heard = devtools.evaluate('document.getElementById("video").webkitAudioDecodedByteCount')
    # Steered while it played: the interaction was queued and a later piece showed it.
    (steered,) = page_state["steered"]
    assert event_id == steered["eventId"] == "p1" and steered["queued"]
    assert steered["shownMs"] is not None and steered["shownMs"] > 0
    assert 0 < steered["frame"] < WS_FRAMES and page_state["errors"] == []
    # It played with sound: the Media Source buffer took AAC beside H.264, and chromium decoded it.
    assert page_state["audio"] and page_state["codecs"].endswith("mp4a.40.2")
    assert heard > 0
    # The position moved while the server was still generating: session.done had not come yet.
    assert playing["position"] > 0 and not playing["done"]
    assert playing["chunks"] >= 1
    assert state["error"] is None and state["ended"]
    assert (state["videoWidth"], state["videoHeight"]) == (WS_SIZE, WS_SIZE)
    # Every frame arrived and played: the metadata counts them, the buffer's duration spans them.
    assert page_state["error"] is None and page_state["done"] and page_state["transport"] == "ws"
    assert page_state["frames"] == WS_FRAMES
    assert state["duration"] == pytest.approx(WS_FRAMES / FPS, abs=1.5 / FPS)
    # It played along as the session generated: partway through the video when session.done came.
    assert 0 < page_state["positionAtDone"] < state["duration"]
    assert 0 < page_state["firstFragmentMs"] <= page_state["firstFrameMs"]
