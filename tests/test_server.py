"""The streaming server end to end: uvicorn on 127.0.0.1, httpx clients on asyncio and trio."""

from __future__ import annotations

import logging
import platform
import socket
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import numpy as np
import pytest
import torch

from streamvae import SessionOptions
from streamvae._encode import EntryEncoder
from streamvae.demo import demo_latent, demo_vae
from streamvae.models import chunked_decoder
from streamvae.server import VideoRequest, create_app
from streamvae.server._admission import Admission, Ticket
from streamvae.testing import foreign_threads, open_containers
from tests._media import REFUSED_AT_OPEN, read_mp4
from tests._server import EventLog, GatedDecoder, fetch, get_once, running_server, wait_for

pytestmark = pytest.mark.anyio

PINNED = {"video_codec_options": {"threads": "1"}}


@pytest.fixture
def events() -> EventLog:
    return EventLog()


@pytest.fixture
def gated() -> Iterator[GatedDecoder]:
    decoder = GatedDecoder(chunked_decoder(demo_vae()))
    yield decoder
    decoder.gate.set()  # never leave a decode paused behind a failed test


async def test_bytes_arrive_while_the_decode_runs_and_the_body_holds_every_frame(
    events: EventLog, gated: GatedDecoder
) -> None:
    # 9 latent frames → 33 frames; the decode pauses after 6 chunks (21 frames) until the test has
    # received a whole fragment (moof) — a server that sent nothing before the end would never get there.
    gated.pause_after = 6
    app = create_app(vae=gated, on_event=events, session_options={"keyframe_interval": 4, **PINNED})
    with running_server(app) as url:
        async with (
            httpx.AsyncClient(base_url=url, timeout=120) as client,
            client.stream("GET", "/video.mp4?frames=33&size=64&seed=1") as response,
        ):
            assert response.status_code == 200
            assert response.headers["content-type"] == 'video/mp4; codecs="avc1.64000a"'  # High, level 1.0
            body = response.aiter_raw()
            pieces: list[bytes] = []
            while b"moof" not in b"".join(pieces):
                pieces.append(await anext(body))
            assert gated.running == 1 and gated.published <= 6  # the decode has not passed the pause
            gated.gate.set()
            pieces.extend([data async for data in body])
        await wait_for(events, "completed")
    video = read_mp4(b"".join(pieces))
    assert video.frames.shape == (33, 64, 64, 3)
    assert gated.published == 9


