"""The server's real-time mode (``realtime=1``): the latent fed to the decode a latent frame a step."""

from __future__ import annotations

import re

import httpx
import numpy as np
import pytest
import torch

from streamvae.demo import demo_latent
from streamvae.server import VideoRequest, create_app
from streamvae.testing import open_containers
from tests._media import DETERMINISTIC_X264, read_mp4
from tests._server import EventLog, fetch, get_once, running_server, wait_for

pytestmark = pytest.mark.anyio

PINNED = {"video_codec_options": DETERMINISTIC_X264}


@pytest.fixture
def events() -> EventLog:
    return EventLog()


async def test_a_realtime_request_streams_fragments_while_it_generates_and_holds_every_frame(
    events: EventLog,
) -> None:
    # 3 steps a second apart: a fragment of the first steps arrives before the last step is generated.
    app = create_app(on_event=events, session_options=PINNED)
    with running_server(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            async with client.stream(
                "GET", "/video.mp4?frames=9&size=32&seed=3&realtime=1&delay=1"
            ) as response:
                assert response.status_code == 200
                body = response.aiter_raw()
                pieces: list[bytes] = []
                while b"moof" not in b"".join(pieces):
                    pieces.append(await anext(body))
                assert not [e for e in events.events if e.kind == "completed"]  # still generating
                pieces.extend([data async for data in body])
            await wait_for(events, "completed")
            whole = await fetch(client, "/video.mp4?frames=9&size=32&seed=3")
    started = [e.request for e in events.events if e.kind == "started"]
    assert started[0] == VideoRequest(frames=9, size=32, seed=3, realtime=True, delay=1.0)
    assert started[1].realtime is False
    stepped, at_once = read_mp4(b"".join(pieces)).frames, read_mp4(whole).frames
    assert stepped.shape == (9, 32, 32, 3)
    # The steps decode to the frames of the whole latent (the causal cache carried between them).
    assert np.abs(stepped.astype(int) - at_once.astype(int)).mean() < 1.0
    assert open_containers() == 0


async def test_realtime_mode_feeds_a_user_latent_a_latent_frame_a_step(events: EventLog) -> None:
    asked: list[VideoRequest] = []

    def latents(request: VideoRequest) -> torch.Tensor:
        asked.append(request)
        return demo_latent(13, 16, request.seed)

    app = create_app(latents=latents, on_event=events, session_options=PINNED)
    with running_server(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            body = await fetch(client, "/video.mp4?frames=1&size=16&realtime=1&delay=0")
            await wait_for(events, "completed")
            stats = (await client.get("/stats")).json()
    assert asked == [VideoRequest(frames=1, size=16, seed=0, realtime=True, delay=0.0)]
    assert read_mp4(body).frames.shape[0] == 13  # the user's latent, not the query's frames
    assert stats["completed"] == 1 and stats["failed"] == 0 and stats["latency"]["requests"] == 1


async def test_a_client_that_leaves_a_realtime_stream_cancels_its_generation(events: EventLog) -> None:
    app = create_app(on_event=events, session_options=PINNED)
    with running_server(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            # 17 steps two seconds apart: the client leaves long before the generator would end.
            async with client.stream("GET", "/video.mp4?frames=65&size=32&realtime=1&delay=2") as response:
                async for _ in response.aiter_raw():
                    break
            await wait_for(events, "disconnected")
            stats = (await client.get("/stats")).json()
    assert stats["active"] == 0 and stats["disconnected"] == 1 and stats["open_containers"] == 0
    assert open_containers() == 0


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("realtime=2", "realtime must be 0 or 1"),
        ("realtime=yes", "realtime must be 0 or 1"),
        ("realtime=1&delay=2.5", "at most 2"),
        ("realtime=1&delay=-0.1", "delay must be a number"),
        ("realtime=1&delay=nan", "delay must be a number"),
        ("realtime=1&delay=inf", "delay must be a number"),
        ("realtime=1&delay=1e-1", "delay must be a number"),
        ("realtime=1&delay=", "delay must be a number"),
        ("realtime=1&delay=" + "0" * 5000, "delay must be a number"),
    ],
)
async def test_bad_realtime_values_are_a_400_that_names_the_problem(query: str, message: str) -> None:
    response = await get_once(create_app(), f"/video.mp4?frames=5&size=32&{query}")
    assert response.status_code == 400
    assert message in response.text
    assert len(response.text) < 200


@pytest.mark.parametrize(
    ("latent", "problem"),
    [
        (
            demo_latent(5, 16)[0],
            r"must be a 5-D latent \[batch, channels, frames, height, width\], got shape \(16,",
        ),
        (demo_latent(5, 16).int(), "must be a floating-point latent"),
        (
            demo_latent(5, 16, batch=2),
            r"must be of batch 1 in real-time mode \(realtime=1\), got shape \(2, 16,",
        ),
    ],
)
async def test_a_realtime_request_for_a_latent_it_cannot_stream_is_a_500_that_logs_the_real_problem(
    events: EventLog, caplog: pytest.LogCaptureFixture, latent: torch.Tensor, problem: str
) -> None:
    # A 4-D latent [C, T, H, W] from a user's latents= read as "batch 16".
    app = create_app(latents=lambda request: latent, on_event=events, session_options=PINNED)
    with running_server(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            response = await client.get("/video.mp4?frames=1&size=16&realtime=1&delay=0")
            await wait_for(events, "failed")
    assert response.status_code == 500
    (failure,) = [r for r in caplog.records if r.name == "streamvae.server" and r.exc_info]
    assert failure.exc_info is not None
    assert re.search(rf"^create_app: the latent of latents= {problem}", str(failure.exc_info[1]))
    assert "batch 16" not in str(failure.exc_info[1])
    assert open_containers() == 0
