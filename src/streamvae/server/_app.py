"""The app: ``GET /`` (the page), ``GET /video.mp4`` (a decode, streamed as it is written), ``GET /stats``.

With ``realtime=1`` a generator's pieces reach the decode one at a time (``_realtime``), under the same rules:
the same path as ``WS /v1/realtime/video``'s sessions, which share the app's slots, counters and latency.

Each request's latency numbers (:class:`streamvae.SessionStatistics`) are logged when it ends (logger
``streamvae.server``, info) and ``/stats`` summarizes those of the last completed requests.

Every response ends its decode: a client that disconnects (while queued or streaming) cancels it, and so
does a reader that accepts no bytes for ``stall_timeout`` seconds — otherwise one stalled client would
hold a decode slot, and with it the accelerator, for as long as it likes. The decode then stops at its next
chunk and its session closes (no container, thread or slot outlives the request).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from importlib.resources import files
from typing import Any, Literal

import anyio
from starlette.applications import Starlette
from starlette.datastructures import QueryParams
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket
from torch import Tensor

from streamvae._checks import check_bool, check_callable, check_fps, check_int, check_limiter, check_seconds
from streamvae._decode import stream_mp4
from streamvae._encode import open_containers
from streamvae._options import SessionOptions, resolve_option_dict
from streamvae._session import ChunkedVideoMP4Session
from streamvae._sinks import MP4ByteStream
from streamvae._statistics import SessionStatistics
from streamvae.demo import DEMO_FPS, check_demo_request, demo_latent, demo_vae
from streamvae.models import as_decoder
from streamvae.server._admission import Admission, Outcome, Ticket
from streamvae.server._latency import LatencyWindow
from streamvae.server._pacing import MediaTimePacer
from streamvae.server._realtime import (
    Interactions,
    RealtimePiece,
    call_generator,
    demo_generator,
    latent_steps,
    open_realtime,
    parse_realtime,
)
from streamvae.server._response import MP4Response, ReaderStalledError
from streamvae.server._websocket import Admitted, LatentGenerator, websocket_endpoint

logger = logging.getLogger("streamvae.server")


@dataclass(frozen=True)
class VideoRequest:
    """What a client asked for in ``/video.mp4``'s query string."""

    frames: int
    size: int
    seed: int
    #: feed the latent to the decode one latent frame a step, as an autoregressive model would
    realtime: bool = False
    #: seconds each real-time step takes (0 … 2)
    delay: float = 0.0
    #: real-time mode: ask the generator for its sound too (the stand-in's tone)
    audio: bool = False


EventKind = Literal[
    "queued", "started", "completed", "stopped", "disconnected", "stalled", "failed", "rejected"
]


@dataclass(frozen=True)
class ServerEvent:
    """One step of one request's or WebSocket session's life, for ``on_event`` (metrics, logs, tests).

    ``queued`` → ``started`` (it holds a slot) → exactly one of ``completed``, ``stopped`` (the client's
    ``session.stop``), ``disconnected``, ``stalled``, ``failed``; or ``rejected`` alone. An ending event is
    sent once the request's decode has stopped and its session is closed.
    """

    kind: EventKind
    #: what ``/video.mp4`` was asked for; None for a WebSocket session
    request: VideoRequest | None
    #: the request's number, counted from 1 per app (``/video.mp4`` and WebSocket sessions together)
    number: int
    #: the WebSocket session's ``request_id`` (None for ``/video.mp4``)
    request_id: str | None = None