async def test_a_client_that_leaves_mid_stream_leaves_no_session_thread_or_slot(
    events: EventLog, gated: GatedDecoder
) -> None:
    app = create_app(vae=gated, on_event=events, session_options={"keyframe_interval": 4, **PINNED})
    with running_server(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            await fetch(client, "/video.mp4?frames=5&size=32")  # warm the pools for the thread baseline
            baseline = foreign_threads()
            published = gated.published
            gated.pause_after = 6  # the first fragment is out by then
            async with client.stream("GET", "/video.mp4?frames=65&size=64") as response:
                async for _ in response.aiter_raw():
                    break  # the first bytes, then the client goes away while the decode is paused
            await wait_for(events, "disconnected")
            stats = (await client.get("/stats")).json()
    assert gated.running == 0
    assert gated.published - published <= 7  # of 17 chunks: the decode stopped at the next one
    assert stats["active"] == 0 and stats["queued"] == 0 and stats["open_containers"] == 0
    assert stats["completed"] == 1 and stats["disconnected"] == 1
    assert open_containers() == 0
    assert foreign_threads() <= baseline


async def test_eight_concurrent_requests_each_get_their_own_decode(
    events: EventLog, gated: GatedDecoder
) -> None:
    # Every decode pauses after its first chunk until all eight hold a slot: they really run at once.
    gated.pause_after = 1
    app = create_app(vae=gated, on_event=events, max_concurrent=8, max_queued=0, session_options=PINNED)
    bodies: dict[int, bytes] = {}
    with running_server(app) as url:
        limits = httpx.Limits(max_connections=8)
        async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:

            async def get(seed: int) -> None:
                bodies[seed] = await fetch(client, f"/video.mp4?frames=9&size=32&seed={seed}")

            async with anyio.create_task_group() as group:
                for seed in range(8):
                    group.start_soon(get, seed)
                await wait_for(events, "started", 8)
                assert app.state.stats.active == 8
                gated.gate.set()
            await wait_for(events, "completed", 8)
    videos = [read_mp4(bodies[seed]).frames for seed in range(8)]
    assert all(v.shape == (9, 32, 32, 3) for v in videos)
    # Each seed's latent is different, so each response is its own video, not a shared one.
    assert all(not np.array_equal(videos[0], other) for other in videos[1:])
    assert open_containers() == 0


async def test_requests_beyond_the_slots_and_the_queue_get_503_with_retry_after(
    events: EventLog, gated: GatedDecoder
) -> None:
    gated.pause_after = 1
    app = create_app(
        vae=gated, on_event=events, max_concurrent=1, max_queued=1, retry_after=7, session_options=PINNED
    )
    bodies: list[bytes] = []
    with running_server(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:

            async def get() -> None:
                bodies.append(await fetch(client, "/video.mp4?frames=9&size=32"))

            async with anyio.create_task_group() as group:
                group.start_soon(get)
                await wait_for(events, "started")  # the first request holds the only slot
                group.start_soon(get)
                await wait_for(events, "queued", 2)  # the second waits in the queue
                busy = await client.get("/video.mp4?frames=9&size=32")
                assert busy.status_code == 503
                assert busy.headers["retry-after"] == "7"
                gated.gate.set()
            stats = (await client.get("/stats")).json()
    assert [read_mp4(body).frames.shape[0] for body in bodies] == [9, 9]
    assert stats["rejected"] == 1 and stats["completed"] == 2 and stats["active"] == 0


async def test_a_reader_that_stalls_is_cut_off_and_its_decode_cancelled(events: EventLog) -> None:
    decoder = GatedDecoder(chunked_decoder(demo_vae()))  # never paused: it only counts chunks
    # Lossless frames make a large body, small socket buffers let it fill them soon.
    lossless = {"video_codec_options": {"qp": "0", "threads": "1"}, "keyframe_interval": 4}
    app = create_app(vae=decoder, on_event=events, stall_timeout=0.5, session_options=lossless)
    with running_server(app, send_buffer=4096) as url:
        port = int(url.rsplit(":", 1)[1])
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        try:
            await anyio.to_thread.run_sync(client.connect, ("127.0.0.1", port))
            request = b"GET /video.mp4?frames=129&size=128 HTTP/1.1\r\nHost: test\r\n\r\n"
            await anyio.to_thread.run_sync(client.sendall, request)
            head = await anyio.to_thread.run_sync(client.recv, 64)
            assert head.startswith(b"HTTP/1.1 200")
            # ... and the client reads nothing more.
            await wait_for(events, "stalled")
        finally:
            client.close()
        stats = app.state.stats
        assert stats.active == 0 and stats.stalled == 1
    assert decoder.running == 0
    assert decoder.published < 33  # the decode was cancelled, not run to the end
    assert open_containers() == 0


async def test_a_decode_that_fails_before_its_first_byte_is_a_500(events: EventLog) -> None:
    app = create_app(on_event=events, session_options={"video_codec_options": REFUSED_AT_OPEN})
    with running_server(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            response = await client.get("/video.mp4?frames=5&size=32")
            stats = (await client.get("/stats")).json()
    assert response.status_code == 500
    assert stats["failed"] == 1 and stats["active"] == 0 and stats["open_containers"] == 0


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("frames=6", "1 + 4k"),
        ("size=100", "multiple of 16"),
        ("frames=many", "integer"),
        ("frames=1001", "at most"),
        ("seed=-1", "seed"),
    ],
)
async def test_bad_video_parameters_are_a_400_that_names_the_problem(query: str, message: str) -> None:
    response = await get_once(create_app(), f"/video.mp4?{query}")
    assert response.status_code == 400
    assert message in response.text


async def test_every_value_the_decode_would_not_take_is_a_400_and_the_extremes_it_takes_are_served(
    events: EventLog,
) -> None:
    # A custom latent builder gets no demo checks: the server's own ranges must hold on their own.
    seeds: list[int] = []

    def latents(request: VideoRequest) -> torch.Tensor:
        seeds.append(request.seed)
        return demo_latent(1, 16, request.seed % 2**32)

    app = create_app(latents=latents, max_frames=9, max_size=64, on_event=events, session_options=PINNED)
    refused = [
        "seed=18446744073709551616",  # 2**64: torch.Generator.manual_seed overflows (it was a 500)
        "seed=-1",
        "seed=" + "9" * 5000,
        "frames=0",
        "frames=-5",
        "size=0",
        "frames=10",
        "size=65",
        "frames=" + "9" * 5000,
        "frames=1.5",
        "frames=1e3",
        "frames=",
        "frames=1_0",
        "frames=%205",
        "frames=%D9%A3",  # an Arabic-Indic 3, which int() would take
        "seed=0x10",
    ]
    with running_server(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            for query in refused:
                # The others are valid; the last value of a repeated name counts.
                response = await client.get(f"/video.mp4?frames=1&size=16&seed=0&{query}")
                assert response.status_code == 400, query
                name = query.split("=")[0]
                assert response.text.startswith(name) and len(response.text) < 200, response.text
            body = await fetch(client, f"/video.mp4?frames=1&size=16&seed={2**64 - 1}")
            await wait_for(events, "completed")
            stats = (await client.get("/stats")).json()
    assert read_mp4(body).frames.shape[0] == 1
    assert seeds == [2**64 - 1]  # the refused requests never reached the latent builder
    assert stats["failed"] == 0 and stats["completed"] == 1


async def test_the_page_has_a_video_element_and_a_form() -> None:
    with running_server(create_app()) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            page = await client.get("/")
            stats = await client.get("/stats")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    for needle in (
        "<video",
        "<form",
        'name="frames"',
        'name="size"',
        'name="seed"',
        'name="realtime"',
        'name="delay"',
        "video.mp4?",
        "v1/videos",  # it lists the videos and can watch one
        "ManagedMediaSource",  # its WebSocket player where Media Source is missing (iPhone)
        'src="hls.js"',
    ):
        assert needle in page.text
    assert stats.json() == {
        "active": 0,
        "queued": 0,
        "completed": 0,
        "stopped": 0,
        "disconnected": 0,
        "stalled": 0,
        "failed": 0,
        "rejected": 0,
        "open_containers": open_containers(),
        "latency": {
            "requests": 0,
            "first_fragment_median": None,
            "first_fragment_max": None,
            "chunk_latency_median": None,
            "chunk_latency_max": None,
        },
        "control_to_photon_seconds": {"median": None, "max": None, "interactions": 0},
        "videos": {"viewers": {}, "served_bytes": 0},
    }


async def test_each_request_logs_its_latency_and_stats_summarizes_the_completed_ones(
    events: EventLog, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="streamvae.server")
    app = create_app(on_event=events, session_options=PINNED)
    with running_server(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            for seed in range(2):
                body = await fetch(client, f"/video.mp4?frames=9&size=32&seed={seed}")
            await wait_for(events, "completed", 2)
            stats = (await client.get("/stats")).json()
    assert read_mp4(body).frames.shape[0] == 9
    latency = stats["latency"]
    assert latency["requests"] == 2
    assert 0 < latency["first_fragment_median"] <= latency["first_fragment_max"]
    assert 0 < latency["chunk_latency_median"] <= latency["chunk_latency_max"]
    lines = [
        r.getMessage() for r in caplog.records if r.name == "streamvae.server" and r.levelno == logging.INFO
    ]
    assert len(lines) == 2 and all("completed" in line and "3 of 3 chunks" in line for line in lines)
    assert lines[0].startswith("request 1 ") and "first fragment after" in lines[0]


@pytest.mark.parametrize(
    ("argument", "value", "message"),
    [
        *[
            ("max_concurrent", value, "max_concurrent must be an int >= 1")
            for value in (0, -1, 1.5, "8", True)
        ],
        *[("max_queued", value, "max_queued must be an int >= 0") for value in (-1, 1.0, "16", None)],
        *[
            ("stall_timeout", value, "stall_timeout must be a positive, finite number of seconds")
            for value in (0, -1, float("nan"), float("inf"), "30", True, None)
        ],
        *[("retry_after", value, "retry_after must be an int >= 0") for value in (-1, 1.5, "5", None)],
        *[("max_frames", value, "max_frames must be an int >= 1") for value in (0, 2.0, "257")],
        *[("max_size", value, "max_size must be an int >= 1") for value in (0, "512", None)],
        *[("fps", value, "fps must be a number") for value in (0, "16", float("nan"), 1e6, True, None)],
        ("session_options", {"batch_frames": 0}, "session_options: batch_frames must be an int >= 1"),
        (
            "session_options",
            {"batch_frame": 2},
            "session_options has 'batch_frame', not a SessionOptions keyword",
        ),
        ("session_options", {"fps": 24}, "pass fps to create_app"),
        (
            "session_options",
            {"encode_limiter": anyio.CapacityLimiter(1)},
            "pass encode_limiter to create_app",
        ),
    ],
)
def test_create_app_refuses_a_bad_value_naming_itself_and_the_argument(
    argument: str, value: object, message: str
) -> None:
    with pytest.raises(ValueError, match=rf"^create_app: {message}"):
        create_app(**{argument: value})


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("vae", object()),
        ("latents", 5),
        ("on_event", "log"),
        ("encode_limiter", 4),
        ("encode_limiter", anyio.Semaphore(1)),
        ("session_options", [("batch_frames", 1)]),
    ],
)
def test_create_app_refuses_an_object_of_the_wrong_kind_with_a_type_error(
    argument: str, value: object
) -> None:
    with pytest.raises(TypeError, match=rf"^create_app: {argument}"):
        create_app(**{argument: value})


def test_a_bad_encode_limiter_is_the_same_error_for_the_app_as_for_a_session() -> None:
    with pytest.raises(TypeError) as of_session:
        SessionOptions(value_range=(-1, 1), fps=16, encode_limiter=4)  # type: ignore[arg-type]
    with pytest.raises(TypeError) as of_app:
        create_app(encode_limiter=4)  # type: ignore[arg-type]
    assert type(of_app.value) is type(of_session.value)
    assert "encode_limiter must be an anyio.CapacityLimiter or None, got int" in str(of_app.value)


@pytest.mark.parametrize("options", [{"threads": "99999999999"}, {"crf": "١٢"}, {"g": "1e1"}, {"crf": "nan"}])
def test_an_auto_codec_value_no_encoder_takes_fails_when_the_app_is_built(options: dict[str, str]) -> None:
    # It passed once, and every request was a 500.
    session_options = {"video_codec": "auto", "video_codec_options": options}
    with pytest.raises(ValueError, match=r"^create_app: session_options: video_codec_options: "):
        create_app(session_options=session_options)


def test_an_encoder_that_cannot_take_the_frames_fails_when_the_app_is_built() -> None:
    with pytest.raises(ValueError, match=r"^create_app: session_options: video_codec 'libx264rgb' takes"):
        create_app(session_options={"video_codec": "libx264rgb"})


def test_every_request_encodes_under_the_apps_shared_encode_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    # Sync (httpx's blocking client): the limiter is made outside any loop and binds to uvicorn's.
    budget = anyio.CapacityLimiter(1)
    seen: list[tuple[float, str]] = []
    encode = EntryEncoder.encode

    def spy(self: EntryEncoder, frames: Any) -> bytes:
        seen.append((budget.borrowed_tokens, self.codec_options["threads"]))
        return encode(self, frames)

    monkeypatch.setattr(EntryEncoder, "encode", spy)
    with running_server(create_app(encode_limiter=budget)) as url:
        for seed in range(2):
            response = httpx.get(f"{url}/video.mp4?frames=5&size=32&seed={seed}", timeout=120)
            assert response.status_code == 200
    assert seen and set(seen) == {(1, "1")}  # each call held the app's token; x264 got one thread


def test_serve_trims_the_allocator_after_each_video_response_and_nothing_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import uvicorn

    from streamvae import server
    from streamvae.server import _serve

    assert (_serve._glibc_malloc_trim() is not None) == (platform.libc_ver()[0] == "glibc")
    trims: list[str] = []
    apps: list[Any] = []
    monkeypatch.setattr(_serve, "_glibc_malloc_trim", lambda: lambda: trims.append("trim"))
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: apps.append(app))
    server.serve(port=0, session_options=PINNED)
    with running_server(apps[0]) as url:
        assert httpx.get(f"{url}/video.mp4?frames=5&size=32", timeout=120).status_code == 200
        assert httpx.get(f"{url}/stats", timeout=60).status_code == 200
        assert httpx.get(f"{url}/", timeout=60).status_code == 200
    assert trims == ["trim"]  # the server has shut down: every response's work is over


