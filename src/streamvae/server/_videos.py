"""The app's generations as videos anyone can watch: the registry of their broadcasts, and the routes under
``/v1/videos``.

Every generation the app runs (a ``/video.mp4`` request, a ``?realtime=1`` request, a WebSocket session)
is a :class:`Video`: an id and a :class:`Broadcast` its owner publishes every MP4 piece to as it sends it,
and ends with its outcome. :class:`VideoRegistry` keeps them, newest first, and forgets ended ones beyond
its retention (a count and the bytes of their recordings), so memory stays bounded over any number of
generations; an id it forgot is answered 410, an id it never gave 404. Ended recordings are written to
``recording_dir`` (an MP4 and a VOD HLS playlist with its segments) for any static server to replay.

The routes (a contract: outside clients use these paths):

- ``GET /v1/videos``: ``{"videos": [{id, state, frames, viewers, urls}]}``, newest first;
- ``GET /v1/videos/{id}/live.m3u8``: the Low-Latency HLS media playlist, blocking reload honoured (held
  until the part or segment asked for is written, or the generation ends, at most :data:`HOLD_TARGETS`
  target durations, and freed at once when the client leaves);
- ``GET /v1/videos/{id}/init.mp4``, ``p{N}.m4s`` (part N), ``s{M}.m4s`` (segment M): a GET of the part the
  preload hint names is held until it is written;
- ``GET /v1/videos/{id}/vod.m3u8``: an ended video's replay playlist, whole segments only (what
  ``recording_dir`` holds as ``index.m3u8``);
- ``GET /v1/videos/{id}/video.mp4``: the fragmented MP4 from its start, following a live generation; an
  ended one's recording with ``Content-Length``, byte for byte what the owner received — or, with the app's
  ``provenance=``, that recording signed with its Content Credentials;
- ``GET /v1/videos/{id}/manifest.c2pa``: with ``provenance=``, once the generation has ended, the C2PA
  manifest store of the bytes exactly as they were streamed (a detached manifest: a sidecar), the
  ``Link`` of a ``/video.mp4`` response (``rel="c2pa-manifest"``) and ``session.done``'s
  ``content_credentials``;
- ``WS /v1/videos/{id}/watch``: a spectator (see :func:`watch`).
"""

from __future__ import annotations

import logging
import math
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.types import Message, Receive, Scope, Send

from streamvae._errors import SigningError, ViewerCutOffError
from streamvae._fragments import MP4Piece
from streamvae._provenance import Provenance
from streamvae.server._broadcast import Broadcast
from streamvae.server._hls import (
    INIT_URI,
    HLSTiming,
    check_reachable,
    live_playlist,
    parse_blocking_reload,
    satisfied,
    segments,
    vod_playlist,
    write_recording,
)

logger = logging.getLogger("streamvae.server")

__all__ = [
    "FORGOTTEN_IDS",
    "HOLD_TARGETS",
    "Video",
    "VideoRegistry",
    "credential_urls",
    "link_header",
    "video_routes",
    "watch_urls",
]

#: a held playlist or part request waits at most this many target durations (Apple's rule of three),
#: then is answered 503: a client is better off asking again than holding a request forever
HOLD_TARGETS = 3
#: ids of forgotten videos remembered, for a 410 (older ones are a 404): the set is bounded too
FORGOTTEN_IDS = 4096
#: seconds an ended generation waits for its recording's signature (:attr:`VideoRegistry.sign_timeout`):
#: a KMS call and a timestamp take seconds; one that hangs leaves the replay unsigned, not the owner held
SIGN_TIMEOUT_SECONDS = 60.0
#: recordings signed at once, and written at once (each a worker thread, a whole recording in memory)
RECORDING_THREADS = 2

_T = TypeVar("_T")