def create_app(
    *,
    vae: Any | None = None,
    latents: Callable[[VideoRequest], Tensor] | None = None,
    fps: float = DEMO_FPS,
    max_concurrent: int = 8,
    max_queued: int = 16,
    stall_timeout: float = 30.0,
    retry_after: int = 5,
    max_frames: int = 257,
    max_size: int = 512,
    session_options: dict[str, Any] | None = None,
    encode_limiter: anyio.CapacityLimiter | None = None,
    on_event: Callable[[ServerEvent], None] | None = None,
    generator: LatentGenerator | None = None,
    pace: bool = False,
) -> Starlette:
    """The streaming app: ``/`` (page), ``/video.mp4`` (the decode, streamed), ``/stats`` and
    ``WS /v1/realtime/video`` (the real-time protocol of vllm-omni's route, see
    :func:`streamvae.server.realtime_video_endpoint`).

    - ``vae``: what decodes (a diffusers VAE streamvae supports, or any
      :class:`streamvae.SupportsChunkedVAEDecode`); default the embedded :func:`streamvae.demo.demo_vae`.
      One instance serves every request: the adapters keep their decoder caches per decode.
    - ``latents``: builds the latent for a request; it runs in a worker thread (in real-time mode too,
      which then streams that latent's frames one latent frame a step). It is only called with
      1 ≤ frames ≤ ``max_frames``, 1 ≤ size ≤ ``max_size`` and 0 ≤ seed ≤ 2**64 − 1 (what
      ``torch.Generator.manual_seed`` takes); any other value is a 400. Default
      :func:`streamvae.demo.demo_latent` with the request's frames, size and seed (frames must also be
      1 + 4k, size a multiple of 16).
    - ``fps``: frames per second of every video.
    - ``max_concurrent``: decodes at once (also the worker threads decoding); ``max_queued``: requests
      that wait for a slot; more get 503 with ``Retry-After: retry_after`` (seconds).
    - ``stall_timeout``: seconds a reader may take to accept a piece of the MP4 before it is cut off; a
      WebSocket session ends stalled after that long with nothing sent and no message from its client.
    - ``session_options``: extra :class:`streamvae.SessionOptions` keywords (codec options, ...), all but
      ``fps`` and ``encode_limiter``, which are create_app's own.
    - ``encode_limiter``: the encode budget every request's session shares (its ``encode_limiter``
      option); default one token per core (``os.cpu_count()``), with one x264 thread per encoder unless
      ``session_options`` pins ``threads``. Without a shared budget each of N concurrent requests would
      start its own multi-threaded encoder, and N × threads encoder threads would fight for the cores.
    - ``on_event``: called on the server's event loop with each :class:`ServerEvent`; keep it quick.
    - ``generator``: the real-time model, what ``WS /v1/realtime/video`` and ``/video.mp4?realtime=1``
      decode: called with the client's ``session.start`` message (a dict) and the session's
      :class:`streamvae.server.Interactions`, it returns an async iterator of pieces (latents
      ``[1, C, t, H, W]`` or :class:`streamvae.server.RealtimePiece`) for
      :func:`streamvae.open_latent_stream` on ``vae`` (see :func:`streamvae.server.realtime_video_endpoint`).
      Default the seeded stand-in (:class:`streamvae.server.demo_generator`). ``realtime=1`` calls it with
      ``{"num_frames": frames, "width": size, "height": size, "seed": seed, "step_seconds": delay}`` and no
      interactions; with ``latents=`` and no ``generator=`` it feeds that latent one latent frame a step
      instead, ``delay`` seconds apart.
    - WebSocket sessions share the admission, counters, events and latency of ``/video.mp4``: each holds
      a queue place from its handshake and a decode slot while it generates (a queued client is accepted
      and answered while it waits); a handshake beyond both is answered HTTP 503 with ``Retry-After``
      (where the server has the WebSocket Denial Response extension, as uvicorn has; else an ``error``
      ``busy`` and close 1013 after accepting).
    - ``pace``: send each fragment, over HTTP and the WebSocket, no earlier than its media time
      (:class:`streamvae.server.MediaTimePacer`), instead of as soon as it is written.

    Every argument is checked here, before any request: a bad value is a ValueError, an object of the
    wrong kind (``vae``, ``latents``, ``encode_limiter``, ...) a TypeError, each naming create_app and the
    argument. A value that passed would be a 500 on every request instead.

    The app's ``state.stats`` is the :class:`ServerStats` that ``/stats`` reports, with
    ``open_containers``, ``latency`` and ``control_to_photon_seconds``. ``latency``: over the last 100
    completed requests (and stopped WebSocket sessions), the median and longest time from a decode's start
    to its first fragment holding a frame (``first_fragment_median``, ``first_fragment_max``), the median
    of their median chunk latencies and the longest chunk latency (``chunk_latency_median``,
    ``chunk_latency_max``), in seconds (None before any), and ``requests``.
    ``control_to_photon_seconds``: over the last 1000 interactions shown, the ``median`` and ``max`` time
    from the server reading an interaction to its sending the first binary frame that reflects it, and
    ``interactions``.
    """
    owner = "create_app"
    check_callable("latents", latents, owner=owner)  # a function of a VideoRequest
    checked_fps = check_fps(fps, owner=owner)
    check_int("max_concurrent", max_concurrent, minimum=1, owner=owner)
    check_int("max_queued", max_queued, minimum=0, owner=owner)
    check_seconds("stall_timeout", stall_timeout, owner=owner)
    check_int("retry_after", retry_after, minimum=0, owner=owner)
    check_int("max_frames", max_frames, minimum=1, owner=owner)
    check_int("max_size", max_size, minimum=1, owner=owner)
    check_limiter("encode_limiter", encode_limiter, owner=owner)
    check_callable("on_event", on_event, owner=owner)  # a function of a ServerEvent
    check_callable("generator", generator, owner=owner)  # a function of a session.start message
    check_bool("pace", pace, owner=owner)
    if vae is None:
        vae = demo_vae()
    decoder = as_decoder(vae, owner=owner)
    options = resolve_option_dict(
        owner,
        session_options,
        reserved=_APP_SESSION_OPTIONS,
        given={"fps": checked_fps},
        value_range=decoder.chunk_value_range,
        output="fragmented",
    )
    videos = _Videos(
        vae=vae,
        latents=latents if latents is not None else _demo_latent,
        max_concurrent=max_concurrent,
        max_queued=max_queued,
        stall_timeout=stall_timeout,
        retry_after=retry_after,
        max_frames=max_frames,
        max_size=max_size,
        options=options,
        encode_limiter=encode_limiter,
        on_event=on_event,
        pace=pace,
        generator=generator,
    )
    page = _page().replace("__MAX_FRAMES__", str(max_frames)).replace("__MAX_SIZE__", str(max_size))

    async def index(request: Request) -> Response:
        return HTMLResponse(page)

    async def video(request: Request) -> Response:
        return videos.response(request.query_params)

    realtime: list[Callable[[WebSocket], Awaitable[None]]] = []

    async def realtime_video(websocket: WebSocket) -> None:
        if not realtime:  # built on the loop, with the app's session options and decode limiter
            realtime.append(
                websocket_endpoint(
                    vae,
                    generator=videos.generator,
                    options=videos.session_options,
                    decode_limiter=videos.decode_limiter,
                    pacer=MediaTimePacer if pace else None,
                    start_timeout=10.0,
                    stall_timeout=stall_timeout,
                    max_frames=max_frames,
                    max_size=max_size,
                    hooks=videos,
                    owner=owner,
                )
            )
        await realtime[0](websocket)

    async def stats(request: Request) -> Response:
        return JSONResponse(
            {
                **asdict(videos.admission.stats),
                "open_containers": open_containers(),
                "latency": videos.latency.summary(),
                "control_to_photon_seconds": videos.latency.control_to_photon(),
            }
        )

    app = Starlette(
        routes=[
            Route("/", index),
            Route("/video.mp4", video, methods=["GET"]),
            Route("/stats", stats),
            WebSocketRoute("/v1/realtime/video", realtime_video),
        ]
    )
    app.state.stats = videos.admission.stats
    app.state.latency = videos.latency
    return app


