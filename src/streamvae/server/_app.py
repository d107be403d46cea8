"""The app: ``GET /`` (the page), ``GET /video.mp4`` (a decode, streamed as it is written), ``GET /stats``
and ``WS /v1/realtime/video``, on one :class:`Sessions` (admission, counters, events, latency).

A ``/video.mp4`` query is parsed here (a 400 names a bad value); the request's decode is its
:class:`MP4Response`'s block. With ``realtime=1`` a generator's pieces reach the decode one at a time
through :func:`open_realtime`, the WebSocket's path. What must be built on the loop that serves the app
(the decode limiter, the encode budget; the stand-in and the WebSocket endpoint when first used) is
built by its first request, each a ``cached_property`` of ``_Videos``.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from functools import cached_property
from importlib.resources import files
from pathlib import Path
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.datastructures import QueryParams
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket
from torch import Tensor

from streamvae._checks import (
    MAX_SEED,
    check_bool,
    check_callable,
    check_fps,
    check_int,
    check_latents,
    check_limiter,
    check_path,
    check_seconds,
)
from streamvae._decode import open_decode
from streamvae._encode import open_containers
from streamvae._errors import ReaderStalledError
from streamvae._options import SessionOptions, resolve_option_dict
from streamvae._session import ChunkedVideoMP4Session
from streamvae._sinks import MP4ByteStream
from streamvae.demo import DEMO_FPS, check_demo_request, demo_latent, demo_vae
from streamvae.models import as_decoder
from streamvae.server._admission import Outcome
from streamvae.server._hls import hls_timing
from streamvae.server._pacing import MediaTimePacer
from streamvae.server._realtime import (
    Interactions,
    RealtimeGenerator,
    RealtimePiece,
    call_generator,
    open_realtime,
)
from streamvae.server._response import MP4Response
from streamvae.server._sessions import ServerEvent, Sessions, VideoRequest
from streamvae.server._standin import MAX_DELAY, demo_generator
from streamvae.server._videos import Video, VideoRegistry, link_header, video_routes
from streamvae.server._websocket import (
    EndpointSettings,
    check_served_options,
    pieces_decoder,
    spectator_endpoint,
    websocket_endpoint,
)

__all__ = ["create_app"]


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
    generator: RealtimeGenerator | None = None,
    pace: bool = False,
    keep_videos: int = 8,
    keep_bytes: int = 1 << 30,
    recording_dir: str | os.PathLike[str] | None = None,
    hls_js: str | os.PathLike[str] | None = None,
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
      ``fps`` and ``encode_limiter``, which are create_app's own; fragmented MP4, without
      ``audio_channels``, ``audio_waveforms`` or ``output_files``, which no session of a server can take
      (its sound is its generator's, and every session would write the same files).
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
      instead, ``delay`` seconds apart. A ValueError the generator raises when called or at its first
      piece is its word on the request's values: a 400 whose body is its message (the WebSocket's
      ``error`` carries the same).
    - WebSocket sessions share the admission, counters, events and latency of ``/video.mp4``: each holds
      a queue place from its handshake and a decode slot while it generates (a queued client is accepted
      and answered while it waits); a handshake beyond both is answered HTTP 503 with ``Retry-After``
      (where the server has the WebSocket Denial Response extension, as uvicorn has; else an ``error``
      ``busy`` and close 1013 after accepting).
    - ``pace``: send each fragment, over HTTP and the WebSocket, no earlier than its media time
      (:class:`streamvae.server.MediaTimePacer`), instead of as soon as it is written.
    - Every generation (each ``/video.mp4`` request, ``realtime=1`` or not, and each WebSocket session)
      is a video anyone can watch under ``/v1/videos/{id}`` (Low-Latency HLS, the MP4, a spectator
      WebSocket; see docs/guides/serve.md) while it runs and, once ended, replay. ``keep_videos`` (≥ 1)
      and ``keep_bytes`` (≥ 0) bound the ended recordings kept in memory, newest first: older ones are
      forgotten (their id is then answered 410). The defaults keep the 8 newest of up to 1 GiB together.
      ``recording_dir`` (a directory, created if missing): each ended generation is also written there as
      its MP4 and a VOD HLS playlist with its segments, for any static server or CDN to replay.
    - ``session_options={"provenance": streamvae.Provenance(...)}``: every stream carries the unsigned XMP
      mark in its init segment (bytes sent cannot be signed after the fact); once a generation has ended
      complete, its recording is signed with its Content Credentials — what ``video.mp4`` replays and
      ``recording_dir`` hold — and ``/v1/videos/{id}/manifest.c2pa`` serves the detached manifest of the
      bytes exactly as streamed, which a ``/video.mp4`` response's ``Link`` (``rel="c2pa-manifest"``) and
      ``session.done``'s ``content_credentials`` point to.
    - ``hls_js``: the file ``GET /hls.js`` serves (hls.js's ``dist/hls.min.js``, which the page uses where
      the browser has Media Source); default ``.hlsjs/node_modules/hls.js/dist/hls.min.js`` in the
      checkout streamvae runs from, where it exists (``make hlsjs`` installs it there). Without one
      ``/hls.js`` is a 404 and the page plays HLS natively (Safari) or through its WebSocket player.

    Every argument is checked here, before any request: a bad value is a ValueError, an object of the
    wrong kind (``vae``, ``latents``, ``encode_limiter``, ...) a TypeError, each naming create_app and the
    argument. A value that passed would be a 500 on every request instead.

    The app's ``state.stats`` is the :class:`ServerStats` that ``/stats`` reports, with
    ``open_containers``, ``latency``, ``control_to_photon_seconds`` and ``videos``. ``latency``: over the
    last 100 completed requests (and stopped WebSocket sessions), the median and longest time from a
    decode's start to its first fragment holding a frame (``first_fragment_median``,
    ``first_fragment_max``), the median of their median chunk latencies and the longest chunk latency
    (``chunk_latency_median``, ``chunk_latency_max``), in seconds (None before any), and ``requests``.
    ``control_to_photon_seconds``: over the last 1000 interactions shown, the ``median`` and ``max`` time
    from the server reading an interaction to its sending the first binary frame that reflects it, and
    ``interactions``. ``videos``: ``viewers``, the viewers of each video kept now (by id), and
    ``served_bytes``, the bytes served to viewers (HLS, ``video.mp4`` and spectators) since the start.
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
    check_int("keep_videos", keep_videos, minimum=1, owner=owner)
    check_int("keep_bytes", keep_bytes, minimum=0, owner=owner)
    recordings = _checked_directory("recording_dir", recording_dir, owner=owner)
    script = _hls_js(hls_js, owner=owner)
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
    check_served_options(options, owner=owner, name="session_options")
    videos = _Videos(
        vae=vae,
        latents=latents if latents is not None else _demo_latent,
        sessions=Sessions(
            max_concurrent=max_concurrent, max_queued=max_queued, retry_after=retry_after, on_event=on_event
        ),
        stall_timeout=stall_timeout,
        max_frames=max_frames,
        max_size=max_size,
        options=options,
        encode_limiter=encode_limiter,
        pace=pace,
        generator=generator,
        registry=VideoRegistry(
            timing=hls_timing(options.fps, options.frames_per_fragment(), _keyframe_interval(options)),
            keep_videos=keep_videos,
            keep_bytes=keep_bytes,
            recording_dir=recordings,
            stall_timeout=stall_timeout,
            provenance=options.provenance,
        ),
    )
    page = _page().replace("__MAX_FRAMES__", str(max_frames)).replace("__MAX_SIZE__", str(max_size))

    async def index(request: Request) -> Response:
        return HTMLResponse(page)

    async def video(request: Request) -> Response:
        return videos.response(request.query_params)

    async def realtime_video(websocket: WebSocket) -> None:
        await videos.realtime(websocket)

    async def stats(request: Request) -> Response:
        return JSONResponse(
            {
                **asdict(videos.sessions.admission.stats),
                "open_containers": open_containers(),
                "latency": videos.sessions.latency.summary(),
                "control_to_photon_seconds": videos.sessions.latency.control_to_photon(),
                "videos": videos.registry.statistics(),
            }
        )

    async def hls_script(request: Request) -> Response:
        if script is None:
            return PlainTextResponse("hls.js is not installed on this server (make hlsjs)\n", 404)
        return FileResponse(script, media_type="text/javascript")

    async def watch(websocket: WebSocket) -> None:
        await videos.watch(websocket)

    app = Starlette(
        routes=[
            Route("/", index),
            Route("/video.mp4", video, methods=["GET"]),
            Route("/stats", stats),
            WebSocketRoute("/v1/realtime/video", realtime_video),
            Route("/hls.js", hls_script, methods=["GET"]),
            *video_routes(videos.registry, watch),
        ]
    )
    app.state.stats = videos.sessions.admission.stats
    app.state.latency = videos.sessions.latency
    return app


#: the session options create_app sets from its own arguments
_APP_SESSION_OPTIONS = ("fps", "encode_limiter")
#: where ``make hlsjs`` installs hls.js: the project's own folder (a checkout, src/streamvae/server/ here)
_HLS_JS = Path(__file__).resolve().parents[3] / ".hlsjs/node_modules/hls.js/dist/hls.min.js"


def _checked_directory(name: str, value: object, *, owner: str) -> Path | None:
    """``value`` as a directory path (created if missing), or None; a TypeError unless a str or a path, a
    ValueError naming ``name`` if it cannot be a directory."""
    path = check_path(name, value, owner=owner)
    if path is None:
        return None
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(
            f"{owner}: {name} must be a directory it can write, got {str(path)!r}: {error}"
        ) from None
    return path


def _hls_js(value: object, *, owner: str) -> Path | None:
    """The hls.js file ``/hls.js`` serves: ``value`` (which must exist), else the installed one, else None."""
    path = check_path("hls_js", value, owner=owner)
    if path is None:
        return _HLS_JS if _HLS_JS.is_file() else None
    if not path.is_file():
        raise ValueError(f"{owner}: hls_js must name an existing file (hls.min.js), got {str(path)!r}")
    return path


def _keyframe_interval(options: SessionOptions) -> int:
    """Frames between keyframes: fixed per video (fragmented options always name one), so the HLS timing
    is known before the first playlist."""
    assert options.keyframe_interval is not None  # set by SessionOptions for fragmented output
    return options.keyframe_interval


def _page() -> str:
    """The page's HTML (package data), with ``__MAX_FRAMES__`` and ``__MAX_SIZE__`` to fill in."""
    return files("streamvae.server").joinpath("page.html").read_text(encoding="utf-8")


