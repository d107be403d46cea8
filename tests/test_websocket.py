"""``WS /v1/realtime/video``: vllm-omni's protocol, served by a Starlette app around the endpoint.

Most tests drive the endpoint's ASGI app directly from the test's task (a connection is two memory
streams), so they run on asyncio and trio and every wait has a hang guard; one runs it under uvicorn with a
real WebSocket client.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from fractions import Fraction
from typing import Any

import anyio
import numpy as np
import pytest
import torch
from starlette.types import ASGIApp, Message

from streamvae import SessionOptions, decode_to_mp4
from streamvae.demo import demo_latent
from streamvae.server import create_app
from streamvae.server._pacing import MediaTimePacer
from streamvae.server._websocket import (
    MAX_CONTROL_BYTES,
    MAX_START_BYTES,
    realtime_video_endpoint,
)
from streamvae.testing import open_containers
from tests._media import DETERMINISTIC_X264, read_mp4
from tests._server import running_server
from tests._websocket import HANG, PATH, PINNED, Client, Pieces, app_of, check_pieces, connect


async def start_and_receive_a_piece(client: Client) -> dict[str, Any]:
    """Start the session and wait for its first piece; the ``video.start`` message."""
    await client.send_json({"type": "session.start"})
    start = await client.receive_json()
    assert start["type"] == "video.start", start
    assert (await client.receive_json())["type"] == "video.chunk_metadata"
    await client.receive_bytes()
    return start


def wan_step_of(frame: int) -> int:
    """The latent frame a Wan decode's video frame comes from: 1 frame, then 4 a latent frame."""
    return 0 if frame == 0 else (frame - 1) // 4 + 1


class GatedSteps:
    """A generator that gives ``free`` latent steps (one latent frame each) at once, then waits for
    :attr:`gate` before each next one; it counts its steps and notes when it is closed."""

    def __init__(self, free: int, latent_frames: int = 11) -> None:
        self.free = free
        self.latent = demo_latent(1 + 4 * (latent_frames - 1), 16, 0)
        self.gate = anyio.Event()
        self.steps = 0
        self.closed = False
        self.starts: list[dict[str, Any]] = []

    def __call__(self, start: dict[str, Any]) -> AsyncIterator[torch.Tensor]:
        self.starts.append(start)
        return self._steps()

    async def _steps(self) -> AsyncIterator[torch.Tensor]:
        try:
            for step in range(self.latent.shape[2]):
                if step >= self.free:
                    await self.gate.wait()
                self.steps += 1
                yield self.latent[:, :, step : step + 1]
        finally:
            self.closed = True


START = {"type": "session.start", "num_frames": 9, "width": 48, "height": 32, "seed": 3}


# -- the protocol --


@pytest.mark.anyio
async def test_a_session_sends_every_fragment_with_its_metadata_then_done(vae: Any, no_leaks: None) -> None:
    ignored = {"model": "Wan-AI/Wan2.1", "prompt": "a cat", "fps": 24, "sampling_params": {"steps": 4}}
    async with connect(app_of(vae)) as client:
        await client.send_json({**START, "format": "m4s", **ignored})
        start = await client.receive_json()
        pieces, done = await client.receive_until_done()
        assert await client.closed() == 1000
    assert start["type"] == "video.start" and start["format"] == "m4s"
    assert isinstance(start["request_id"], str) and start["request_id"]
    assert isinstance(start["config"], dict) and start["config"]["fps"] == 16
    video = check_pieces(pieces, start["request_id"], 9)
    shown = 0  # the stand-in steps one latent frame at a time: a piece's step is its last frame's
    for meta, _ in pieces:
        shown += meta["num_frames"]
        assert meta["generation_chunk_index"] == wan_step_of(shown - 1)
        # No interaction: every piece says so, with empty lists.
        assert meta["started_event_ids"] == meta["active_event_ids"] == meta["completed_event_ids"] == []
    statistics = done.pop("statistics")
    assert done == {
        "type": "session.done",
        "request_id": start["request_id"],
        "chunks": len(pieces),
        "stopped": False,
    }
    # The session's own numbers: every frame and byte sent, and no interaction to time.
    assert statistics["frames_encoded"] == 9 and statistics["bytes_out"] == len(video)
    assert statistics["control_to_photon_seconds"] == []
    decoded = read_mp4(video)
    assert decoded.frames.shape == (9, 32, 48, 3) and decoded.fps == 16  # the session's fps, not the client's
    latent = demo_latent(9, 48, 3)[..., :4, :6]
    (whole,) = await decode_to_mp4(vae, latent, options=PINNED)
    # The steps decode to the frames of the whole latent (the causal cache carried between them).
    assert np.abs(decoded.frames.astype(int) - read_mp4(whole).frames.astype(int)).mean() < 1.0