#: the session options create_app sets from its own arguments
_APP_SESSION_OPTIONS = ("fps", "encode_limiter")


def _page() -> str:
    """The page's HTML (package data), with ``__MAX_FRAMES__`` and ``__MAX_SIZE__`` to fill in."""
    return files("streamvae.server").joinpath("page.html").read_text(encoding="utf-8")


#: the largest seed ``torch.Generator.manual_seed`` takes
_MAX_SEED = 2**64 - 1
#: ASCII digits only: ``int()`` would also take "1_000", " 5 " and other scripts' digits
_INTEGER = re.compile(r"[+-]?[0-9]+")


def _query_integer(query: QueryParams, name: str, *, default: int, low: int, high: int) -> int:
    """The query's ``name`` (``default`` without one), or a ValueError (a 400) unless it is an integer
    from ``low`` to ``high``."""
    text = query.get(name, str(default))
    shown = text if len(text) <= 24 else text[:24] + "…"  # the error echoes no megabyte of query
    if not _INTEGER.fullmatch(text):
        raise ValueError(f"{name} must be an integer, got {shown!r}")
    # More digits than any limit has is out of range whatever they are (and int() of thousands of digits
    # is slow, then refused).
    value = int(text) if len(text.lstrip("+-0")) <= 24 else high + 1
    if not low <= value <= high:
        raise ValueError(f"{name} must be at least {low} and at most {high}, got {shown}")
    return value


def _demo_latent(request: VideoRequest) -> Tensor:
    return demo_latent(request.frames, request.size, request.seed)


