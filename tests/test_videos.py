"""The routes under ``/v1/videos`` (server/_videos.py) and the spectators' WebSocket: every generation of the
app is a video anyone can watch live (Low-Latency HLS, the MP4, a spectator) and replay after its end."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import torch
import websockets
from starlette.applications import Starlette
from starlette.types import Message

from streamvae.demo import demo_latent
from streamvae.server import create_app
from tests._hls import Playlist, check_playlist
from tests._media import count_frames
from tests._server import running_server
from tests._websocket import HANG, Client, connect

pytestmark = pytest.mark.anyio

#: frames of the videos made here: 1 + 4 × 8 at 16 fps, keyframes every 16 frames, so three segments
FRAMES = 33
SIZE = 32


class Gate:
    """A real-time generator the test steps: it yields the latent's next latent frame each time the test
    lets it (``step()``), so a test sees the generation live at a place it chose."""

    def __init__(self, frames: int = FRAMES) -> None:
        self.latent = demo_latent(frames, SIZE, 3)
        self._send, self._receive = anyio.create_memory_object_stream[int](math.inf)

    def step(self, count: int = 1) -> None:
        for _ in range(count):
            self._send.send_nowait(1)

    def finish(self) -> None:
        self.step(self.latent.shape[2])

    async def __call__(self, start: dict[str, Any]) -> AsyncIterator[torch.Tensor]:
        for index in range(self.latent.shape[2]):
            await self._receive.receive()
            yield self.latent[:, :, index : index + 1]


def client_of(app: Starlette) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test", timeout=HANG)


async def owner_started(client: Client) -> dict[str, Any]:
    """Start a WebSocket owner's session; its ``video.start`` (the first piece's binary frame is next)."""
    await client.send_json({"type": "session.start", "format": "m4s"})
    start = await client.receive_json()
    assert start["type"] == "video.start"
    assert (await client.receive_json())["type"] == "video.chunk_metadata"  # the first piece's bytes follow
    return start


async def read_owner(client: Client) -> bytes:
    """The owner's MP4 (after its ``video.start``), to its ``session.done``."""
    pieces: list[bytes] = []
    while (message := await client.receive_json())["type"] == "video.chunk_metadata":
        pieces.append(await client.receive_bytes())
    assert message["type"] == "session.done", message
    return b"".join(pieces)


class Held:
    """One GET sent to the app at the ASGI level, to see a held request: :attr:`holding` is set once the
    endpoint listens for the client's leaving (it holds the request), and the client leaves when
    :meth:`leave` is called."""

    def __init__(self, app: Starlette, path: str, query: str = "") -> None:
        self.app = app
        self.scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.4"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": query.encode(),
            "headers": [(b"host", b"test")],
            "server": ("test", 80),
            "client": ("test", 5000),
        }
        self.holding = anyio.Event()
        self._left = anyio.Event()
        self._received = 0
        self.sent: list[Message] = []

    def leave(self) -> None:
        self._left.set()

    async def _receive(self) -> Message:
        self._received += 1
        if self._received == 1:
            return {"type": "http.request", "body": b"", "more_body": False}
        self.holding.set()
        await self._left.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: Message) -> None:
        self.sent.append(message)

    async def run(self) -> None:
        with anyio.fail_after(HANG):  # hang guard
            await self.app(self.scope, self._receive, self._send)

    @property
    def status(self) -> int:
        status: int = self.sent[0]["status"]
        return status

    @property
    def body(self) -> bytes:
        return b"".join(message.get("body", b"") for message in self.sent[1:])


# -- a /video.mp4 request is a video --


