"""hls.js plays the app's Low-Latency HLS playlist in a real browser: headless Debian chromium, driven over
the DevTools protocol (``tests/_browser``), hls.js 1.7 as the Makefile installs it (never fetched here).

The generation is a real-time request (``/video.mp4?realtime=1``: the stand-in generator takes a step every
``delay`` seconds, a latent frame of 4 frames a step, so the video is made at the pace it plays), and the
player joins it while it runs, as a second person would. The page is a tiny one of the test's own, at the
app's origin (its JSON list of videos): it loads hls.js from the app's ``GET /hls.js`` and plays
``/v1/videos/{id}/live.m3u8`` with the settings the app's page uses (``lowLatencyMode`` and its
``holdNearTheEdge``: tests/_browser.py's ``HLS_LOW_LATENCY``).

Skipped only where chromium or hls.js is missing outside CI; in CI (``CI=true``) either missing fails.
"""

from __future__ import annotations

import io
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
import av
import httpx
import pytest

import streamvae.server
from streamvae.server import create_app
from tests._browser import (  # noqa: F401
    FPS,
    HLS_ENDED,
    HLS_LOW_LATENCY,
    hls_js_fixture,
    hls_playing,
    page_at,
    play_hls,
)
from tests._hls import check_playlist
from tests._server import running_server

pytestmark = [pytest.mark.browser, pytest.mark.anyio]

# 41 steps a quarter second apart: the generation runs ~10 s, the video is 161 / 16 ≈ 10 s long.
FRAMES, SIZE, STEP_DELAY = 161, 64, 0.25
QUERY = f"/video.mp4?frames={FRAMES}&size={SIZE}&seed=0&realtime=1&delay={STEP_DELAY}"


def _video_id(response: httpx.Response) -> str:
    """The generation's id, from the ``Link`` header of its ``/video.mp4`` response."""
    match = re.fullmatch(r'</v1/videos/([^/]+)/live\.m3u8>; rel="alternate"; .*', response.headers["link"])
    assert match, response.headers["link"]
    return match.group(1)


async def _owned(
    client: httpx.AsyncClient, into: list[bytes], *, task_status: anyio.abc.TaskStatus[str]
) -> None:
    """The owner's request: the generation's id as soon as its response starts, then its whole body."""
    async with client.stream("GET", QUERY) as response:
        assert response.status_code == 200
        task_status.started(_video_id(response))
        into.extend([data async for data in response.aiter_raw()])