@pytest.mark.anyio
async def test_a_custom_generator_gets_the_start_and_its_steps_number_the_pieces(
    vae: Any, no_leaks: None
) -> None:
    latent = demo_latent(1 + 4 * 5, 32, 7)  # 6 latent frames, in steps of 2
    starts: list[dict[str, Any]] = []

    async def two_at_a_time(start: dict[str, Any]) -> AsyncIterator[torch.Tensor]:
        starts.append(start)
        for step in range(3):
            yield latent[:, :, 2 * step : 2 * step + 2]

    async with connect(app_of(vae, generator=two_at_a_time)) as client:
        await client.send_json({"type": "session.start", "prompt": "waves"})
        start = await client.receive_json()
        pieces, done = await client.receive_until_done()
    assert starts == [{"type": "session.start", "prompt": "waves"}]
    assert start["config"] == {"prompt": "waves", "fps": 16.0, "codecs": "avc1.64000a"}
    check_pieces(pieces, start["request_id"], 21)
    shown = 0
    for meta, _ in pieces:
        shown += meta["num_frames"]
        assert meta["generation_chunk_index"] == wan_step_of(shown - 1) // 2
    assert pieces[-1][0]["generation_chunk_index"] == 2
    assert done["chunks"] == len(pieces) and done["stopped"] is False


@pytest.mark.anyio
async def test_ping_is_answered_with_pong_while_the_generation_runs(vae: Any, no_leaks: None) -> None:
    steps = GatedSteps(free=2)
    async with connect(app_of(vae, generator=steps)) as client:
        await start_and_receive_a_piece(client)
        await client.send_json({"type": "session.ping"})
        pieces: Pieces = []
        assert await client.receive_other(pieces) == {"type": "session.pong"}
        steps.gate.set()
        rest, done = await client.receive_until_done()
    assert done["stopped"] is False and done["chunks"] == 1 + len(pieces) + len(rest)
    assert steps.steps == 11


@pytest.mark.anyio
async def test_stop_ends_the_generation_and_done_counts_the_chunks_sent(vae: Any, no_leaks: None) -> None:
    steps = GatedSteps(free=2)
    async with connect(app_of(vae, generator=steps)) as client:
        start = await start_and_receive_a_piece(client)
        await client.send_json({"type": "session.stop"})
        pieces: Pieces = []
        done = await client.receive_other(pieces)
        assert await client.closed() == 1000
    chunks = 1 + len(pieces)  # those sent before the stop: the frames of the two steps, 4 at most
    assert done.pop("statistics")["control_to_photon_seconds"] == []
    assert done == {
        "type": "session.done",
        "request_id": start["request_id"],
        "chunks": chunks,
        "stopped": True,
    }
    assert chunks <= 4
    assert steps.closed and steps.steps == 2  # the generator was closed where it waited


@pytest.mark.anyio
async def test_leaving_mid_stream_stops_the_generation_and_the_decode(vae: Any, no_leaks: None) -> None:
    steps = GatedSteps(free=2)
    async with connect(app_of(vae, generator=steps)) as client:
        await start_and_receive_a_piece(client)
        await client.leave()
    # The block waited for the endpoint to return: the generator is closed, no container or thread is left.
    assert steps.closed and steps.steps == 2