# -- the query --

#: ASCII digits only: ``int()`` would also take "1_000", " 5 " and other scripts' digits
_INTEGER = re.compile(r"[+-]?[0-9]+")
#: a plain decimal: no sign, exponent, ``nan`` or ``inf`` (which ``float()`` would take)
_DECIMAL = re.compile(r"[0-9]+(\.[0-9]*)?|\.[0-9]+")
#: seconds a real-time step takes when the query names no ``delay``
_DEFAULT_DELAY = 0.1


def _query_integer(query: QueryParams, name: str, *, default: int, low: int, high: int) -> int:
    """The query's ``name`` (``default`` without one), or a ValueError (a 400) unless it is an integer
    from ``low`` to ``high``."""
    text = query.get(name, str(default))
    if not _INTEGER.fullmatch(text):
        raise ValueError(f"{name} must be an integer, got {_cut(text)!r}")
    # More digits than any limit has is out of range whatever they are (and int() of thousands of digits
    # is slow, then refused).
    value = int(text) if len(text.lstrip("+-0")) <= 24 else high + 1
    if not low <= value <= high:
        raise ValueError(f"{name} must be at least {low} and at most {high}, got {_cut(text)}")
    return value


def _query_realtime(query: QueryParams) -> tuple[bool, float]:
    """``realtime`` (``0`` or ``1``, default 0) and ``delay`` (0 … :data:`MAX_DELAY` seconds), or a
    ValueError (a 400) naming the value."""
    realtime = query.get("realtime", "0")
    if realtime not in ("0", "1"):
        raise ValueError(f"realtime must be 0 or 1, got {realtime[:24]!r}")
    text = query.get("delay", str(_DEFAULT_DELAY))
    if len(text) > 24 or not _DECIMAL.fullmatch(text):
        raise ValueError(f"delay must be a number of seconds, got {_cut(text)!r}")
    delay = float(text)
    if not 0 <= delay <= MAX_DELAY:
        raise ValueError(f"delay must be at least 0 and at most {MAX_DELAY:g} seconds, got {_cut(text)}")
    return realtime == "1", delay