async def test_the_app_mounts_under_a_prefix_in_another_app(events: EventLog) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    outer = Starlette(routes=[Mount("/streamvae", app=create_app(on_event=events, session_options=PINNED))])
    with running_server(outer) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120, follow_redirects=True) as client:
            page = await client.get("/streamvae/")
            body = await fetch(client, "/streamvae/video.mp4?frames=5&size=32")
    assert page.status_code == 200 and 'video.src = "video.mp4?' in page.text  # relative: works mounted
    assert read_mp4(body).frames.shape == (5, 32, 32, 3)


# --------------------------------------------------------------------------- admission, without a server


def admitted(admission: Admission) -> Ticket:
    ticket = admission.try_enter()
    assert ticket is not None
    return ticket


async def test_admission_queues_beyond_the_slots_and_turns_away_beyond_the_queue() -> None:
    admission = Admission(max_concurrent=1, max_queued=1)
    await admitted(admission).start()
    admitted(admission)
    assert admission.try_enter() is None  # the slot and the queue place are taken: a 503
    assert (admission.stats.active, admission.stats.queued, admission.stats.rejected) == (1, 1, 1)


async def test_queued_requests_take_a_given_back_slot_in_the_order_they_came() -> None:
    admission = Admission(max_concurrent=1, max_queued=2)
    first = admitted(admission)
    await first.start()
    waiting = {name: admitted(admission) for name in ("second", "third")}
    started: list[str] = []
    events = {name: anyio.Event() for name in waiting}

    async def start(name: str) -> None:
        await waiting[name].start()
        started.append(name)
        events[name].set()

    async with anyio.create_task_group() as group:
        for name in waiting:
            group.start_soon(start, name)
            await anyio.wait_all_tasks_blocked()  # it waits for the slot before the next one comes
        assert admission.stats.queued == 2 and started == []
        first.end("completed")
        await events["second"].wait()
        assert started == ["second"] and admission.stats.queued == 1 and admission.stats.active == 1
        waiting["second"].end("failed")
        await events["third"].wait()
    waiting["third"].end("stalled")
    stats = admission.stats
    assert started == ["second", "third"]
    assert (stats.active, stats.queued, stats.completed, stats.failed, stats.stalled) == (0, 0, 1, 1, 1)