@pytest.mark.anyio
async def test_no_start_within_the_start_timeout_is_an_error(vae: Any, no_leaks: None) -> None:
    async with connect(app_of(vae, start_timeout=0.05)) as client:
        error = await client.receive_json()
        assert await client.closed() == 1008
    assert error == {
        "type": "error",
        "code": "start_timeout",
        "message": "no session.start within 0.05 s of connecting",
    }


@pytest.mark.anyio
async def test_a_client_that_stalls_gets_an_error_and_its_generation_ends(vae: Any, no_leaks: None) -> None:
    steps = GatedSteps(free=2)  # after the first piece nothing more comes, and the client says nothing
    async with connect(app_of(vae, generator=steps, stall_timeout=0.5)) as client:
        await start_and_receive_a_piece(client)
        error = await client.receive_other([])
        assert await client.closed() == 1008
    assert error["type"] == "error" and error["code"] == "stall_timeout"
    assert error["message"].startswith("stall timeout")
    assert steps.closed


@pytest.mark.parametrize(
    ("message", "error", "code"),
    [
        ("{not json", "session.start is not valid JSON", 1008),
        ("[1, 2]", "session.start must be a JSON object, got list", 1008),
        (
            '{"type": "session.begin"}',
            "must be session.start, got type 'session.begin'",
            1008,
        ),
        (
            '{"type": "session.ping"}',
            "must be session.start, got type 'session.ping'",
            1008,
        ),
        ('{"type": "session.start", "format": "mp4"}', "session.start: format must be 'm4s'", 1008),
        (b'{"type": "session.start"}', "session.start must be a JSON text message, got a binary one", 1008),
        ("x" * (MAX_START_BYTES + 1), f"over the limit of {MAX_START_BYTES} bytes", 1009),
        ('{"type": "session.start", "num_frames": 10}', "num_frames: frames must be 1 + 4k", 1008),
        ('{"type": "session.start", "num_frames": 261}', "num_frames must be an integer from 1 to 257", 1008),
        ('{"type": "session.start", "num_frames": "9"}', "num_frames must be an integer from 1 to 257", 1008),
        ('{"type": "session.start", "num_frames": 9.0}', "num_frames must be an integer", 1008),
        ('{"type": "session.start", "width": 40}', "width: size must be a positive multiple of 16", 1008),
        ('{"type": "session.start", "height": 528}', "height must be an integer from 16 to 512", 1008),
        ('{"type": "session.start", "seed": -1}', "seed must be an integer from 0 to", 1008),
        ('{"type": "session.start", "seed": true}', "seed must be an integer", 1008),
    ],
)
@pytest.mark.anyio
async def test_a_start_that_is_not_valid_is_an_error_and_the_connection_closes(
    vae: Any, message: str | bytes, error: str, code: int
) -> None:
    async with connect(app_of(vae)) as client:
        if isinstance(message, bytes):
            await client.send_bytes(message)
        else:
            await client.send_text(message)
        answer = await client.receive_json()
        assert await client.closed() == code
    assert answer["type"] == "error" and error in answer["message"], answer
    malformed = "JSON" in error or "over the limit" in error  # not a message at all
    assert answer["code"] == ("invalid_message" if malformed else "invalid_start"), answer


@pytest.mark.anyio
async def test_a_control_message_that_is_not_valid_is_an_error_and_the_session_goes_on(
    vae: Any, no_leaks: None
) -> None:
    steps = GatedSteps(free=2)
    bad = [
        ("not json", "invalid_message", "a control message is not valid JSON"),
        ('"session.stop"', "invalid_message", "a control message must be a JSON object, got str"),
        (
            '{"type": "session.pause"}',
            "unknown_type",
            "unknown message type 'session.pause' (expected session.interaction, session.ping or",
        ),
        ('{"type": "session.start"}', "already_started", "session.start: this session has started already"),
        (" " * (MAX_CONTROL_BYTES + 1), "invalid_message", f"over the limit of {MAX_CONTROL_BYTES} bytes"),
    ]
    async with connect(app_of(vae, generator=steps)) as client:
        await start_and_receive_a_piece(client)
        pieces: Pieces = []
        for text, code, error in bad:
            await client.send_text(text)
            answer = await client.receive_other(pieces)
            assert answer["type"] == "error" and answer["code"] == code, answer
            assert error in answer["message"], answer
        await client.send_json({"type": "session.stop"})
        done = await client.receive_other(pieces)
    assert done["type"] == "session.done" and done["stopped"] is True
    assert done["chunks"] == 1 + len(pieces)