def watch_urls(video_id: str) -> dict[str, str]:
    """Where a video is watched: ``video.start``'s ``watch`` and ``/v1/videos``' ``urls``."""
    base = f"/v1/videos/{video_id}"
    return {"hls": f"{base}/live.m3u8", "mp4": f"{base}/video.mp4", "ws": f"{base}/watch"}


def credential_urls(video_id: str) -> dict[str, str]:
    """Where an ended, signed video's Content Credentials are: the detached manifest of the bytes as
    streamed, and the signed recording (``session.done``'s ``content_credentials``)."""
    base = f"/v1/videos/{video_id}"
    return {"manifest": f"{base}/manifest.c2pa", "recording": f"{base}/video.mp4"}


def link_header(video_id: str, *, signed: bool = False) -> str:
    """The ``Link`` header of a ``/video.mp4`` response: where else the same generation plays, and with
    ``signed`` (the app's ``provenance=``) where its C2PA manifest will be once it has ended
    (``rel="c2pa-manifest"``, as C2PA links an external manifest)."""
    link = f'</v1/videos/{video_id}/live.m3u8>; rel="alternate"; type="application/vnd.apple.mpegurl"'
    if signed:
        link += f', <{credential_urls(video_id)["manifest"]}>; rel="c2pa-manifest"; type="application/c2pa"'
    return link


@dataclass(eq=False)
class Video:
    """One generation: its id, its broadcast and the HLS timing its playlists keep."""

    id: str
    broadcast: Broadcast
    timing: HLSTiming
    #: bytes sent to this video's viewers (HLS, video.mp4 and spectators together)
    served_bytes: int = 0
    #: the ended recording, signed (with the app's ``provenance=``), which replays serve
    signed: bytes | None = None
    #: the detached C2PA manifest of the bytes as they were streamed (``manifest.c2pa``)
    manifest: bytes | None = None

    def credentials(self) -> dict[str, str] | None:
        """Where this video's Content Credentials are, once it has ended signed; else None."""
        return None if self.manifest is None else credential_urls(self.id)

    def publish(self, piece: MP4Piece) -> None:
        """The owner sent ``piece``: every viewer gets it (a piece of 0 frames is no part)."""
        if self.broadcast.state == "live":
            self.broadcast.publish(piece)

    def describe(self) -> dict[str, Any]:
        """The video as ``GET /v1/videos`` lists it."""
        statistics = self.broadcast.statistics()
        return {
            "id": self.id,
            "state": self.broadcast.state,
            "frames": self.broadcast.frames,
            "viewers": statistics.viewers,
            "urls": watch_urls(self.id),
        }


