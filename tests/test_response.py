"""``MP4Response``: a user's own route returns it, and the decode lives exactly as long as the response.

Driven in process: through ``httpx.ASGITransport`` (a Starlette or FastAPI app, as a user writes it) or
by calling the response as the ASGI app it is, with a ``receive`` and a ``send`` that play the client.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.from_thread
import httpx
import numpy as np
import pytest
import torch
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Message
from torch import Tensor

from streamvae import MP4ByteStream, read_entries, stream_mp4
from streamvae.pipelines import stream_generation
from streamvae.server import MediaTimePacer, MP4Response
from streamvae.testing import foreign_threads, open_containers
from tests._media import DETERMINISTIC_X264, read_mp4
from tests._vaes import latent, tiny_wan21
from tests.pipelines import BUILDERS, EXPECTED

pytestmark = pytest.mark.anyio

PINNED: dict[str, Any] = {"video_codec_options": DETERMINISTIC_X264}
SIZE = 16
#: entry b's frames are a flat grey of value GREYS[b] in [-1, 1], so a decoded frame says its entry
GREYS = (-0.5, 0.5)


class FrameDecoder:
    """A decoder of the protocol that publishes one flat grey SIZE×SIZE frame per latent frame.

    It counts the steps it published (``steps``), and can wait at step ``hold_at`` until ``release`` is
    set (a cancelled decode stops waiting, and its next publish ends it), then fail there (``fail_at``).
    """

    chunk_value_range = (-1.0, 1.0)

    def __init__(self, *, hold_at: int | None = None, fail_at: int | None = None) -> None:
        self.hold_at = hold_at
        self.fail_at = fail_at
        self.release = threading.Event()
        self.steps = 0

    def decode_with_chunks(self, z: Tensor, *, on_chunk: Callable[[Tensor], None]) -> None:
        greys = torch.tensor(GREYS[: z.shape[0]]).view(-1, 1, 1, 1, 1)
        for step in range(z.shape[2]):
            if step == self.hold_at:
                self._hold()
            if step == self.fail_at:
                raise RuntimeError(f"the decoder failed at step {step}")
            on_chunk(greys.expand(-1, 3, 1, SIZE, SIZE).contiguous())
            self.steps += 1

    def _hold(self) -> None:
        # A real step would end at its next boundary once cancelled: look for it between short waits.
        while not self.release.wait(0.01):
            try:
                anyio.from_thread.check_cancelled()
            except BaseException:
                return


def frames(batch: int, count: int) -> Tensor:
    """A latent the FrameDecoder decodes to ``count`` frames per entry."""
    return torch.zeros(batch, 4, count, 2, 2)


class RawClient:
    """The client side of one ASGI call: what the app sent, and a ``receive`` that reports a disconnect
    once :attr:`gone` is set (by the test, or by the first body part when ``leave_after_first_bytes``)."""

    def __init__(self, *, leave_after_first_bytes: bool = False, block_sends: bool = False) -> None:
        self.messages: list[Message] = []
        self.gone = anyio.Event()
        self.first_bytes = threading.Event()
        self.leave_after_first_bytes = leave_after_first_bytes
        self.block_sends = block_sends  # a reader that accepts nothing: every send waits forever
        self._requested = False

    async def receive(self) -> Message:
        if not self._requested:
            self._requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        self.messages.append(message)
        if self.block_sends:
            await anyio.sleep_forever()
        if message["type"] == "http.response.body" and message["body"]:
            self.first_bytes.set()
            if self.leave_after_first_bytes:
                self.gone.set()

    @property
    def statuses(self) -> list[int]:
        return [m["status"] for m in self.messages if m["type"] == "http.response.start"]

    @property
    def ended(self) -> bool:
        """Whether the response's last message (``more_body`` false) was sent."""
        return any(m["type"] == "http.response.body" and not m.get("more_body", False) for m in self.messages)

    async def call(self, response: Response) -> None:
        scope = {"type": "http", "method": "GET", "path": "/video.mp4", "headers": [], "query_string": b""}
        with anyio.fail_after(60):  # hang guard
            await response(scope, self.receive, self.send)


def starlette_app(make_response: Callable[[], Response]) -> Starlette:
    """A user's own app: ``GET /video.mp4`` returns ``make_response()``."""

    async def video(request: Request) -> Response:
        return make_response()

    return Starlette(routes=[Route("/video.mp4", video)])


