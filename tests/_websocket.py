"""A WebSocket client of ``WS /v1/realtime/video`` over ASGI, and what the protocol promises about its pieces.

A connection is two memory streams driven from the test's task, so a test runs on asyncio and trio and
every wait has a hang guard. The fixtures ``vae`` (the demo VAE) and ``no_leaks`` are defined here and
imported into tests/conftest.py.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from fractions import Fraction
from typing import Any

import anyio
import pytest
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.types import ASGIApp, Message

from streamvae import SessionOptions
from streamvae.demo import demo_vae
from streamvae.server._websocket import realtime_video_endpoint
from streamvae.testing import foreign_threads, open_containers
from tests._media import DETERMINISTIC_X264, count_frames

PATH = "/v1/realtime/video"
#: seconds any one wait of a test may take before the test fails instead of hanging
HANG = 120.0
PINNED = SessionOptions(
    value_range=(-1.0, 1.0), fps=Fraction(16), output="fragmented", video_codec_options=DETERMINISTIC_X264
)


@pytest.fixture(scope="module", name="vae")
def demo_vae_fixture() -> Any:
    return demo_vae()


@pytest.fixture(name="no_leaks")
def no_leaks_fixture() -> Iterator[None]:
    """Fails the test if it leaves an MP4 container open or a thread of its own running."""
    threads = foreign_threads()
    yield
    assert open_containers() == 0
    assert foreign_threads() <= threads


def app_of(vae: Any, **keywords: Any) -> Starlette:
    return Starlette(routes=[WebSocketRoute(PATH, realtime_video_endpoint(vae, options=PINNED, **keywords))])


# -- a WebSocket client over ASGI --


#: a session's pieces as the client received them: each one's metadata message, then its binary frame
Pieces = list[tuple[dict[str, Any], bytes]]


class Client:
    """One connection to the app, from the test's side: what it sends, what it receives."""

    def __init__(self, to_app: Any, from_app: Any) -> None:
        self._to_app = to_app
        self._from_app = from_app
        self.left = False

    async def send_json(self, message: object) -> None:
        await self.send_text(json.dumps(message))

    async def send_text(self, text: str) -> None:
        await self._to_app.send({"type": "websocket.receive", "text": text})

    async def send_bytes(self, data: bytes) -> None:
        await self._to_app.send({"type": "websocket.receive", "bytes": data})

    async def receive(self) -> Message:
        with anyio.fail_after(HANG):
            message: Message = await self._from_app.receive()
        return message

    async def receive_json(self) -> dict[str, Any]:
        message = await self.receive()
        assert message["type"] == "websocket.send" and message.get("text") is not None, message
        parsed: dict[str, Any] = json.loads(message["text"])
        return parsed

    async def receive_bytes(self) -> bytes:
        message = await self.receive()
        assert message["type"] == "websocket.send" and message.get("bytes") is not None, message
        data: bytes = message["bytes"]
        return data

    async def closed(self) -> int:
        """The close code the server ended the connection with (its next message must be the close)."""
        message = await self.receive()
        assert message["type"] == "websocket.close", message
        code: int = message.get("code", 1000)
        return code

    async def receive_other(self, pieces: Pieces) -> dict[str, Any]:
        """The next message that is not a piece; the pieces before it (metadata, binary frame) go to
        ``pieces``.

        The pieces a session has written go out whatever the client says meanwhile: an answer to a client
        message may come after some of them.
        """
        while (message := await self.receive_json())["type"] == "video.chunk_metadata":
            pieces.append((message, await self.receive_bytes()))
        return message

    async def receive_until_done(self) -> tuple[Pieces, dict[str, Any]]:
        """Every piece until ``session.done``, and that message."""
        pieces: Pieces = []
        done = await self.receive_other(pieces)
        assert done["type"] == "session.done", done
        return pieces, done

    async def receive_until_it_fails(self) -> dict[str, Any]:
        """Start the session and read past its ``video.start`` and pieces to the message that ends it; the
        connection then closes with 1011 (the generation failed)."""
        await self.send_json({"type": "session.start"})
        while (message := await self.receive_json())["type"] in ("video.start", "video.chunk_metadata"):
            if message["type"] == "video.chunk_metadata":
                await self.receive_bytes()
        assert await self.closed() == 1011
        return message

    async def leave(self) -> None:
        self.left = True
        await self._to_app.send({"type": "websocket.disconnect", "code": 1001})


@asynccontextmanager
async def connect(app: ASGIApp, path: str = PATH) -> AsyncIterator[Client]:
    """A connection to ``path``, accepted; leaving the block leaves and waits for the app to end."""
    scope = {
        "type": "websocket",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "scheme": "ws",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [],
        "server": ("testserver", 80),
        "client": ("testclient", 50000),
        "subprotocols": [],
    }
    to_app_send, to_app_receive = anyio.create_memory_object_stream[Message](math.inf)
    from_app_send, from_app_receive = anyio.create_memory_object_stream[Message](math.inf)
    ended = anyio.Event()

    async def serve() -> None:
        try:
            await app(scope, to_app_receive.receive, from_app_send.send)
        finally:
            ended.set()

    async with anyio.create_task_group() as group:
        group.start_soon(serve)
        client = Client(to_app_send, from_app_receive)
        await to_app_send.send({"type": "websocket.connect"})
        assert (await client.receive())["type"] == "websocket.accept"
        yield client
        if not client.left:
            await client.leave()  # what a server sends the app once the connection is gone
        with anyio.fail_after(HANG):
            await ended.wait()


def check_pieces(pieces: Pieces, request_id: str, frames: int) -> bytes:
    """The protocol's promises about the pieces; returns their concatenation."""
    assert [meta["transport_chunk_index"] for meta, _ in pieces] == list(range(len(pieces)))
    for meta, data in pieces:
        assert meta["type"] == "video.chunk_metadata" and meta["kind"] == "media"
        assert meta["request_id"] == request_id
        assert meta["byte_length"] == len(data) > 0
    assert sum(meta["num_frames"] for meta, _ in pieces) == frames
    # Each piece lets the client show exactly its num_frames more frames.
    shown = 0
    for count in range(1, len(pieces) + 1):
        shown += pieces[count - 1][0]["num_frames"]
        assert count_frames(b"".join(data for _, data in pieces[:count])) == shown
    return b"".join(data for _, data in pieces)