async def test_a_video_mp4_request_is_a_listed_video_replayed_byte_for_byte(tmp_path: Path) -> None:
    app = create_app(recording_dir=tmp_path / "recordings")
    async with client_of(app) as http:
        owner = await http.get(f"/video.mp4?frames={FRAMES}&size={SIZE}")
        assert owner.status_code == 200
        link = owner.headers["link"]
        video_id = link.split("/")[3]
        assert link == (
            f'</v1/videos/{video_id}/live.m3u8>; rel="alternate"; type="application/vnd.apple.mpegurl"'
        )
        listed = (await http.get("/v1/videos")).json()
        base = f"/v1/videos/{video_id}"
        assert listed == {
            "videos": [
                {
                    "id": video_id,
                    "state": "ended",
                    "frames": FRAMES,
                    "viewers": 0,
                    "urls": {"hls": f"{base}/live.m3u8", "mp4": f"{base}/video.mp4", "ws": f"{base}/watch"},
                }
            ]
        }
        replay = await http.get(f"{base}/video.mp4")
        assert replay.status_code == 200 and replay.content == owner.content
        assert int(replay.headers["content-length"]) == len(owner.content)
        assert replay.headers["content-type"].startswith('video/mp4; codecs="avc1.')
        # The ended playlist is a replay from the first segment: its segments are the video, every frame.
        playlist = await http.get(f"{base}/live.m3u8")
        assert playlist.status_code == 200
        assert playlist.headers["content-type"].startswith("application/vnd.apple.mpegurl")
        assert "no-store" not in playlist.headers.get("cache-control", "")
        read = check_playlist(playlist.text)
        assert read.ended and read.hint is None and len(read.segments) == 3
        init = (await http.get(f"{base}/{read.map_uri}")).content
        segments = [(await http.get(f"{base}/{segment.uri}")).content for segment in read.segments]
        assert init + b"".join(segments) == owner.content[: len(init) + sum(map(len, segments))]
        assert count_frames(init + b"".join(segments)) == FRAMES
        vod_text = (await http.get(f"{base}/vod.m3u8")).text
        vod = check_playlist(vod_text)
        assert (
            vod.ended
            and vod.parts == []
            and [segment.uri for segment in vod.segments] == ["s0.m4s", "s1.m4s", "s2.m4s"]
        )
        parts = [(await http.get(f"{base}/{part.uri}")).content for part in read.parts]
        assert b"".join(parts) == b"".join(segments)  # parts and segments are the same bytes
        stats = (await http.get("/stats")).json()
        assert stats["videos"]["viewers"] == {video_id: 0}
        served = len(replay.content) + len(playlist.content) + len(init) + 2 * sum(map(len, segments))
        served += len(vod_text.encode())
        assert stats["videos"]["served_bytes"] == served
        assert stats["completed"] == 1  # the keys it had are unchanged
    # The recording_dir copy: the MP4 byte for byte, and a VOD playlist of whole segments.
    folder = tmp_path / "recordings" / video_id
    assert (folder / "video.mp4").read_bytes() == owner.content
    vod = check_playlist((folder / "index.m3u8").read_text())
    assert vod.ended and vod.parts == [] and len(vod.segments) == 3
    assert (
        count_frames(
            b"".join((folder / name).read_bytes() for name in ["init.mp4", "s0.m4s", "s1.m4s", "s2.m4s"])
        )
        == FRAMES
    )


async def test_unknown_ids_are_404_and_ids_past_the_retention_410() -> None:
    app = create_app(keep_videos=1)
    async with client_of(app) as http:
        first = (await http.get(f"/video.mp4?frames=5&size={SIZE}")).headers["link"].split("/")[3]
        second = (await http.get(f"/video.mp4?frames=5&size={SIZE}")).headers["link"].split("/")[3]
        assert [video["id"] for video in (await http.get("/v1/videos")).json()["videos"]] == [second]
        for name in ("live.m3u8", "init.mp4", "p0.m4s", "s0.m4s", "video.mp4"):
            assert (await http.get(f"/v1/videos/{first}/{name}")).status_code == 410
            assert (await http.get(f"/v1/videos/0123456789abcdef/{name}")).status_code == 404
            assert (await http.get(f"/v1/videos/{second}/{name}")).status_code == 200
        assert (await http.get(f"/v1/videos/{second}/p99.m4s")).status_code == 404
        assert (await http.get(f"/v1/videos/{second}/x.m4s")).status_code == 404
    # WS watch of an unknown or forgotten id: an HTTP status at the handshake (uvicorn sends it).
    with running_server(app) as url:
        for video_id, status in ((first, 410), ("0123456789abcdef", 404)):

            def knock(video_id: str = video_id) -> int:
                from websockets.sync.client import connect as ws_connect

                try:
                    with ws_connect(url.replace("http", "ws") + f"/v1/videos/{video_id}/watch"):
                        return 101
                except websockets.InvalidStatus as refused:
                    return refused.response.status_code

            assert await anyio.to_thread.run_sync(knock) == status


@pytest.mark.parametrize("argument", [{"keep_videos": 0}, {"keep_bytes": -1}, {"keep_videos": "8"}])
def test_create_app_checks_its_retention(argument: dict[str, Any]) -> None:
    with pytest.raises((ValueError, TypeError), match=f"create_app.*{next(iter(argument))}"):
        create_app(**argument)