class _Videos:
    """What ``GET /video.mp4`` serves: each request's admission, latent and decode, as the context manager
    its :class:`MP4Response` enters when it is sent, with the request's events and latency numbers.

    The response owns the HTTP side (the status line with the first fragment, the cut-off on a disconnect
    or a stall); this owns what a request holds — a queue place, then a slot, then a session — from the
    moment the response is sent to the moment its decode has stopped.
    """

    def __init__(
        self,
        *,
        vae: Any,
        latents: Callable[[VideoRequest], Tensor],
        max_concurrent: int,
        max_queued: int,
        stall_timeout: float,
        retry_after: int,
        max_frames: int,
        max_size: int,
        options: SessionOptions,
        encode_limiter: anyio.CapacityLimiter | None,
        on_event: Callable[[ServerEvent], None] | None,
        pace: bool,
        generator: LatentGenerator | None,
    ) -> None:
        self.vae = vae
        self.latents = latents
        self.admission = Admission(max_concurrent=max_concurrent, max_queued=max_queued)
        self.stall_timeout = stall_timeout
        #: whether each response's fragments leave at their media time
        self.pace = pace
        self.retry_after = retry_after
        self.max_frames = max_frames
        self.max_size = max_size
        self.options = options
        self.on_event = on_event
        self.requests = 0
        self.latency = LatencyWindow()
        # Made by the first request, on the loop that serves the app (the app may be built in another).
        self._decode_limiter: anyio.CapacityLimiter | None = None
        self._encode_limiter = encode_limiter
        self._session_options: SessionOptions | None = None  # made with the encode budget, on the loop
        self._generator = generator
        #: real-time mode steps through ``latents=`` (a user's) when no generator was given
        self._steps_latents = generator is None and latents is not _demo_latent

    @property
    def decode_limiter(self) -> anyio.CapacityLimiter:
        """Every decode thread (and latent build) of the app: never anyio's default limiter, which the
        ASGI server's own thread pool shares."""
        if self._decode_limiter is None:
            self._decode_limiter = anyio.CapacityLimiter(self.admission.max_concurrent)
        return self._decode_limiter

    @property
    def session_options(self) -> SessionOptions:
        """The app's checked options with its encode budget, which every request's session takes: every
        encoder call of every session under one token per core (unless the app was given a budget), so
        concurrent requests share the cores instead of each starting its own encoder threads."""
        if self._session_options is None:
            budget = self._encode_limiter or anyio.CapacityLimiter(os.cpu_count() or 1)
            self._session_options = dataclasses.replace(self.options, encode_limiter=budget)
        return self._session_options

    @property
    def generator(self) -> LatentGenerator:
        """The app's real-time model: ``generator=``, or the stand-in (made on the loop, under the app's
        decode limiter)."""
        if self._generator is None:
            self._generator = demo_generator(
                max_frames=self.max_frames,
                max_size=self.max_size,
                limiter=self.decode_limiter,
                fps=self.options.fps,
            )
        return self._generator

    def enter(self, request_id: str) -> Admitted | None:
        """A WebSocket session's admission (see :class:`streamvae.server._websocket.SessionHooks`)."""
        self.requests += 1
        number = self.requests
        ticket = self.admission.try_enter()
        if ticket is None:
            self._emit("rejected", None, number, request_id)
            return None
        self._emit("queued", None, number, request_id)
        return _Session(self, ticket, number, request_id)

    def response(self, query: QueryParams) -> Response:
        """The response to a ``/video.mp4`` query: a 400 naming a bad value, else the streamed video."""
        try:
            request = self._parse(query)
        except ValueError as error:
            return PlainTextResponse(f"{error}\n", status_code=400)
        return MP4Response(
            self._video(request),
            stall_timeout=self.stall_timeout,
            headers={"cache-control": "no-store"},
            pacer=MediaTimePacer(self.options.fps) if self.pace else None,  # a schedule per response
        )

    def _parse(self, query: QueryParams) -> VideoRequest:
        """The request, or a ValueError (a 400) for any value the decode would not accept: a value that
        fails later, in the latent builder or the session, would be a 500 for the client's mistake."""
        frames = _query_integer(query, "frames", default=33, low=1, high=self.max_frames)
        size = _query_integer(query, "size", default=128, low=1, high=self.max_size)
        seed = _query_integer(query, "seed", default=0, low=0, high=_MAX_SEED)
        realtime, delay = parse_realtime(query)
        audio = query.get("audio", "0")
        if audio not in ("0", "1"):
            raise ValueError(f"audio must be 0 or 1, got {audio[:24]!r}")
        if audio == "1" and (not realtime or self._steps_latents):
            raise ValueError(
                "audio=1 needs realtime=1 and the app's generator: the sound is the generator's (a latent "
                "has none)"
            )
        request = VideoRequest(
            frames=frames, size=size, seed=seed, realtime=realtime, delay=delay, audio=audio == "1"
        )
        if self.latents is _demo_latent:
            check_demo_request(request.frames, request.size)
        return request

    @asynccontextmanager
    async def _video(self, request: VideoRequest) -> AsyncIterator[MP4ByteStream]:
        """One request's life, entered when its response is sent: a 503 (an ``HTTPException`` the
        response answers) when every slot and queue place is taken, else a queue place, a slot, the
        latent and the decode, each given back when the response ends, however it ends."""
        self.requests += 1
        number = self.requests
        ticket = self.admission.try_enter()
        if ticket is None:
            self._emit("rejected", request, number)
            raise HTTPException(
                503,
                "busy: every decode slot and queue place is taken, retry later",
                headers={"Retry-After": str(self.retry_after)},
            )
        self._emit("queued", request, number)
        outcome: Outcome = "disconnected"  # a cancellation: the response saw the client go
        sessions: list[ChunkedVideoMP4Session] = []
        try:
            await ticket.start()
            self._emit("started", request, number)
            async with self._decode(request, sessions.append) as stream:
                yield stream
            outcome = "completed"  # every byte was sent: the response ends once its session is closed
        except ReaderStalledError:
            outcome = "stalled"
            raise
        except Exception:
            outcome = "failed"
            raise
        finally:
            ticket.end(outcome)
            self.latency.record(number, request, outcome, sessions[0].statistics() if sessions else None)
            self._emit(outcome, request, number)

    @asynccontextmanager
    async def _decode(
        self, request: VideoRequest, on_session: Callable[[ChunkedVideoMP4Session], None]
    ) -> AsyncIterator[MP4ByteStream]:
        """The request's MP4: its latent decoded whole, or (real-time) the generator's pieces one at a
        time, on the WebSocket's path."""
        if not request.realtime:
            latent = [await anyio.to_thread.run_sync(self.latents, request, limiter=self.decode_limiter)]
            videos = stream_mp4(
                self.vae,
                latent.pop(),  # taken out, so the decode alone keeps it alive
                decode_limiter=self.decode_limiter,
                on_session=on_session,
                options=self.session_options,
            )
            async with videos as (stream,):
                yield stream
            return
        steps: AsyncIterator[Tensor | RealtimePiece]
        if self._steps_latents:
            steps = latent_steps(lambda: self.latents(request), request.delay, self.decode_limiter)
        else:
            start = {
                "num_frames": request.frames,
                "width": request.size,
                "height": request.size,
                "seed": request.seed,
                "step_seconds": request.delay,
            }
            if request.audio:
                start["audio"] = True
            interactions = Interactions()
            interactions.close()  # HTTP carries no interactions
            steps = call_generator(self.generator, start, interactions, owner="create_app")
        try:
            async with open_realtime(
                self.vae,
                steps,
                options=self.session_options,
                decode_limiter=self.decode_limiter,
                owner="create_app",
                on_session=on_session,
            ) as run:
                yield run.video
        finally:
            close = getattr(steps, "aclose", None)
            if close is not None:
                with anyio.CancelScope(shield=True):
                    await close()

    def _emit(
        self, kind: EventKind, request: VideoRequest | None, number: int, request_id: str | None = None
    ) -> None:
        if self.on_event is not None:
            self.on_event(ServerEvent(kind, request, number, request_id))


class _Session:
    """One WebSocket session as the app counts it: its ticket, events and latency."""

    def __init__(self, videos: _Videos, ticket: Ticket, number: int, request_id: str) -> None:
        self._videos = videos
        self._ticket = ticket
        self._number = number
        self._request_id = request_id

    async def start(self) -> None:
        await self._ticket.start()
        self._videos._emit("started", None, self._number, self._request_id)

    def end(
        self, outcome: Outcome, statistics: SessionStatistics | None, control_to_photon: list[float]
    ) -> None:
        self._ticket.end(outcome)
        self._videos.latency.record(self._number, self._request_id, outcome, statistics, control_to_photon)
        self._videos._emit(outcome, None, self._number, self._request_id)
