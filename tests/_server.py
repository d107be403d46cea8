"""Run an ASGI app under uvicorn on 127.0.0.1 in its own thread (uvicorn needs asyncio; tests may be trio).

The listening socket is bound and listening before uvicorn starts, so a client may connect at once: the
kernel queues the connection until uvicorn accepts it, and no test waits for the server to come up.
"""

from __future__ import annotations

import queue
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio.from_thread
import anyio.to_thread
import httpx
import uvicorn

from streamvae.server import ServerEvent


@contextmanager
def running_server(app: Any, *, send_buffer: int | None = None) -> Iterator[str]:
    """Serve ``app`` while the block runs; yields its base URL (``http://127.0.0.1:PORT``).

    ``send_buffer`` sets SO_SNDBUF on the listening socket, which accepted connections inherit (and it
    stops the kernel from growing it): a small one lets a client that stops reading stall the server soon.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if send_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="uvicorn", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
        assert not thread.is_alive(), "uvicorn did not shut down"


class EventLog:
    """Collects a server's :class:`ServerEvent` s; a test waits for one without polling or sleeping.

    The server calls it on its own thread; :meth:`wait_for` blocks a worker thread of the test until the
    event arrives, or fails after ``timeout`` seconds: a broken server fails the test instead of hanging it.
    """

    def __init__(self) -> None:
        self.events: list[ServerEvent] = []
        self._queue: queue.Queue[ServerEvent] = queue.Queue()
        self._seen: list[ServerEvent] = []

    def __call__(self, event: ServerEvent) -> None:
        self.events.append(event)
        self._queue.put(event)

    def wait_for(self, kind: str, count: int = 1, timeout: float = 120.0) -> list[ServerEvent]:
        """Block until ``count`` events of ``kind`` have been seen in all; return them."""
        while sum(e.kind == kind for e in self._seen) < count:
            try:
                self._seen.append(self._queue.get(timeout=timeout))
            except queue.Empty:
                kinds = [e.kind for e in self._seen]
                raise AssertionError(f"no {count}× {kind!r} after {timeout} s; seen {kinds}") from None
        return [e for e in self._seen if e.kind == kind]


class GatedDecoder:
    """The demo VAE's chunked decoder that pauses after ``pause_after`` chunks until :attr:`gate` is set.

    A test holds a decode mid-way with it (to see bytes arrive before the end, or to keep a slot taken). A
    cancelled decode leaves the pause at once, and its next chunk ends it. One instance may run several
    decodes at once (the server shares it between requests), each pausing after its own ``pause_after``.
    """

    def __init__(self, inner: Any, *, pause_after: int | None = None) -> None:
        self.inner = inner
        self.chunk_value_range = inner.chunk_value_range
        self.latent_channels = inner.latent_channels
        self.prepare_latents = inner.prepare_latents
        self.pause_after = pause_after
        self.gate = threading.Event()
        self.published = 0  # chunks published, every decode together
        self.running = 0  # decodes in progress
        self._lock = threading.Lock()

    def decode_with_chunks(self, z: Any, *, on_chunk: Any) -> None:
        count = 0

        def publish(chunk: Any) -> None:
            nonlocal count
            on_chunk(chunk)
            count += 1
            with self._lock:
                self.published += 1
            if count == self.pause_after:
                self._pause()

        with self._lock:
            self.running += 1
        try:
            self.inner.decode_with_chunks(z, on_chunk=publish)
        finally:
            with self._lock:
                self.running -= 1

    def _pause(self) -> None:
        # Wait for the gate, checking for cancellation between waits as a real decode step would.
        while not self.gate.wait(0.02):
            try:
                anyio.from_thread.check_cancelled()
            except BaseException:
                return  # the caller was cancelled: the next publish ends the decode


async def get_once(app: Any, path: str) -> httpx.Response:
    """One GET of ``path`` from ``app`` served on 127.0.0.1 for this request alone."""
    with running_server(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            return await client.get(path)


async def wait_for(events: EventLog, kind: str, count: int = 1) -> None:
    """Wait, from an async test, until ``events`` has seen ``count`` events of ``kind``."""
    await anyio.to_thread.run_sync(lambda: events.wait_for(kind, count))


async def fetch(client: httpx.AsyncClient, url: str) -> bytes:
    """The whole body of an H.264 video response to a GET of ``url``."""
    async with client.stream("GET", url) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith('video/mp4; codecs="avc1.')
        return b"".join([data async for data in response.aiter_raw()])