def test_create_app_checks_recording_dir_and_hls_js(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="create_app: recording_dir must be a str, a path or None"):
        create_app(recording_dir=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="create_app: hls_js must name an existing file"):
        create_app(hls_js=tmp_path / "absent.js")


async def test_hls_js_is_served_from_the_file_given(tmp_path: Path) -> None:
    script = tmp_path / "hls.min.js"
    script.write_text("/* hls.js */")
    async with client_of(create_app(hls_js=script)) as http:
        served = await http.get("/hls.js")
    assert served.status_code == 200 and served.text == "/* hls.js */"
    assert served.headers["content-type"].startswith("text/javascript")


# -- a WebSocket session is a video, and has spectators --


async def test_a_spectator_watches_a_session_from_its_newest_keyframe_and_cannot_steer(
    no_leaks: None,
) -> None:
    gate = Gate()
    app = create_app(generator=gate)
    async with connect(app) as owner:
        gate.step(6)  # 1 + 4 × 5 = 21 frames: the second segment's keyframe (frame 16) is written
        start = await owner_started(owner)
        video_id = start["video_id"]
        base = f"/v1/videos/{video_id}"
        assert start["watch"] == {
            "hls": f"{base}/live.m3u8",
            "mp4": f"{base}/video.mp4",
            "ws": f"{base}/watch",
        }
        owned = [await owner.receive_bytes()]
        shown = 1
        while shown < 17:  # frame 16, a keyframe, is written: the spectator joins after it
            metadata = await owner.receive_json()
            assert metadata["type"] == "video.chunk_metadata", metadata
            shown += metadata["num_frames"]
            owned.append(await owner.receive_bytes())
        async with connect(app, f"{base}/watch") as spectator:
            watched = await spectator.receive_json()
            assert watched["type"] == "video.start" and watched["video_id"] == video_id
            assert watched["watch"] == start["watch"] and watched["config"]["codecs"].startswith("avc1.")
            await spectator.send_json({"type": "session.interaction", "interaction": {"event": {"x": 1}}})
            await spectator.send_json({"type": "session.ping"})
            gate.finish()
            answers: list[dict[str, Any]] = []
            frames: list[tuple[dict[str, Any], bytes]] = []
            while (message := await spectator.receive_json())["type"] != "session.done":
                if message["type"] == "video.chunk_metadata":
                    frames.append((message, await spectator.receive_bytes()))
                else:
                    answers.append(message)
            assert answers == [
                {
                    "type": "error",
                    "code": "not_owner",
                    "message": "session.interaction: a spectator does not steer the generation",
                },
                {"type": "session.pong"},
            ]
            assert message["chunks"] == len(frames) and message["stopped"] is False
            assert await spectator.closed() == 1000
        owned.append(await read_owner(owner))
    recording = b"".join(owned)
    (init_meta, init), *media = frames
    assert init_meta["kind"] == "init" and init_meta["num_frames"] == 0 and recording.startswith(init)
    body = b"".join(data for _, data in media)
    assert recording.endswith(body)  # every frame from where it joined, to the end
    shown = sum(meta["num_frames"] for meta, _ in media)
    assert shown == FRAMES - 16 == count_frames(init + body)  # from the newest keyframe: frame 16
    assert [meta["transport_chunk_index"] for meta, _ in frames] == list(range(len(frames)))
    assert all(meta["byte_length"] == len(data) for meta, data in frames)
    async with client_of(app) as http:
        assert (await http.get(f"{base}/video.mp4")).content == recording  # the replay is the owner's MP4


async def test_the_owner_leaving_ends_every_viewer_cleanly(no_leaks: None) -> None:
    gate = Gate()
    app = create_app(generator=gate)
    async with connect(app) as owner:
        gate.step(2)  # five frames: four are written (a fragment closes when the next frame comes)
        video_id = (await owner_started(owner))["video_id"]
        async with connect(app, f"/v1/videos/{video_id}/watch") as spectator:
            assert (await spectator.receive_json())["type"] == "video.start"
            await owner.leave()
            while (message := await spectator.receive_json())["type"] == "video.chunk_metadata":
                await spectator.receive_bytes()
            assert message["type"] == "session.done"
            assert await spectator.closed() == 1000
    async with client_of(app) as http:
        listed = (await http.get("/v1/videos")).json()["videos"]
        assert [(video["id"], video["state"]) for video in listed] == [(video_id, "ended")]
        replay = await http.get(f"/v1/videos/{video_id}/live.m3u8")
        assert check_playlist(replay.text).ended