@pytest.mark.anyio
async def test_a_generator_that_fails_ends_the_session_with_an_error(vae: Any, no_leaks: None) -> None:
    async def fails_at_step_two(start: dict[str, Any]) -> AsyncIterator[torch.Tensor]:
        latent = demo_latent(9, 16, 0)
        yield latent[:, :, :1]
        yield latent[:, :, 1:2]
        raise ValueError("the prompt ran out")

    async def gives_a_wrong_piece(start: dict[str, Any]) -> AsyncIterator[torch.Tensor]:
        yield torch.zeros(2, 16, 1, 2, 2)

    for generator, error in [
        (fails_at_step_two, "the generation failed: the prompt ran out"),
        (gives_a_wrong_piece, "piece 0 must be of batch 1, got shape (2, 16, 1, 2, 2)"),
    ]:
        async with connect(app_of(vae, generator=generator)) as client:
            # video.start comes with the first piece: a generation that fails before one sends none.
            message = await client.receive_until_it_fails()
        assert message["type"] == "error" and error in message["message"], message


@pytest.mark.anyio
async def test_a_paced_session_waits_for_each_piece_on_the_pacer(vae: Any, no_leaks: None) -> None:
    paced: list[MediaTimePacer] = []
    slept: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)

    def pacer(fps: object) -> MediaTimePacer:
        assert fps == 16
        paced.append(MediaTimePacer(16, lead=0.0, clock=lambda: 0.0, sleep=fake_sleep))  # a frozen clock
        return paced[-1]

    async with connect(app_of(vae, pacer=pacer)) as client:
        await client.send_json({**START, "num_frames": 13})
        await client.receive_json()
        pieces, _ = await client.receive_until_done()
    (used,) = paced
    statistics = used.statistics()
    assert statistics.fragments == len(pieces) and statistics.frames == 13
    # With the clock frozen at 0, each piece after the first waits for the frames before it.
    sent = [meta["num_frames"] for meta, _ in pieces]
    expected = [sum(sent[:index]) / 16 for index in range(1, len(sent))]
    assert slept == pytest.approx([delay for delay in expected if delay > 0])


def test_the_endpoint_checks_its_arguments_when_made(vae: Any) -> None:
    with pytest.raises(TypeError, match="realtime_video_endpoint"):
        realtime_video_endpoint(object())
    with pytest.raises(TypeError, match="realtime_video_endpoint: generator must be a callable"):
        realtime_video_endpoint(vae, generator=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="realtime_video_endpoint: decode_limiter must be"):
        realtime_video_endpoint(vae, decode_limiter=2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="realtime_video_endpoint: options must write fragmented MP4"):
        realtime_video_endpoint(vae, options=SessionOptions(value_range=(-1.0, 1.0), fps=Fraction(16)))
    with pytest.raises(ValueError, match="realtime_video_endpoint: stall_timeout must be a positive"):
        realtime_video_endpoint(vae, stall_timeout=0)
    with pytest.raises(ValueError, match="realtime_video_endpoint: max_frames must be an int"):
        realtime_video_endpoint(vae, max_frames=0)


def test_uvicorn_serves_the_endpoint_to_a_websocket_client(vae: Any) -> None:
    from websockets.sync import client as sync_client

    app = app_of(vae)
    pieces: list[bytes] = []
    with running_server(app) as url, sync_client.connect(url.replace("http", "ws") + PATH) as websocket:
        websocket.send(json.dumps({**START, "model": "m", "prompt": "p"}))
        assert json.loads(websocket.recv(timeout=HANG))["type"] == "video.start"
        while (message := json.loads(websocket.recv(timeout=HANG)))["type"] == "video.chunk_metadata":
            data = websocket.recv(timeout=HANG)
            assert isinstance(data, bytes) and len(data) == message["byte_length"]
            pieces.append(data)
    assert message == {**message, "type": "session.done", "chunks": len(pieces), "stopped": False}
    assert read_mp4(b"".join(pieces)).frames.shape == (9, 32, 48, 3)
    assert open_containers() == 0