async def get(app: Any) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client:
        with anyio.fail_after(120):  # hang guard
            return await client.get("/video.mp4")


def mean_grey(video: np.ndarray) -> np.ndarray:
    """Each decoded frame's mean pixel value, mapped back to [-1, 1]."""
    means: np.ndarray = video.reshape(video.shape[0], -1).mean(axis=1)
    return means / 127.5 - 1


# --------------------------------------------------------------------------- a user's route


async def test_a_starlette_route_returning_an_mp4_response_streams_every_frame() -> None:
    baseline = foreign_threads()
    decoder = FrameDecoder()
    app = starlette_app(lambda: MP4Response(stream_mp4(decoder, frames(1, 12), fps=16, **PINNED)))
    response = await get(app)
    assert response.status_code == 200
    assert response.headers["content-type"] == 'video/mp4; codecs="avc1.64000a"'
    video = read_mp4(response.content)
    assert video.frames.shape == (12, SIZE, SIZE, 3) and video.fps == 16
    assert np.allclose(mean_grey(video.frames), GREYS[0], atol=0.05)
    assert decoder.steps == 12
    assert open_containers() == 0
    assert foreign_threads() <= baseline


async def test_a_paced_response_holds_each_piece_until_its_media_time_and_sends_the_same_bytes() -> None:
    now = [0.0]  # a fake clock that a pacer's sleep advances: no real waiting
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    pacer = MediaTimePacer(16, clock=lambda: now[0], sleep=sleep)
    decoder = FrameDecoder()
    paced = await get(
        starlette_app(lambda: MP4Response(stream_mp4(decoder, frames(1, 12), fps=16, **PINNED), pacer=pacer))
    )
    plain = await get(
        starlette_app(lambda: MP4Response(stream_mp4(FrameDecoder(), frames(1, 12), fps=16, **PINNED)))
    )
    assert paced.status_code == 200 and paced.content == plain.content
    # The decode is faster than real time here: every piece after the first waited for its media time,
    # and the waits add up to the video's duration less its first piece's.
    assert slept and all(seconds > 0 for seconds in slept)
    assert abs(now[0] - sum(slept)) < 1e-9 and now[0] <= 12 / 16
    with pytest.raises(TypeError, match="^MP4Response: pacer must be a streamvae.server.MediaTimePacer"):
        MP4Response(stream_mp4(decoder, frames(1, 2), fps=16), pacer=16)  # type: ignore[arg-type]


async def test_the_body_is_the_mp4_stream_mp4_streams_for_a_diffusers_vae() -> None:
    vae: Any = tiny_wan21()
    z = latent(vae, frames=3)
    app = starlette_app(lambda: MP4Response(stream_mp4(vae, z, fps=16, **PINNED)))
    response = await get(app)
    async with stream_mp4(vae, z, fps=16, **PINNED) as (stream,):
        expected = b"".join([data async for data in stream])
    assert response.status_code == 200 and response.content == expected
    assert read_mp4(response.content).frames.shape == (9, 64, 64, 3)


async def test_a_fastapi_route_returning_an_mp4_response_is_passed_through() -> None:
    fastapi = pytest.importorskip("fastapi", reason="fastapi is not installed (the dev extras have it)")
    decoder = FrameDecoder()
    background: list[str] = []
    app = fastapi.FastAPI()

    async def video(tasks: Any) -> Response:
        tasks.add_task(lambda: background.append("ran"))
        return MP4Response(stream_mp4(decoder, frames(1, 5), fps=16, **PINNED))

    # FastAPI reads the annotations, which this module's `from __future__ import annotations` leaves as text.
    video.__annotations__ = {"tasks": fastapi.BackgroundTasks, "return": Response}
    app.get("/video.mp4")(video)

    response = await get(app)
    assert response.status_code == 200
    assert response.headers["content-type"] == 'video/mp4; codecs="avc1.64000a"'
    assert read_mp4(response.content).frames.shape == (5, SIZE, SIZE, 3)
    assert background == ["ran"]  # FastAPI hands its background tasks to the response, which runs them