# -- Low-Latency HLS: blocking reload and the preload hint --


async def test_a_blocking_reload_is_held_until_its_part_is_written_and_freed_when_its_client_leaves(
    no_leaks: None,
) -> None:
    gate = Gate()
    app = create_app(generator=gate)
    async with connect(app) as owner, client_of(app) as http:
        gate.step(2)  # five frames: parts 0 to 3 (the fifth waits for the next frame)
        base = f"/v1/videos/{(await owner_started(owner))['video_id']}"
        await owner.receive_bytes()
        shown = 1
        while shown < 4:  # every part those steps write is written: nothing more comes until the next step
            shown += (await owner.receive_json())["num_frames"]
            await owner.receive_bytes()
        first = await http.get(f"{base}/live.m3u8")
        assert first.headers["cache-control"] == "no-store"
        read = check_playlist(first.text)
        written = len(read.parts)
        assert (
            written == 4 and read.parts[0].independent and read.hint == f"p{written}.m4s" and not read.ended
        )
        # Too far ahead, or a part without its segment: 400, as the spec says.
        for query in ("_HLS_msn=9", "_HLS_msn=0&_HLS_part=99", "_HLS_part=1", "_HLS_msn=x"):
            assert (await http.get(f"{base}/live.m3u8?{query}")).status_code == 400
        # Held: the playlist asking for part 1, and the preload hint's part itself.
        reload = Held(app, f"{base}/live.m3u8", f"_HLS_msn=0&_HLS_part={written}")
        hinted = Held(app, f"{base}/{read.hint}")
        left = Held(app, f"{base}/live.m3u8", f"_HLS_msn=0&_HLS_part={written}")
        async with anyio.create_task_group() as group:
            for held in (reload, hinted, left):
                group.start_soon(held.run)
                with anyio.fail_after(HANG):
                    await held.holding.wait()
            left.leave()  # its client leaves while held: the request ends, answered with nothing sent to it
            assert reload.sent == [] and hinted.sent == []  # nothing answered before the part exists
            gate.step()  # four more frames: the hinted part and more are written
        assert reload.status == 200
        again = check_playlist(reload.body.decode(), previous=read)
        assert read.hint in {part.uri for part in again.parts}  # the part asked for is listed
        assert hinted.status == 200 and hinted.body == (await http.get(f"{base}/{read.hint}")).content
        assert left.status == 503  # never read: its client had gone
        gate.finish()
        await read_owner(owner)
        ended = check_playlist((await http.get(f"{base}/live.m3u8")).text, previous=again)
        assert ended.ended


# -- many viewers --


async def hls_viewer(http: httpx.AsyncClient, base: str) -> tuple[bytes, bytes]:
    """An HLS poller: blocking reloads to the end, every playlist checked; the init segment and the
    bytes of every part it saw, from the first independent one."""
    playlist: Playlist | None = None
    fetched: dict[str, bytes] = {}
    query = ""
    while True:
        response = await http.get(f"{base}/live.m3u8{query}")
        if response.status_code == 503:  # held past its bound (a slow step on a busy machine): ask again
            continue
        assert response.status_code == 200, response.text
        playlist = check_playlist(response.text, previous=playlist)
        for part in playlist.parts:
            if part.uri not in fetched and (fetched or part.independent):
                fetched[part.uri] = (await http.get(f"{base}/{part.uri}")).content
        if playlist.ended:
            break
        msn = len(playlist.segments)
        query = f"?_HLS_msn={msn}&_HLS_part={len(playlist.open_parts)}"
    init = (await http.get(f"{base}/init.mp4")).content
    return init, b"".join(fetched[uri] for uri in sorted(fetched, key=lambda uri: int(uri[1:-4])))


async def spectator_viewer(app: Starlette, base: str) -> tuple[bytes, bytes]:
    async with connect(app, f"{base}/watch") as spectator:
        assert (await spectator.receive_json())["type"] == "video.start"
        received: list[bytes] = []
        while (message := await spectator.receive_json())["type"] == "video.chunk_metadata":
            received.append(await spectator.receive_bytes())
        assert message["type"] == "session.done"
    return received[0], b"".join(received[1:])