@pytest.mark.anyio
async def test_the_demo_app_serves_the_protocol_with_the_users_generator(vae: Any, no_leaks: None) -> None:
    latent = demo_latent(1 + 4 * 3, 32, 5)

    async def one_at_a_time(start: dict[str, Any]) -> AsyncIterator[torch.Tensor]:
        for step in range(latent.shape[2]):
            yield latent[:, :, step : step + 1]

    app = create_app(
        vae=vae, generator=one_at_a_time, session_options={"video_codec_options": DETERMINISTIC_X264}
    )
    async with connect(app) as client:
        await client.send_json({"type": "session.start", "format": "m4s"})
        start = await client.receive_json()
        pieces, done = await client.receive_until_done()
    video = check_pieces(pieces, start["request_id"], 13)
    assert read_mp4(video).frames.shape == (13, 32, 32, 3) and done["stopped"] is False
    with pytest.raises(TypeError, match="^create_app: generator must be a callable"):
        create_app(vae=vae, generator=3)  # type: ignore[arg-type]


async def knock(app: ASGIApp, extensions: dict[str, Any]) -> list[Message]:
    """What the app sends a connection it is offered, whose client says nothing after connecting."""
    scope = {
        "type": "websocket",
        "path": PATH,
        "headers": [],
        "query_string": b"",
        "subprotocols": [],
        "extensions": extensions,
    }
    sent: list[Message] = []
    incoming = [{"type": "websocket.connect"}]

    async def receive() -> Message:
        if incoming:
            return incoming.pop()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        sent.append(message)

    with anyio.fail_after(HANG):  # hang guard
        await app(scope, receive, send)
    return sent


@pytest.mark.anyio
async def test_websocket_sessions_take_the_apps_decode_slots_and_one_beyond_them_is_refused(
    vae: Any, no_leaks: None
) -> None:
    latent = demo_latent(1 + 4 * 2, 32, 5)
    release = anyio.Event()

    async def held(start: dict[str, Any]) -> AsyncIterator[torch.Tensor]:
        yield latent[:, :, :2]  # 5 frames: the first piece (and video.start with it) is written
        await release.wait()  # the first session holds its slot until the test lets it go
        yield latent[:, :, 2:]

    app = create_app(vae=vae, generator=held, max_concurrent=1, max_queued=0)
    async with connect(app) as client:
        await client.send_json({"type": "session.start", "format": "m4s"})
        await client.receive_json()  # video.start: the session has its slot
        assert app.state.stats.active == 1
        # A server with the WebSocket Denial Response extension (uvicorn) sends a 503 the client can read.
        extensions = {"websocket.http.response": {}}
        assert await knock(app, extensions) == [
            {
                "type": "websocket.http.response.start",
                "status": 503,
                "headers": [
                    (b"retry-after", b"5"),
                    (b"content-length", b"62"),
                    (b"content-type", b"text/plain; charset=utf-8"),
                ],
            },
            {
                "type": "websocket.http.response.body",
                "body": b"busy: every decode slot and queue place is taken, retry later\n",
            },
        ]
        # Without it: accepted, told why in an error, and closed with 1013 (try again later).
        accepted, told, closed = await knock(app, {})
        assert accepted == {"type": "websocket.accept", "subprotocol": None, "headers": []}
        assert json.loads(told["text"]) == {
            "type": "error",
            "code": "busy",
            "message": "busy: every decode slot and queue place is taken, retry later",
            "retry_after": 5,
        }
        assert closed == {"type": "websocket.close", "code": 1013, "reason": ""}
        assert app.state.stats.rejected == 2
        release.set()
        pieces, done = await client.receive_until_done()
    assert pieces and done["stopped"] is False
    assert app.state.stats.active == 0 and app.state.stats.completed == 1  # the slot was given back