@dataclass(eq=False, kw_only=True)
class VideoRegistry:
    """An app's videos, newest first: each generation's broadcast while it runs, and its recording after,
    until the retention forgets it.

    Retention: at most ``keep_videos`` ended videos and ``keep_bytes`` bytes of their recordings are kept
    (the newest first; live videos are never forgotten: their owners hold them). ``recording_dir``: each
    ended generation is also written there (:func:`write_recording`), in a worker thread. ``provenance``:
    each generation that ended complete is signed first (:meth:`end`), and its signed copy and detached
    manifest count in ``keep_bytes`` too.
    """

    #: the HLS timing of every video of the app (fixed by its session options)
    timing: HLSTiming
    keep_videos: int
    keep_bytes: int
    recording_dir: Path | None
    #: seconds a viewer's send may take before it is cut off (the app's ``stall_timeout``)
    stall_timeout: float
    #: pieces a viewer may leave unread before it is cut off
    viewer_buffer: int = 64
    #: signs each recording that ended well (the app's ``provenance=``)
    provenance: Provenance | None = None
    #: seconds :meth:`end` waits for a recording's signature (a KMS call and an RFC 3161 timestamp take a
    #: second or two, hashing a recording of ``keep_bytes`` less): past it the replay stays unsigned
    sign_timeout: float = SIGN_TIMEOUT_SECONDS
    # The threads that sign recordings, and those that write them (never anyio's default limiter, which
    # the ASGI server shares). Apart: a signature abandoned past ``sign_timeout`` keeps its token on trio
    # until its signer returns, and a write must not wait for it (a wait for a signing token is bounded).
    _signers: anyio.CapacityLimiter = field(
        default_factory=lambda: anyio.CapacityLimiter(RECORDING_THREADS), init=False
    )
    _writers: anyio.CapacityLimiter = field(
        default_factory=lambda: anyio.CapacityLimiter(RECORDING_THREADS), init=False
    )
    _videos: OrderedDict[str, Video] = field(default_factory=OrderedDict, init=False)  # oldest first
    _forgotten: OrderedDict[str, None] = field(default_factory=OrderedDict, init=False)
    #: bytes served to the viewers of videos forgotten since
    _forgotten_served: int = field(default=0, init=False)

    def open(self) -> Video:
        """A new generation's video, live, listed from now."""
        video_id = secrets.token_hex(8)
        while video_id in self._videos or video_id in self._forgotten:  # 2**64 ids: all but never
            video_id = secrets.token_hex(8)
        video = Video(video_id, Broadcast(viewer_buffer=self.viewer_buffer), self.timing)
        self._videos[video_id] = video
        return video

    async def end(self, video: Video, error: BaseException | None = None) -> None:
        """The owner's generation has ended (with ``error`` if it failed): every viewer gets a clean end,
        then, with ``provenance``, the recording is signed (at most :attr:`sign_timeout` seconds), then
        written to ``recording_dir``, and the retention applies. Shielded: an owner cancelled on its way
        out still ends its video.

        The end is told first: a hung KMS or timestamp server never holds a viewer. A replay asked for
        before the signature is in serves the unsigned recording, as one after a failed signature does.
        """
        with anyio.CancelScope(shield=True):
            if video.broadcast.state == "live":
                video.broadcast.end(error)
            if self.provenance is not None and error is None and video.broadcast.parts:
                await self._sign_in_time(video, self.provenance)
            if self.recording_dir is not None and video.broadcast.parts:
                await anyio.to_thread.run_sync(self._record, video, limiter=self._writers)
            self._retain()

    async def _sign_in_time(self, video: Video, provenance: Provenance) -> None:
        """Sign ``video``'s recording in a worker thread, and swap the signed copy and the manifest in; past
        :attr:`sign_timeout` the thread is left to its signer (what it makes is dropped), and the failure
        logged: the replay stays unsigned."""
        signed: tuple[bytes, bytes] | None = None
        with anyio.move_on_after(self.sign_timeout) as waited:
            signed = await anyio.to_thread.run_sync(
                self._sign, video, provenance, limiter=self._signers, abandon_on_cancel=True
            )
        if waited.cancelled_caught:
            logger.error(
                "signing video %s's recording took over %s seconds (its replay is unsigned)",
                video.id,
                self.sign_timeout,
            )
        elif signed is not None:
            video.signed, video.manifest = signed

    def discard(self, video: Video) -> None:
        """A generation turned away before it started (a 503): it was never a video."""
        video.broadcast.end()
        self._videos.pop(video.id, None)

    def get(self, video_id: str) -> Video | int:
        """The video of ``video_id``, or the status to answer: 410 once forgotten, 404 if never given."""
        video = self._videos.get(video_id)
        if video is not None:
            return video
        return 410 if video_id in self._forgotten else 404

    def listing(self) -> list[dict[str, Any]]:
        """Every video kept, newest first, as ``GET /v1/videos`` lists them."""
        return [video.describe() for video in reversed(self._videos.values())]

    def statistics(self) -> dict[str, Any]:
        """``/stats``' ``videos``: the viewers of each video kept, and the bytes served to viewers."""
        kept = self._videos.values()
        return {
            "viewers": {video.id: video.broadcast.statistics().viewers for video in kept},
            "served_bytes": self._forgotten_served + sum(video.served_bytes for video in kept),
        }

    @staticmethod
    def _sign(video: Video, provenance: Provenance) -> tuple[bytes, bytes] | None:
        """Worker thread: the recording signed, and the detached manifest of the bytes as streamed, if it
        is complete (a generation cut short, its client gone, is no video to vouch for). A failure is
        logged (None): the replay is then the unsigned recording its viewers got, with no credentials."""
        recording = video.broadcast.mp4_bytes()
        if recording[-12:-8] != b"mfro":  # the muxer's trailer (mfra, ending in its mfro) was not written
            return None
        what = f"video {video.id}'s recording"
        try:
            return provenance.sign(recording, what=what), provenance.detached(recording, what=what)
        except SigningError as error:
            logger.error("%s (its replay is unsigned)", error, exc_info=error.__cause__)
            return None

    def _record(self, video: Video) -> None:
        assert self.recording_dir is not None
        broadcast = video.broadcast
        assert broadcast.init is not None  # it has parts
        recording = broadcast.mp4_bytes() if video.signed is None else video.signed
        write_recording(
            self.recording_dir, video.id, broadcast.init, broadcast.parts, recording, video.timing
        )

    def _retain(self) -> None:
        """Forget the oldest ended videos beyond ``keep_videos`` or ``keep_bytes``."""
        ended = [video for video in reversed(self._videos.values()) if video.broadcast.state != "live"]
        kept_bytes = 0
        for rank, video in enumerate(ended):
            kept_bytes += video.broadcast.size + len(video.signed or b"") + len(video.manifest or b"")
            if rank >= self.keep_videos or kept_bytes > self.keep_bytes:
                self._forget(video)

    def _forget(self, video: Video) -> None:
        del self._videos[video.id]
        self._forgotten_served += video.served_bytes
        self._forgotten[video.id] = None
        while len(self._forgotten) > FORGOTTEN_IDS:
            self._forgotten.popitem(last=False)