async def test_a_hundred_viewers_of_every_kind_each_get_every_frame_from_where_they_joined(
    no_leaks: None,
) -> None:
    gate = Gate()
    app = create_app(generator=gate)
    results: list[tuple[str, bytes, bytes]] = []
    async with connect(app) as owner, client_of(app) as http:
        gate.step(3)
        base = f"/v1/videos/{(await owner_started(owner))['video_id']}"

        async def viewer(number: int) -> None:
            kind = ("hls", "ws", "mp4")[number % 3]
            if kind == "hls":
                init, body = await hls_viewer(http, base)
            elif kind == "ws":
                init, body = await spectator_viewer(app, base)
            else:
                whole = (await http.get(f"{base}/video.mp4")).content
                init, body = whole, b""
            results.append((kind, init, body))

        async with anyio.create_task_group() as group:
            for number in range(100):
                group.start_soon(viewer, number)
            gate.finish()
            owned = [await owner.receive_bytes(), await read_owner(owner)]
    recording = b"".join(owned)
    assert len(results) == 100
    for kind, init, body in results:
        if kind == "mp4":
            assert init == recording  # from its start
            continue
        assert recording.startswith(init) and body in recording  # joined at a part, then every one
        after = recording[recording.index(body) + len(body) :]
        assert after == b"" or (kind == "hls" and after[4:8] == b"mfra")  # to the end (HLS: the last part)
        before = recording[: recording.index(body)]  # init and whole fragments: an MP4 of its own
        assert count_frames(init + body) + count_frames(before) == FRAMES  # from a keyframe, every frame
    async with client_of(app) as http:
        stats = (await http.get("/stats")).json()["videos"]
    assert list(stats["viewers"].values()) == [0]  # every viewer has left


async def test_a_live_video_mp4_reader_gets_the_whole_mp4_from_its_start() -> None:
    gate = Gate()
    app = create_app(generator=gate)
    with running_server(app) as url:
        async with connect(app) as owner, httpx.AsyncClient(base_url=url, timeout=HANG) as http:
            gate.step(2)
            base = f"/v1/videos/{(await owner_started(owner))['video_id']}"
            first = await owner.receive_bytes()
            async with http.stream("GET", f"{base}/video.mp4") as response:
                assert response.headers["cache-control"] == "no-store"
                assert "content-length" not in response.headers
                chunks = response.aiter_bytes()
                got = await chunks.__anext__()  # what exists when it joined, before the generation goes on
                gate.finish()
                got += b"".join([chunk async for chunk in chunks])
            owned = first + await read_owner(owner)
    assert got == owned and count_frames(got) == FRAMES


async def test_a_failed_generation_is_a_failed_video_and_its_spectators_are_told() -> None:
    latent = demo_latent(FRAMES, SIZE, 3)

    async def failing(start: dict[str, Any]) -> AsyncIterator[torch.Tensor]:
        yield latent[:, :, :2]
        raise RuntimeError("the model broke")

    gate = anyio.Event()

    async def held_then_failing(start: dict[str, Any]) -> AsyncIterator[torch.Tensor]:
        async for piece in failing(start):
            yield piece
            await gate.wait()

    app = create_app(generator=held_then_failing)
    async with connect(app) as owner:
        video_id = (await owner_started(owner))["video_id"]
        async with connect(app, f"/v1/videos/{video_id}/watch") as spectator:
            assert (await spectator.receive_json())["type"] == "video.start"
            gate.set()
            while (message := await spectator.receive_json())["type"] == "video.chunk_metadata":
                await spectator.receive_bytes()
            assert message == {
                "type": "error",
                "code": "generation_failed",
                "message": "the generation failed",
            }
            assert await spectator.closed() == 1011
        await owner.receive_bytes()
        while (message := await owner.receive_json())["type"] == "video.chunk_metadata":
            await owner.receive_bytes()
        assert message["code"] == "generation_failed"
    async with client_of(app) as http:
        (listed,) = (await http.get("/v1/videos")).json()["videos"]
        assert listed["id"] == video_id and listed["state"] == "failed"
        assert check_playlist((await http.get(f"/v1/videos/{video_id}/live.m3u8")).text).ended


# -- the page: lists the videos and watches one --

# Registers for the next "ended" of the page's video, then watches the video WATCH_ID the way HOW says
# (the page's own buttons call the same function); resolves with what the page knew at the end.
WATCH_TO_THE_END = """
new Promise(async (resolve, reject) => {
  const video = document.getElementById("video");
  video.addEventListener("ended", () => resolve({
    player: window.streamvaeState.player, videoId: window.streamvaeState.videoId,
    frames: window.streamvaeState.frames, done: window.streamvaeState.done,
    error: window.streamvaeState.error, duration: video.duration,
    listed: document.getElementById("videos").textContent,
  }), { once: true });
  video.addEventListener("error", () => reject(new Error("video error: " + video.error.message)));
  const late = () => "the watched video did not end in 90 s: " + JSON.stringify(window.streamvaeState);
  setTimeout(() => reject(new Error(late())), 90000);  // a hang guard
  await window.streamvaeListVideos();
  const { videos } = await (await fetch("v1/videos")).json();
  window.streamvaeWatch(videos.find((entry) => entry.id === WATCH_ID), HOW);
})
"""