async def test_a_route_streams_what_stream_generation_generates() -> None:
    pipe, make_kwargs = BUILDERS["wan21"]()

    def generated() -> MP4Response:
        return MP4Response(stream_generation(pipe, fps=8, session_options=PINNED, **make_kwargs()))

    response = await get(starlette_app(generated))
    async with stream_generation(pipe, fps=8, session_options=PINNED, **make_kwargs()) as (stream,):
        expected = b"".join([data async for data in stream])
    assert response.status_code == 200 and response.content == expected
    assert read_mp4(response.content).frames.shape == EXPECTED["wan21"].frames[1:]


@pytest.mark.parametrize("entry", [0, 1])
async def test_an_entry_of_a_batch_is_streamed_while_the_other_is_read_and_dropped(entry: int) -> None:
    # 40 frames: far more fragments than an entry's buffer holds, so an unread entry would stop both.
    decoder = FrameDecoder()
    z = frames(2, 40)
    response = await get(starlette_app(lambda: MP4Response(stream_mp4(decoder, z, fps=16), entry=entry)))
    assert response.status_code == 200
    video = read_mp4(response.content).frames
    assert video.shape == (40, SIZE, SIZE, 3)
    assert np.allclose(mean_grey(video), GREYS[entry], atol=0.05)
    assert open_containers() == 0


async def test_a_single_stream_of_a_users_own_block_is_sent_whatever_its_entry() -> None:
    @asynccontextmanager
    async def second_entry() -> AsyncIterator[MP4ByteStream]:
        # A block of one's own yields one stream; it reads the other itself, at the same time.
        async with (
            stream_mp4(FrameDecoder(), frames(2, 5), fps=16) as streams,
            anyio.create_task_group() as group,
        ):
            group.start_soon(drain, streams[0])
            yield streams[1]

    async def drain(stream: MP4ByteStream) -> None:
        async for _ in stream:
            pass

    response = await get(starlette_app(lambda: MP4Response(second_entry())))
    video = read_mp4(response.content).frames
    assert video.shape[0] == 5 and np.allclose(mean_grey(video), GREYS[1], atol=0.05)


# --------------------------------------------------------------------------- failures


async def test_a_decode_that_fails_before_its_first_bytes_is_a_500_with_a_short_message(
    caplog: pytest.LogCaptureFixture,
) -> None:
    decoder = FrameDecoder(fail_at=0)
    client = RawClient()
    await client.call(MP4Response(stream_mp4(decoder, frames(1, 5), fps=16)))
    assert client.statuses == [500]
    body = b"".join(m.get("body", b"") for m in client.messages)
    assert body == b"the decode failed\n" and client.ended
    (record,) = [r for r in caplog.records if r.name == "streamvae.server" and r.exc_info]
    assert record.exc_info is not None and "failed at step 0" in str(record.exc_info[1])  # logged, not sent
    # ... and through a user's app, a client sees the same.
    response = await get(starlette_app(lambda: MP4Response(stream_mp4(decoder, frames(1, 5), fps=16))))
    assert response.status_code == 500 and response.text == "the decode failed\n"
    assert open_containers() == 0


async def test_an_http_exception_before_the_first_bytes_is_answered_with_its_status() -> None:
    entered: list[bool] = []

    @asynccontextmanager
    async def busy() -> AsyncIterator[list[MP4ByteStream]]:
        entered.append(True)
        raise HTTPException(503, "busy, retry later", headers={"Retry-After": "7"})
        yield []  # pragma: no cover

    app = starlette_app(lambda: MP4Response(busy()))
    assert entered == []  # built, not entered: the block runs when the response is sent
    response = await get(app)
    assert entered == [True]
    assert response.status_code == 503 and response.headers["retry-after"] == "7"
    assert response.text == "busy, retry later\n"


async def test_a_decode_that_fails_after_its_first_bytes_leaves_the_body_incomplete() -> None:
    decoder = FrameDecoder(hold_at=2, fail_at=2)
    client = RawClient()

    async def release_once_bytes_are_out() -> None:
        await anyio.to_thread.run_sync(client.first_bytes.wait, 60)
        decoder.release.set()

    async with anyio.create_task_group() as group:
        group.start_soon(release_once_bytes_are_out)
        with pytest.raises(RuntimeError, match="failed at step 2"):
            await client.call(MP4Response(stream_mp4(decoder, frames(1, 8), fps=16)))
    assert client.statuses == [200]
    assert any(m.get("body") for m in client.messages)  # the first bytes went out...
    assert not client.ended  # ... and the body never ended: no 200 that looks complete
    assert open_containers() == 0