# -- the routes --


def video_routes(registry: VideoRegistry, watch: Callable[..., Awaitable[None]]) -> list[BaseRoute]:
    """The routes under ``/v1/videos`` on ``registry``; ``watch`` is the spectators' WebSocket endpoint."""
    routes = _Routes(registry)
    prefix = "/v1/videos/{video_id:str}"
    return [
        Route("/v1/videos", routes.listing, methods=["GET"]),
        Route(f"{prefix}/live.m3u8", routes.playlist, methods=["GET"]),
        Route(f"{prefix}/vod.m3u8", routes.vod, methods=["GET"]),
        Route(f"{prefix}/init.mp4", routes.init, methods=["GET"]),
        Route(f"{prefix}/video.mp4", routes.mp4, methods=["GET"]),
        Route(f"{prefix}/manifest.c2pa", routes.manifest, methods=["GET"]),
        Route(f"{prefix}/{{name:str}}", routes.media, methods=["GET"]),
        WebSocketRoute(f"{prefix}/watch", watch),
    ]


_PLAYLIST_TYPE = "application/vnd.apple.mpegurl"
_SEGMENT_TYPE = "video/iso.segment"


def _absent(status: int, video_id: str) -> Response:
    if status == 410:
        return PlainTextResponse(
            f"video {video_id} has ended and is no longer kept (past the server's retention)\n", 410
        )
    return PlainTextResponse(f"no video {video_id}\n", 404)