@pytest.mark.browser
@pytest.mark.parametrize("how", ["ws", "hls"])
def test_the_page_lists_a_live_video_and_watches_it_to_its_end(chromium: str, how: str) -> None:
    from websockets.sync.client import connect as ws_connect

    from tests._browser import HLS_JS, WAIT_FOR_END, page_at

    if how == "hls" and not HLS_JS.is_file():
        pytest.skip("hls.js is not installed (make hlsjs)")
    app = create_app(hls_js=HLS_JS if HLS_JS.is_file() else None)
    with running_server(app) as url, ws_connect(url.replace("http", "ws") + "/v1/realtime/video") as owner:
        # 65 frames, a latent frame (4 frames) every 0.25 s: the generation runs ~4 s while watched.
        start_message = {"type": "session.start", "num_frames": 65, "width": 64, "height": 64}
        owner.send(json.dumps({**start_message, "step_seconds": 0.25}))
        start = json.loads(owner.recv(timeout=HANG))
        assert start["type"] == "video.start"
        with page_at(chromium, f"{url}/?frames=1&size=16") as devtools:
            devtools.evaluate(WAIT_FOR_END)  # the page's own one-frame decode, played first
            script = WATCH_TO_THE_END.replace("WATCH_ID", json.dumps(start["video_id"]))
            watched = devtools.evaluate(script.replace("HOW", json.dumps(how)))
        while (message := owner.recv(timeout=HANG)) and not (
            isinstance(message, str) and json.loads(message)["type"] == "session.done"
        ):
            pass  # the owner reads its own video to its end
    assert start["video_id"] in watched["listed"]  # the page listed the live video
    assert watched["videoId"] == start["video_id"] and watched["error"] is None
    assert watched["player"] == ("ws" if how == "ws" else "hls.js")
    assert watched["duration"] > 0
    if how == "ws":
        assert watched["done"] and 0 < watched["frames"] <= 65  # from the newest keyframe when it joined


def test_a_video_mp4_viewer_that_reads_nothing_is_cut_off_and_the_owner_gets_every_frame() -> None:
    import socket

    from websockets.sync.client import connect as ws_connect

    frames = 129  # 129 pieces: more than a viewer's buffer of 64
    app = create_app(stall_timeout=2)
    with (
        running_server(app, send_buffer=4096) as url,
        ws_connect(url.replace("http", "ws") + "/v1/realtime/video") as owner,
    ):
        owner.send(
            json.dumps(
                {
                    "type": "session.start",
                    "num_frames": frames,
                    "width": 128,
                    "height": 128,
                    "step_seconds": 0,
                }
            )
        )
        start = json.loads(owner.recv(timeout=HANG))
        host, port = url.removeprefix("http://").split(":")
        reader = socket.socket()
        reader.setsockopt(
            socket.SOL_SOCKET, socket.SO_RCVBUF, 4096
        )  # it reads nothing: its window fills soon
        reader.connect((host, int(port)))
        reader.sendall(f"GET {start['watch']['mp4']} HTTP/1.1\r\nhost: test\r\n\r\n".encode())
        shown = 0
        while (
            not isinstance(message := owner.recv(timeout=HANG), str)
            or json.loads(message)["type"] != "session.done"
        ):
            if isinstance(message, str):
                shown += json.loads(message)["num_frames"]
        assert json.loads(message)["stopped"] is False and shown == frames  # the owner got every frame
        received = bytearray()
        reader.settimeout(HANG)  # a hang guard: the server closes the connection once it cut the viewer off
        while data := reader.recv(65536):
            received += data
        reader.close()
        recording = httpx.get(f"{url}{start['watch']['mp4']}", timeout=HANG).content
        stats = httpx.get(f"{url}/stats", timeout=HANG).json()["videos"]
    assert received.startswith(b"HTTP/1.1 200") and not received.endswith(b"0\r\n\r\n")  # cut off: incomplete
    assert len(received) < len(recording)
    assert stats["viewers"] == {start["video_id"]: 0}