@asynccontextmanager
async def _generation(hls_js: Path) -> AsyncIterator[tuple[str, httpx.AsyncClient, str, list[bytes]]]:
    """A real-time generation on the app under uvicorn, its owner reading it in a task: the app's URL, a
    client of it, the video's id, and the owner's body (whole once the block has ended)."""
    body: list[bytes] = []
    with running_server(create_app(hls_js=hls_js)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client, anyio.create_task_group() as tasks:
            video_id = await tasks.start(_owned, client, body)
            yield url, client, video_id, body


def _watch(chromium: str, url: str, video_id: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """hls.js in chromium plays the video's live playlist: its version, what it knew once it played, and
    what it knew at the end (the DevTools calls block: the test runs this in a worker thread)."""
    with page_at(chromium, f"{url}/v1/videos") as devtools:
        version = devtools.evaluate(play_hls(f"/v1/videos/{video_id}/live.m3u8"))
        playing = devtools.evaluate(hls_playing(video_id))
        ended = devtools.evaluate(HLS_ENDED)
    return version, playing, ended


def _frames(data: bytes) -> tuple[int, bool]:
    """The frames ``data`` (a fragmented MP4) decodes to, and whether the first is a keyframe (PyAV)."""
    with av.open(io.BytesIO(data)) as container:
        packets = [p for p in container.demux(container.streams.video[0]) if p.size]
        first_is_key = bool(packets) and packets[0].is_keyframe
        decoded = sum(len(p.decode()) for p in packets)
        return decoded + len(container.streams.video[0].codec_context.decode(None)), first_is_key


def _check_hls_played(version: str, playing: dict[str, Any], ended: dict[str, Any]) -> None:
    """What both tests require of the player: hls.js 1.7, it played while the generation was live, it
    loaded parts (low latency, not whole segments only) and reached the end without a fatal error."""
    assert version.startswith("1.7."), version
    # The position moved while the app still listed the video as live: it played as it was made.
    assert playing["state"] == "live", playing
    assert playing["position"] >= playing["playingAt"] + 0.25
    assert 0 < playing["frames"] < FRAMES
    state = ended["hls"]
    assert state["fatal"] is None and ended["error"] is None, state
    assert any(loaded["part"] is not None for loaded in state["loaded"]), state["loaded"]
    assert state["partTarget"] and state["partHoldBack"] >= 3 * state["partTarget"]
    assert ended["ended"] and state["ended"]
    assert (ended["videoWidth"], ended["videoHeight"]) == (SIZE, SIZE)
    # The playlist spans the whole video: the element's duration is the video's (within a frame).
    assert ended["duration"] == pytest.approx(FRAMES / FPS, abs=1.5 / FPS)
    assert ended["currentTime"] == pytest.approx(ended["duration"], abs=1.5 / FPS)
    assert ended["decodedFrames"] > 0


async def test_hlsjs_plays_the_live_playlist_while_the_generation_runs_and_to_its_end(
    chromium: str, hls_js: Path
) -> None:
    async with _generation(hls_js) as (url, client, video_id, body):
        version, playing, ended = await anyio.to_thread.run_sync(_watch, chromium, url, video_id)
        # After the end: the playlist is a replay of the whole video, and passes Apple's rules.
        playlist = (await client.get(f"/v1/videos/{video_id}/live.m3u8")).text
    _check_hls_played(version, playing, ended)
    assert check_playlist(playlist).ended
    # The owner got every frame: the same generation the player watched.
    assert _frames(b"".join(body))[0] == FRAMES


async def test_a_late_joiner_starts_at_a_keyframe_and_plays(chromium: str, hls_js: Path) -> None:
    async with _generation(hls_js) as (url, client, video_id, body):
        playlist_url = f"/v1/videos/{video_id}/live.m3u8"
        # Blocking reload holds each until that segment is complete (asked one at a time: further ahead is
        # a 400): after segment 3 the player joins a video under way.
        held = None
        for sequence in range(4):
            reply = await client.get(playlist_url, params={"_HLS_msn": sequence})
            while reply.status_code == 503:  # the hold's bound passed first (a slow machine): ask again
                reply = await client.get(playlist_url, params={"_HLS_msn": sequence})
            assert reply.status_code == 200, reply.text
            held = check_playlist(reply.text, previous=held)
        assert held is not None and not held.ended and len(held.segments) >= 4  # 0 … 3 complete
        version, playing, ended = await anyio.to_thread.run_sync(_watch, chromium, url, video_id)
        # hls.js's first media bytes: a part or a segment past the start, and it begins with a keyframe.
        first = ended["hls"]["loaded"][0]
        init = (await client.get(f"/v1/videos/{video_id}/init.mp4")).content
        media = (await client.get(httpx.URL(url).join(first["url"]))).content
    _check_hls_played(version, playing, ended)
    assert first["sn"] >= 3, first
    frames, first_is_key = _frames(init + media)
    assert first_is_key and frames >= 1
    # A part (low latency) it began with is one the playlist marks INDEPENDENT; a whole segment starts so.
    assert first["part"] is None or first["independent"] is True, first
    # It began to play past the start: where it joined, not at the first frame.
    assert playing["playingAt"] > 0
    assert _frames(b"".join(body))[0] == FRAMES


def test_the_page_holds_hlsjs_near_the_edge_with_the_function_the_tests_play() -> None:
    # The tests and bench/broadcast.py read the page's own function (tests/_browser.py), and the page calls
    # it on the hls.js player it makes.
    assert HLS_LOW_LATENCY.startswith("function holdNearTheEdge(hls, video) {"), HLS_LOW_LATENCY
    assert HLS_LOW_LATENCY.endswith("}") and "liveSyncOnStallIncrease" in HLS_LOW_LATENCY
    page = (Path(streamvae.server.__file__).parent / "page.html").read_text()
    assert "holdNearTheEdge(hls, video);" in [line.strip() for line in page.splitlines()]