class _Routes:
    """The HTTP endpoints of ``/v1/videos``, on one registry."""

    def __init__(self, registry: VideoRegistry) -> None:
        self.registry = registry

    def _video(self, request: Request) -> Video | Response:
        video_id = request.path_params["video_id"]
        found = self.registry.get(video_id)
        return _absent(found, video_id) if isinstance(found, int) else found

    async def listing(self, request: Request) -> Response:
        return JSONResponse({"videos": self.registry.listing()}, headers={"cache-control": "no-store"})

    async def playlist(self, request: Request) -> Response:
        """The live playlist; a blocking reload is held until it answers (a 400 when it cannot be held)."""
        video = self._video(request)
        if isinstance(video, Response):
            return video
        broadcast = video.broadcast
        try:
            asked = parse_blocking_reload(request.query_params)
            if asked is not None and broadcast.state == "live":
                check_reachable(asked, broadcast.parts, video.timing)
        except ValueError as error:
            return PlainTextResponse(f"{error}\n", 400)
        if asked is not None:

            async def answered() -> bool:
                while not satisfied(asked, broadcast.parts, broadcast.state):
                    await broadcast.wait_for(broadcast.next_part, timeout=math.inf)
                return True

            if await _unless_gone(request.receive, answered, self._hold(video)) is None:
                return _unanswered()
        text = live_playlist(INIT_URI, broadcast.parts, broadcast.state, video.timing)
        return self._served(video, text.encode(), _PLAYLIST_TYPE, live=broadcast.state == "live")

    async def vod(self, request: Request) -> Response:
        """The replay playlist of an ended video (whole segments, no parts), as ``recording_dir`` has it."""
        video = self._video(request)
        if isinstance(video, Response):
            return video
        if video.broadcast.state == "live":
            return PlainTextResponse("the VOD playlist exists once the generation has ended\n", 404)
        text = vod_playlist(INIT_URI, video.broadcast.parts, video.timing)
        return self._served(video, text.encode(), _PLAYLIST_TYPE, live=False)

    async def init(self, request: Request) -> Response:
        video = self._video(request)
        if isinstance(video, Response):
            return video
        broadcast = video.broadcast
        if broadcast.init is None:
            await _unless_gone(request.receive, self._waiter(broadcast, 0), self._hold(video))
        if broadcast.init is None:
            return PlainTextResponse("the init segment is not written yet\n", 404)
        return self._served(video, broadcast.init, "video/mp4", live=False)

    async def media(self, request: Request) -> Response:
        """``p{N}.m4s`` (part N, held while it is the next to be written: the preload hint's) or
        ``s{M}.m4s`` (segment M, once complete)."""
        video = self._video(request)
        if isinstance(video, Response):
            return video
        name: str = request.path_params["name"]
        index = _media_index(name)
        if index is None:
            return PlainTextResponse(f"no {name} (parts are p<N>.m4s, segments s<M>.m4s)\n", 404)
        kind, number = index
        broadcast = video.broadcast
        data: bytes | None = None
        if kind == "p":
            if number == broadcast.next_part and broadcast.state == "live":
                await _unless_gone(request.receive, self._waiter(broadcast, number), self._hold(video))
            part = broadcast.part(number)
            data = None if part is None else part.data
        else:
            for segment in segments(broadcast.parts, broadcast.state):
                if segment.sequence == number and segment.complete:
                    data = segment.data
        if data is None:
            return PlainTextResponse(f"no {name} in video {video.id} (not written yet)\n", 404)
        return self._served(video, data, _SEGMENT_TYPE, live=False)

    async def mp4(self, request: Request) -> Response:
        video = self._video(request)
        if isinstance(video, Response):
            return video
        broadcast = video.broadcast
        content_type = "video/mp4" if broadcast.codecs is None else f'video/mp4; codecs="{broadcast.codecs}"'
        if broadcast.state != "live":
            data = broadcast.mp4_bytes() if video.signed is None else video.signed
            video.served_bytes += len(data)
            return Response(data, headers={"content-type": content_type})
        return _Following(video, self.registry.stall_timeout, content_type)

    async def manifest(self, request: Request) -> Response:
        """The detached C2PA manifest of an ended, signed video's bytes as streamed."""
        video = self._video(request)
        if isinstance(video, Response):
            return video
        if video.manifest is None:
            return PlainTextResponse(
                "Content Credentials exist once the generation has ended, with the app's provenance=\n", 404
            )
        return self._served(video, video.manifest, "application/c2pa", live=False)

    def _hold(self, video: Video) -> float:
        return HOLD_TARGETS * video.timing.target_duration

    @staticmethod
    def _waiter(broadcast: Broadcast, part: int) -> Callable[[], Awaitable[bool]]:
        async def wait() -> bool:
            return await broadcast.wait_for(part, timeout=math.inf)

        return wait

    @staticmethod
    def _served(video: Video, data: bytes, content_type: str, *, live: bool) -> Response:
        video.served_bytes += len(data)
        headers = {"cache-control": "no-store"} if live else {}
        return Response(data, headers=headers, media_type=content_type)