def _cut(text: str) -> str:
    """A query value as an error quotes it: the error echoes no megabyte of query."""
    return text if len(text) <= 24 else text[:24] + "…"


# -- the decodes --


def _demo_latent(request: VideoRequest) -> Tensor:
    return demo_latent(request.frames, request.size, request.seed)


@dataclass(frozen=True)
class _Served:
    """What the app builds on the event loop that serves it, at its first request: a limiter built in
    another loop (a trio test that builds the app, which uvicorn then serves on asyncio) would be that
    loop's."""

    #: every decode thread (and latent build) of the app: never anyio's default limiter, which the ASGI
    #: server's own thread pool shares
    decode_limiter: anyio.CapacityLimiter
    #: the app's checked options with its encode budget, which every request's session takes: every
    #: encoder call of every session under one token per core (unless the app was given a budget), so
    #: concurrent requests share the cores instead of each starting its own encoder threads
    session_options: SessionOptions


class _Videos:
    """What the app's video routes serve: each ``/video.mp4`` request's admission, latent and decode, as
    the context manager its :class:`MP4Response` enters when it is sent, and the WebSocket endpoint, on
    the same :class:`Sessions`.

    The response owns the HTTP side (the status line with the first fragment, the cut-off on a disconnect
    or a stall); this owns what a request holds — a queue place, then a slot, then a session — from the
    moment the response is sent to the moment its decode has stopped.
    """

    def __init__(
        self,
        *,
        vae: Any,
        latents: Callable[[VideoRequest], Tensor],
        sessions: Sessions,
        stall_timeout: float,
        max_frames: int,
        max_size: int,
        options: SessionOptions,
        encode_limiter: anyio.CapacityLimiter | None,
        pace: bool,
        generator: RealtimeGenerator | None,
        registry: VideoRegistry,
    ) -> None:
        self.vae = vae
        #: every generation's video, for its viewers
        self.registry = registry
        self.latents = latents
        self.sessions = sessions
        self.stall_timeout = stall_timeout
        #: whether each response's fragments leave at their media time
        self.pace = pace
        self.max_frames = max_frames
        self.max_size = max_size
        self.options = options
        self._encode_limiter = encode_limiter
        self._generator = generator
        #: real-time mode steps through ``latents=`` (a user's) when no generator was given
        self._steps_latents = generator is None and latents is not _demo_latent

    @cached_property
    def served(self) -> _Served:
        """The app's loop-bound objects, made by the first request on the loop that serves the app."""
        decode_limiter = anyio.CapacityLimiter(self.sessions.admission.max_concurrent)
        budget = self._encode_limiter or anyio.CapacityLimiter(os.cpu_count() or 1)
        return _Served(decode_limiter, dataclasses.replace(self.options, encode_limiter=budget))

    @cached_property
    def generator(self) -> RealtimeGenerator:
        """The app's real-time model: ``generator=``, or the stand-in (made by the first request that
        needs it, on the loop, under the app's decode limiter)."""
        if self._generator is not None:
            return self._generator
        return demo_generator(
            max_frames=self.max_frames,
            max_size=self.max_size,
            limiter=self.served.decode_limiter,
            fps=self.options.fps,
        )

    @cached_property
    def realtime(self) -> Callable[[WebSocket], Awaitable[None]]:
        """``WS /v1/realtime/video``, on the app's sessions and loop-bound objects: made by its first
        connection (it checks the VAE decodes pieces, which ``/video.mp4`` does not need)."""
        settings = EndpointSettings(
            pieces_decoder(self.vae, owner="create_app"),
            self.generator,
            self.served.session_options,
            self.served.decode_limiter,
            start_timeout=10.0,
            stall_timeout=self.stall_timeout,
            sessions=self.sessions,
            videos=self.registry,
        )
        return websocket_endpoint(settings, MediaTimePacer if self.pace else None)

    @cached_property
    def watch(self) -> Callable[[WebSocket], Awaitable[None]]:
        """``WS /v1/videos/{id}/watch``: a spectator of the app's videos."""
        return spectator_endpoint(self.registry, self.served.session_options.fps, self.stall_timeout)

    def response(self, query: QueryParams) -> Response:
        """The response to a ``/video.mp4`` query: a 400 naming a bad value, else the streamed video."""
        try:
            request = self._parse(query)
        except ValueError as error:
            return PlainTextResponse(f"{error}\n", status_code=400)
        video = self.registry.open()  # its id is in the headers, before the decode starts
        return MP4Response(
            self._video(request, video),
            stall_timeout=self.stall_timeout,
            headers={
                "cache-control": "no-store",
                "link": link_header(video.id, signed=self.options.provenance is not None),
            },
            pacer=MediaTimePacer(self.options.fps) if self.pace else None,  # a schedule per response
            broadcast=video.broadcast,
        )

    def _parse(self, query: QueryParams) -> VideoRequest:
        """The request, or a ValueError (a 400) for any value the decode would not accept: a value that
        fails later, in the latent builder or the session, would be a 500 for the client's mistake."""
        frames = _query_integer(query, "frames", default=33, low=1, high=self.max_frames)
        size = _query_integer(query, "size", default=128, low=1, high=self.max_size)
        seed = _query_integer(query, "seed", default=0, low=0, high=MAX_SEED)
        realtime, delay = _query_realtime(query)
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
    async def _video(self, request: VideoRequest, video: Video) -> AsyncIterator[MP4ByteStream]:
        """One request's life, entered when its response is sent: a 503 (an ``HTTPException`` the
        response answers) when every slot and queue place is taken, else a queue place, a slot, the
        latent and the decode, each given back when the response ends, however it ends; ``video``, which
        the response publishes to, ends with it."""
        admitted = self.sessions.enter(request)
        if admitted is None:
            self.registry.discard(video)
            raise HTTPException(
                503,
                "busy: every decode slot and queue place is taken, retry later",
                headers={"Retry-After": str(self.sessions.retry_after)},
            )
        outcome: Outcome = "disconnected"  # a cancellation: the response saw the client go
        session: ChunkedVideoMP4Session | None = None
        failure: Exception | None = None
        try:
            await admitted.start()
            async with self._decode(request) as (session, stream):
                yield stream
            outcome = "completed"  # every byte was sent: the response ends once its session is closed
        except ReaderStalledError:
            outcome = "stalled"
            raise
        except Exception as error:
            outcome, failure = "failed", error
            raise
        finally:
            admitted.end(outcome, session.statistics() if session is not None else None)
            await self.registry.end(video, failure)

    @asynccontextmanager
    async def _decode(
        self, request: VideoRequest
    ) -> AsyncIterator[tuple[ChunkedVideoMP4Session, MP4ByteStream]]:
        """The request's session and MP4: its latent decoded whole, or (real-time) the generator's pieces
        one at a time, on the WebSocket's path."""
        served = self.served
        if not request.realtime:
            latent = [await anyio.to_thread.run_sync(self.latents, request, limiter=served.decode_limiter)]
            decode = open_decode(
                self.vae,
                latent.pop(),  # taken out, so the decode alone keeps it alive
                decode_limiter=served.decode_limiter,
                options=served.session_options,
            )
            async with decode as (session, (stream,)):
                yield session, stream
            return
        steps: AsyncIterator[Tensor | RealtimePiece]
        if self._steps_latents:
            steps = _latent_steps(lambda: self.latents(request), request.delay, served.decode_limiter)
        else:
            start: dict[str, Any] = {
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
            try:
                steps = call_generator(self.generator, start, interactions, owner="create_app")
            except ValueError as error:  # the generator refused the request's values
                raise HTTPException(400, str(error)) from None
            steps = _refusable_steps(steps)
        async with open_realtime(
            self.vae,
            steps,
            options=served.session_options,
            decode_limiter=served.decode_limiter,
            owner="create_app",
        ) as run:
            yield run.session, run.video


async def _refusable_steps(
    steps: AsyncIterator[Tensor | RealtimePiece],
) -> AsyncIterator[Tensor | RealtimePiece]:
    """A generator's pieces, whose ValueError at the first piece is a 400 with its message: the
    generator's word on the request's values, as the WebSocket sends it (later, after the status line,
    a failure can only cut the body short). ``steps`` is closed with this iterator."""
    try:
        try:
            first = await anext(steps)
        except StopAsyncIteration:
            return
        except ValueError as error:
            raise HTTPException(400, str(error)) from None
        yield first
        async for piece in steps:
            yield piece
    finally:
        close = getattr(steps, "aclose", None)
        if close is not None:
            await close()


async def _latent_steps(
    build: Callable[[], Tensor], delay: float, limiter: anyio.CapacityLimiter
) -> AsyncIterator[Tensor]:
    """A user's whole latent (``build()``, run in a worker thread) as a generator's pieces: one latent
    frame a step, ``delay`` seconds apart (``create_app(latents=...)`` in real-time mode)."""
    z = await anyio.to_thread.run_sync(build, limiter=limiter)
    # Checked as a latent first: a 4-D one would read as a batch.
    check_latents(z, None, owner="create_app", name="the latent of latents=")
    if z.shape[0] != 1:
        raise ValueError(
            f"create_app: the latent of latents= must be of batch 1 in real-time mode (realtime=1), "
            f"got shape {tuple(z.shape)}"
        )
    for step in range(z.shape[2]):
        if step and delay:
            await anyio.sleep(delay)
        yield z[:, :, step : step + 1]