# --------------------------------------------------------------------------- the client goes away


async def test_a_client_that_disconnects_cancels_the_decode() -> None:
    baseline = foreign_threads()
    decoder = FrameDecoder(hold_at=3)  # held until the cancellation ends it
    client = RawClient(leave_after_first_bytes=True)
    await client.call(MP4Response(stream_mp4(decoder, frames(1, 100), fps=16)))
    assert client.statuses == [200] and not client.ended
    assert decoder.steps == 3  # the decode stopped where it was held, not at its 100th step
    assert open_containers() == 0
    assert foreign_threads() <= baseline


async def test_a_client_that_disconnects_before_the_first_bytes_cancels_the_decode() -> None:
    decoder = FrameDecoder(hold_at=0)
    client = RawClient()
    client.gone.set()
    await client.call(MP4Response(stream_mp4(decoder, frames(1, 100), fps=16)))
    assert client.messages == [] and decoder.steps == 0
    assert open_containers() == 0


async def test_a_reader_that_accepts_nothing_is_cut_off_after_the_stall_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    baseline = foreign_threads()
    decoder = FrameDecoder(hold_at=3)
    client = RawClient(block_sends=True)
    await client.call(MP4Response(stream_mp4(decoder, frames(1, 100), fps=16), stall_timeout=0.2))
    assert client.statuses == [200] and not client.ended  # the status line never left
    assert decoder.steps == 3  # the decode was cancelled, not run to its end
    assert any("cut off a reader" in r.getMessage() for r in caplog.records if r.name == "streamvae.server")
    assert open_containers() == 0
    assert foreign_threads() <= baseline


# --------------------------------------------------------------------------- arguments


async def test_a_stream_from_inside_the_block_is_refused_with_the_way_to_write_it() -> None:
    async with stream_mp4(FrameDecoder(), frames(1, 2), fps=16) as streams:
        for given in (streams, streams[0]):
            with pytest.raises(TypeError, match=r"^MP4Response takes the context manager .* before it"):
                MP4Response(given)  # type: ignore[arg-type]
        async for _ in streams[0]:
            pass


@pytest.mark.parametrize("given", [object(), b"mp4", [1, 2], read_entries])
def test_anything_but_an_async_context_manager_is_a_type_error(given: object) -> None:
    with pytest.raises(TypeError, match=r"^MP4Response takes an async context manager"):
        MP4Response(given)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("argument", "value", "message"),
    [
        *[("entry", value, "entry must be an int >= 0") for value in (-1, 1.5, "0", True, None)],
        *[
            ("stall_timeout", value, "stall_timeout must be a positive, finite number of seconds")
            for value in (0, -1, float("nan"), float("inf"), "30", True, None)
        ],
        *[("status_code", value, "status_code must be an int from 200 to 299") for value in (404, "200")],
        ("headers", {"x-a": 1}, "headers must map str to str"),
        ("headers", {"x-a": "é\u20ac"}, "headers must be latin-1"),
        ("headers", {"Content-Length": "5"}, "headers must not set content-length"),
    ],
)
def test_a_bad_value_is_a_value_error_naming_mp4_response(argument: str, value: object, message: str) -> None:
    cm = stream_mp4(FrameDecoder(), frames(1, 2), fps=16)
    with pytest.raises(ValueError, match=rf"^MP4Response: {message}"):
        options: dict[str, Any] = {argument: value}
        MP4Response(cm, **options)


def test_headers_that_are_no_mapping_are_a_type_error_and_given_ones_are_sent() -> None:
    cm = stream_mp4(FrameDecoder(), frames(1, 2), fps=16)
    with pytest.raises(TypeError, match=r"^MP4Response: headers must be a mapping"):
        MP4Response(cm, headers=[("x-a", "b")])  # type: ignore[arg-type]
    response = MP4Response(cm, headers={"Cache-Control": "no-store"}, status_code=201)
    assert response.status_code == 201 and response.media_type == "video/mp4"
    assert response.headers["cache-control"] == "no-store"
    assert response.headers["content-type"] == "video/mp4" and "content-length" not in response.headers