def _media_index(name: str) -> tuple[str, int] | None:
    """``("p", N)`` for ``pN.m4s``, ``("s", M)`` for ``sM.m4s``, else None."""
    if len(name) < 6 or name[0] not in "ps" or not name.endswith(".m4s"):
        return None
    digits = name[1:-4]
    if not digits.isascii() or not digits.isdigit() or len(digits) > 12:
        return None
    return name[0], int(digits)


class _Following(Response):
    """A live video's MP4 from its start, then each piece as it is published, to its end.

    The body ends incomplete (the server closes the connection without its last message) when the
    viewer is cut off, for falling more than its buffer behind, when a send takes over ``stall_timeout``
    seconds (a client that reads nothing holds no task, and no bytes, for long), or when the generation
    failed, after its last bytes. A client that leaves ends it.
    """

    def __init__(self, video: Video, stall_timeout: float, content_type: str) -> None:
        self.video = video
        self.stall_timeout = stall_timeout
        self.status_code = 200
        self.background = None
        self.init_headers({"content-type": content_type, "cache-control": "no-store"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(_cancel_when_gone, receive, group.cancel_scope)
            try:
                await self._send(
                    send, {"type": "http.response.start", "status": 200, "headers": self.raw_headers}
                )
                async with self.video.broadcast.viewer(live_edge=False) as viewer:
                    async for data in viewer:
                        await self._send(
                            send, {"type": "http.response.body", "body": data, "more_body": True}
                        )
                        self.video.served_bytes += len(data)
                await self._send(send, {"type": "http.response.body", "body": b"", "more_body": False})
            except (ViewerCutOffError, TimeoutError) as error:
                logger.info("cut off a video.mp4 viewer of video %s: %s", self.video.id, error)
            except Exception:  # the generation failed, after its last bytes: the owner's error, logged there
                logger.info("video %s failed: its video.mp4 viewer's body ends incomplete", self.video.id)
            finally:
                group.cancel_scope.cancel()

    async def _send(self, send: Send, message: Message) -> None:
        with anyio.fail_after(self.stall_timeout):
            await send(message)


async def _cancel_when_gone(receive: Receive, scope: anyio.CancelScope) -> None:
    """Cancel ``scope`` once the client has gone."""
    while (await receive())["type"] != "http.disconnect":
        pass  # a GET's empty body
    scope.cancel()


async def _unless_gone(receive: Receive, wait: Callable[[], Awaitable[_T]], timeout: float) -> _T | None:
    """``wait()``'s result; None if it took over ``timeout`` seconds or the client left meanwhile (its
    wait is cancelled at once: nothing of it is left behind)."""
    result: list[_T] = []
    with anyio.move_on_after(timeout):
        async with anyio.create_task_group() as group:
            group.start_soon(_cancel_when_gone, receive, group.cancel_scope)
            result.append(await wait())
            group.cancel_scope.cancel()
    return result[0] if result else None


def _unanswered() -> Response:
    """A held request that ended unanswered: its client has gone (nobody reads this), or the hold's bound
    passed (503: ask again)."""
    return PlainTextResponse(
        "the part asked for was not written in time: ask again\n", 503, headers={"retry-after": "0"}
    )