async def test_a_request_cancelled_while_queued_leaves_the_queue_without_a_slot() -> None:
    admission = Admission(max_concurrent=1, max_queued=1)
    first = admitted(admission)
    await first.start()
    second = admitted(admission)
    with anyio.CancelScope() as scope:
        scope.cancel()  # the client went away while it waited
        await second.start()
    second.end("disconnected")
    assert (admission.stats.active, admission.stats.queued, admission.stats.disconnected) == (1, 0, 1)
    first.end("completed")
    third = admitted(admission)
    with anyio.fail_after(10):  # a hang guard: the slot is free, so this takes it at once
        await third.start()
    assert admission.stats.active == 1


def test_a_request_ends_once() -> None:
    ticket = admitted(Admission(max_concurrent=1, max_queued=0))
    ticket.end("disconnected")
    with pytest.raises(RuntimeError, match="already ended"):
        ticket.end("completed")


def test_a_session_option_no_session_would_take_fails_when_the_app_is_built() -> None:
    # Checked once, before any request: not a 500 on every request.
    with pytest.raises(ValueError, match="libx264 has no option 'presett'"):
        create_app(session_options={"video_codec_options": {"presett": "fast"}})
    with pytest.raises(ValueError, match="batch_frames must be an int >= 1"):
        create_app(session_options={"batch_frames": 0})
