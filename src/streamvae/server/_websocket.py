"""``WS /v1/realtime/video``: one generation a connection, steered by the client, its fragmented MP4 sent
piece by piece as decoded.

The protocol is that of vllm-omni's endpoint of the same path, so its clients work unchanged:

- client ``session.start`` (JSON; ``format`` ``"m4s"``, the default; fields the generator does not use are
  ignored) → server ``video.start`` ``{request_id, format, config}`` once the session holds a decode slot
  and its first piece is written, just before that piece: ``config.codecs`` is the piece's RFC 6381 codec
  string (``avc1.64001f, mp4a.40.2``; ``av01.0.04M.08, opus``), for ``MediaSource.addSourceBuffer``;
- per fMP4 piece, server ``video.chunk_metadata`` ``{request_id, kind: "media", transport_chunk_index,
  generation_chunk_index, num_frames, byte_length, started_event_ids, active_event_ids,
  completed_event_ids}``, then one binary frame of exactly those bytes; the binary frames, concatenated in
  order, are a fragmented MP4 that plays (with sound when the generator makes it);
- client ``session.interaction`` ``{interaction: {event_id, event, transition_chunks}}`` → server
  ``session.interaction.queued`` ``{request_id, event_id}``, or an ``error``: each interaction read before
  ``session.done`` gets exactly one answer; the pieces that reflect it name its ``event_id``;
- client ``session.ping`` → server ``session.pong``; client ``session.stop`` ends the generation;
- server ``session.done`` ``{request_id, chunks, stopped, statistics}`` at the end, with
  ``content_credentials`` ``{manifest, recording}`` for an app's generation that ended complete under its
  ``provenance=``: the URLs of the C2PA manifest of the bytes sent and of the signed recording;
- server ``error`` ``{code, message}`` for a message that is not valid (the session goes on), and before
  closing for a refused ``session.start``, a start timeout, a stall or a failed generation.

Error codes: ``invalid_message`` (not a JSON object, too big, a bad field), ``unknown_type``,
``already_started``, ``event_id_conflict`` (an ``event_id`` this session has queued already),
``interaction_failed`` (the generator cannot apply it), ``session_stopped`` (it came after
``session.stop``), ``invalid_start``, ``start_timeout``, ``stall_timeout``, ``generation_failed``, ``busy``;
a spectator's (``WS /v1/videos/{id}/watch``, :func:`spectator_endpoint`): ``unknown_video``,
``not_owner`` (a spectator does not steer), ``cut_off`` (it fell more than its buffer behind).

``video.start`` of an app's session also carries ``video_id`` and ``watch`` (``hls``, ``mp4``, ``ws``):
where anyone else watches the same generation (``/v1/videos/{video_id}``), which this session owns: it
ends when the session does.

A piece is a whole fragment (``moof`` + ``mdat``; the first also carries the ``ftyp`` and ``moov`` before
it, the last piece may be the ``mfra`` index alone, of 0 frames), so each binary frame can be appended to
a Media Source buffer as it comes and ``num_frames`` is exactly the frames it lets the client show.

Every connection ends its generation: a client that leaves, stops or stalls cancels it, and the decode
stops at its next step with its session closed (no container, thread or decode slot outlives the
connection), because a generation nobody watches would hold the accelerator for nothing.

The shape of the module, as Starlette's ``WebSocketEndpoint`` splits a lifecycle: a client message is
parsed by a pure function (``_parse_start``, ``_parse_interaction``), dispatched by its type through one
table (``_HANDLERS``, which also makes the ``unknown_type`` error's list; a new message type is one handler
and one entry), every frame leaves through one send path and arrives through one receive path, and only
what the WebSocket's own send and receive raise means "the client has gone". An app's sessions are
admitted and counted by its :class:`Sessions`; the endpoint alone admits every one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any, Literal

import anyio
import anyio.lowlevel
from starlette.responses import PlainTextResponse
from starlette.types import Message
from starlette.websockets import WebSocket, WebSocketDisconnect
from torch import Tensor

from streamvae._checks import check_callable, check_int, check_limiter, check_seconds, is_int
from streamvae._errors import ViewerCutOffError
from streamvae._options import SessionOptions, resolve_options
from streamvae._session import ChunkedVideoMP4Session
from streamvae.demo import DEMO_FPS
from streamvae.models import ChunkedDecoder, as_decoder
from streamvae.server._admission import Outcome
from streamvae.server._broadcast import Broadcast
from streamvae.server._pacing import MediaTimePacer
from streamvae.server._realtime import (
    Interaction,
    Interactions,
    RealtimeGenerator,
    RealtimePiece,
    SentPiece,
    call_generator,
    open_realtime,
    takes_interactions,
)
from streamvae.server._sessions import AdmittedSession, Sessions
from streamvae.server._standin import demo_generator
from streamvae.server._values import shown
from streamvae.server._videos import Video, VideoRegistry, watch_urls

__all__ = [
    "MAX_CONTROL_BYTES",
    "MAX_PENDING_INTERACTIONS",
    "MAX_START_BYTES",
    "EndpointSettings",
    "ErrorCode",
    "check_served_options",
    "pieces_decoder",
    "realtime_video_endpoint",
    "spectator_endpoint",
    "websocket_endpoint",
]

logger = logging.getLogger("streamvae.server")

_OWNER = "realtime_video_endpoint"

#: the largest ``session.start`` (UTF-8 bytes): it may carry a prompt, or an image as a data URL
MAX_START_BYTES = 4 * 1024 * 1024
#: the largest of any other client message (``session.ping``, ``session.interaction``, ``session.stop``)
MAX_CONTROL_BYTES = 128 * 1024
#: interactions queued and not yet taken by the generator; one more is ``interaction_failed``
MAX_PENDING_INTERACTIONS = 1024
#: the longest ``event_id`` (characters)
_MAX_EVENT_ID = 256

#: the ``code`` of an ``error`` message (see the module's docstring)
ErrorCode = Literal[
    "invalid_message",
    "unknown_type",
    "already_started",
    "event_id_conflict",
    "interaction_failed",
    "session_stopped",
    "invalid_start",
    "start_timeout",
    "stall_timeout",
    "generation_failed",
    "busy",
    "unknown_video",
    "not_owner",
    "cut_off",
]

#: what the WebSocket's own send and receive raise once the client has gone (a closed socket's send is a
#: RuntimeError in Starlette): nothing else is "the client has gone"
_GONE = (WebSocketDisconnect, RuntimeError)


# -- the endpoint --


def realtime_video_endpoint(
    vae: Any,
    *,
    generator: RealtimeGenerator | None = None,
    options: SessionOptions | None = None,
    decode_limiter: anyio.CapacityLimiter | None = None,
    pacer: Callable[[Fraction], MediaTimePacer] | None = None,
    start_timeout: float = 10.0,
    stall_timeout: float = 60.0,
    max_frames: int = 257,
    max_size: int = 512,
) -> Callable[[WebSocket], Awaitable[None]]:
    """The Starlette WebSocket endpoint of ``/v1/realtime/video``: mount it with
    ``WebSocketRoute("/v1/realtime/video", realtime_video_endpoint(vae, ...))``.

    - ``vae``: what decodes, anything :func:`streamvae.open_latent_stream` takes (a causal decoder: the
      diffusers ``AutoencoderKLWan``, ``AutoencoderKLQwenImage``, or your own). One instance serves every
      connection: each stream keeps its decoder caches of its own.
    - ``generator``: called once per connection with the ``session.start`` message (a dict) and the
      session's :class:`streamvae.server.Interactions`, it returns an async iterator of pieces, in order,
      each decoded as it comes: a latent ``[1, C, t, H, W]`` (t ≥ 1) or a
      :class:`streamvae.server.RealtimePiece` (with its sound and the events it reflects). A generator of
      the start alone is taken too; it takes no interactions. A ValueError it raises (when called or while
      iterated) is the client's mistake: its message goes to the client as an ``error``. Default
      :class:`streamvae.server.demo_generator` (``max_frames``, ``max_size``).
    - ``options``: the :class:`streamvae.SessionOptions` of every connection's session; ``output`` must
      be ``"fragmented"``, without ``audio_channels``, ``audio_waveforms`` or ``output_files`` (the
      sound is the generator's; every session would write the same files). Default fragmented MP4 at
      :data:`streamvae.demo.DEMO_FPS` in the decoder's value range.
    - ``decode_limiter``: bounds the decodes (and the stand-in's latent builds) that run at once; share
      the app's. Default one token for this endpoint, as a module decodes one piece at a time anyway.
    - ``pacer``: ``None`` (the default) sends each piece as soon as it is written; a callable of the
      session's fps that returns a :class:`MediaTimePacer` paces each connection's pieces on media time
      (``pacer=MediaTimePacer``, or ``functools.partial(MediaTimePacer, lead=0.5)``).
    - ``start_timeout``: seconds the client has to send ``session.start`` after connecting.
    - ``stall_timeout``: seconds with no message from the client and nothing sent to it (a generation
      step that takes that long, or a client that reads nothing) after which the session ends with an
      ``error``. Any client message refreshes it: a client may keep a slow generation alive with
      ``session.ping``, as vllm-omni's clients do.

    Every argument is checked here: a bad value is a ValueError, an object of the wrong kind a TypeError,
    each naming realtime_video_endpoint. This endpoint admits every connection; :func:`create_app`'s
    shares the app's decode slots and counts each session's outcome.
    """
    owner = _OWNER
    decoder = pieces_decoder(vae, owner=owner)
    check_callable("generator", generator, owner=owner)
    check_callable("pacer", pacer, owner=owner)
    limiter = check_limiter("decode_limiter", decode_limiter, owner=owner) or anyio.CapacityLimiter(1)
    checked_options = _checked_options(options, decoder, owner)
    check_seconds("start_timeout", start_timeout, owner=owner)
    check_seconds("stall_timeout", stall_timeout, owner=owner)
    check_int("max_frames", max_frames, minimum=1, owner=owner)
    check_int("max_size", max_size, minimum=16, owner=owner)
    if generator is None:
        generator = demo_generator(
            max_frames=max_frames, max_size=max_size, limiter=limiter, fps=checked_options.fps
        )
    settings = EndpointSettings(
        decoder, generator, checked_options, limiter, float(start_timeout), float(stall_timeout), None
    )
    return websocket_endpoint(settings, pacer)


def pieces_decoder(vae: Any, *, owner: str) -> ChunkedDecoder:
    """``vae``'s decoder, or a TypeError naming ``owner`` unless it decodes latents piece by piece."""
    decoder = as_decoder(vae, owner=owner, pieces=True)
    decoder.check_takes_pieces(owner=owner)
    return decoder


@dataclass
class EndpointSettings:
    """What every connection of one endpoint runs with (checked by whoever made them: the endpoint's or
    the app's arguments)."""

    decoder: ChunkedDecoder
    generator: RealtimeGenerator
    #: every session's options (fragmented MP4)
    options: SessionOptions
    decode_limiter: anyio.CapacityLimiter
    start_timeout: float
    stall_timeout: float
    #: the app's sessions, which admit and count each connection; None admits every one uncounted
    sessions: Sessions | None
    #: the app's videos: each session's generation is one, for its viewers; None broadcasts nothing
    videos: VideoRegistry | None = None
    #: whether the generator is called with the interactions (else each one is refused)
    takes_interactions: bool = field(init=False)

    def __post_init__(self) -> None:
        self.takes_interactions = takes_interactions(self.generator)


def websocket_endpoint(
    settings: EndpointSettings, pacer: Callable[[Fraction], MediaTimePacer] | None
) -> Callable[[WebSocket], Awaitable[None]]:
    """The endpoint of ``settings``: each connection a session, paced by a ``pacer`` of its own if given."""

    async def endpoint(websocket: WebSocket) -> None:
        pacing = None if pacer is None else pacer(settings.options.fps)  # one schedule per connection
        await _Connection(websocket, settings, pacing).run()

    return endpoint


def _checked_options(options: object, decoder: ChunkedDecoder, owner: str) -> SessionOptions:
    """The sessions' options: ``options``, which must write fragmented MP4, or the default."""
    defaults = {"fps": DEMO_FPS, "output": "fragmented"} if options is None else {}
    checked = resolve_options(owner, options, defaults, value_range=decoder.chunk_value_range)
    check_served_options(checked, owner=owner, name="options")
    return checked


def check_served_options(options: SessionOptions, *, owner: str, name: str) -> None:
    """Raise ValueError (naming ``owner`` and the argument ``name``) unless ``options`` can serve every
    session of a server, whatever it generates: checked where the server is built, because an option
    that fits no session would otherwise fail each request, one by one, after its decode.

    - ``output`` must be ``"fragmented"``: pieces leave as they are written, and viewers join at a
      fragment;
    - no ``audio_channels`` or ``audio_waveforms``: a session's sound is its generator's, decided by its
      first piece (a ``/video.mp4`` latent has none), and a track of the options would fit no session's;
    - no ``output_files``: every session would write the same paths (``create_app``'s ``recording_dir``
      keeps each generation's file).
    """
    if options.output != "fragmented":
        raise ValueError(
            f"{owner}: {name} must write fragmented MP4 (output='fragmented'), got output={options.output!r}"
        )
    for option in ("audio_channels", "audio_waveforms"):
        if getattr(options, option) is not None:
            raise ValueError(
                f"{owner}: {name}: {option} cannot be set for a server: each session's sound is its "
                "generator's (RealtimePiece.audio), and a latent has none (leave it out)"
            )
    if options.output_files is not None:
        raise ValueError(
            f"{owner}: {name}: output_files cannot be set for a server: every session would write the same "
            "files (leave it out; create_app's recording_dir keeps each generation's MP4)"
        )


# -- the client's messages, parsed --


class _Refused(Exception):
    """A client message that is not valid; its text goes to the client as an ``error`` of ``code``."""

    def __init__(self, message: str, *, code: ErrorCode = "invalid_message", close: int = 1008) -> None:
        super().__init__(message)
        self.code = code
        #: the close code if the session ends over it (1008 policy violation, 1009 message too big)
        self.close = close


class _StartRefused(ValueError):
    """The generator refused the start's values: the client's mistake, told as ``invalid_start``."""


def _parsed(message: Message, *, limit: int, what: str) -> dict[str, Any]:
    """The JSON object a client's text message holds, or a :class:`_Refused` saying what is wrong."""
    text = message.get("text")
    if text is None:
        size = len(message.get("bytes") or b"")
    else:
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
    if size > limit:
        raise _Refused(f"{what} is {size} bytes, over the limit of {limit} bytes", close=1009)
    if text is None:
        raise _Refused(f"{what} must be a JSON text message, got a binary one")
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):
        raise _Refused(f"{what} is not valid JSON") from None
    if not isinstance(parsed, dict):
        raise _Refused(f"{what} must be a JSON object, got {type(parsed).__name__}")
    return parsed


def _parse_start(message: Message) -> dict[str, Any]:
    """The ``session.start`` a client's first message holds, or an ``invalid_start`` (an
    ``invalid_message`` for what is no JSON object)."""
    start = _parsed(message, limit=MAX_START_BYTES, what="session.start")
    if start.get("type") != "session.start":
        raise _Refused(
            f"the first message must be session.start, got type {shown(start.get('type'))}",
            code="invalid_start",
        )
    if start.get("format", "m4s") != "m4s":
        raise _Refused(
            f"session.start: format must be 'm4s' (fragmented MP4), got {shown(start.get('format'))}",
            code="invalid_start",
        )
    return start


def _parse_interaction(control: Mapping[str, Any], *, received_at: float) -> Interaction:
    """The interaction a ``session.interaction`` message asks for (an ``event_id`` made for it when it
    names none), or an ``invalid_message``."""
    body = control.get("interaction")
    if not isinstance(body, dict):
        raise _Refused(f"session.interaction: interaction must be an object, got {shown(body)}")
    event_id = body.get("event_id")
    if event_id is None:
        event_id = f"evt-{uuid.uuid4().hex}"
    elif not isinstance(event_id, str) or not 1 <= len(event_id) <= _MAX_EVENT_ID:
        raise _Refused(
            f"session.interaction: event_id must be a string of 1 to {_MAX_EVENT_ID} characters, "
            f"got {shown(event_id)}"
        )
    event = body.get("event")
    if not isinstance(event, dict):
        raise _Refused(f"session.interaction: event must be an object, got {shown(event)}")
    transition = body.get("transition_chunks", 0)
    if not is_int(transition) or transition < 0:
        raise _Refused(
            f"session.interaction: transition_chunks must be an integer >= 0, got {shown(transition)}"
        )
    return Interaction(event_id, event, transition, received_at=received_at)


def _error(code: ErrorCode, message: str) -> dict[str, Any]:
    return {"type": "error", "code": code, "message": message}


async def _denied(
    websocket: WebSocket, status: int, message: str, headers: Mapping[str, str] | None = None
) -> bool:
    """Answer HTTP ``status`` with ``message`` at the handshake, where the server has the WebSocket Denial
    Response extension (uvicorn does): True; else False, and the caller accepts and says it in the
    protocol (an ``error``, then a close)."""
    if "websocket.http.response" not in websocket.scope.get("extensions", {}):
        return False
    response = PlainTextResponse(f"{message}\n", status_code=status, headers=headers)
    await websocket.send_denial_response(response)
    return True


async def _send_frames(websocket: WebSocket, frames: Sequence[dict[str, Any] | bytes]) -> None:
    """Send ``frames`` in order: a dict as a JSON text frame, bytes as a binary frame."""
    for frame in frames:
        if isinstance(frame, bytes):
            await websocket.send_bytes(frame)
        else:
            await websocket.send_text(json.dumps(frame))


# -- one connection --


class _Connection:
    """One client's session: its start, the generation streamed to it, its messages, its end.

    The ladder: :meth:`run` admits the connection (or refuses it), takes the start, and owns the task
    group of the listener (client messages, until the last message is sent) and the generation, whose own
    scope a stop, a stall or a disconnect cancels; :meth:`run` then says goodbye and counts the outcome.
    Every frame goes out through :meth:`_send` and comes in through :meth:`_receive`, the one place that
    notices the client has gone.
    """

    def __init__(
        self, websocket: WebSocket, settings: EndpointSettings, pacer: MediaTimePacer | None
    ) -> None:
        self.websocket = websocket
        self.settings = settings
        self.pacer = pacer
        self.request_id = f"video_stream-{uuid.uuid4().hex}"
        #: MP4 pieces sent (``session.done``'s ``chunks``)
        self.pieces_sent = 0
        self._config: dict[str, Any] = {}  # video.start's config, sent with the first piece
        self._session: ChunkedVideoMP4Session | None = None  # the generation's, once it is open
        self._send_lock = anyio.Lock()  # a piece's frames go out together, and nothing after the last
        self._last_sent = False  # the last message is out: nothing more is sent or answered
        self._last_activity = 0.0  # loop time of the last client message or completed send
        self._outcome: Outcome | None = None
        self._failure: Exception | None = None
        self._generation = anyio.CancelScope()  # the generation's: a stop, stall or disconnect cancels it
        self._events = _Events()
        self._answering: anyio.Event | None = None  # set once the message the listener read is answered
        self._left = False  # the client disconnected
        self._video: Video | None = None  # the generation's video, for its viewers, once it is started

    async def run(self) -> None:
        sessions = self.settings.sessions
        if sessions is None:
            await self._run()
            return
        admitted = sessions.enter(None, self.request_id)
        if admitted is None:
            await self._refuse_busy(sessions.retry_after)
            return
        outcome: Outcome = "failed"
        try:
            outcome = await self._run(admitted)
        finally:
            statistics = self._session.statistics() if self._session is not None else None
            admitted.end(outcome, statistics, self._events.control_to_photon)

    async def _refuse_busy(self, retry_after: int) -> None:
        """Every slot and queue place is taken: HTTP 503 with Retry-After at the handshake where the server
        supports the WebSocket Denial Response extension (uvicorn does), else an ``error`` and close 1013
        (try again later) right after accepting."""
        message = "busy: every decode slot and queue place is taken, retry later"
        if await _denied(self.websocket, 503, message, headers={"Retry-After": str(retry_after)}):
            return
        await self.websocket.accept()
        await self._say_goodbye({**_error("busy", message), "retry_after": retry_after}, 1013)

    async def _run(self, admitted: AdmittedSession | None = None) -> Outcome:
        await self.websocket.accept()
        self._active()
        try:
            start = await self._receive_start()
        except _Refused as refused:
            await self._say_goodbye(_error(refused.code, str(refused)), refused.close)
            return "stalled" if refused.code == "start_timeout" else "failed"
        if start is None:
            return "disconnected"
        async with anyio.create_task_group() as group:
            group.start_soon(self._listen)
            await self._generate(start, admitted)
            close = await self._say_how_it_ended()
            group.cancel_scope.cancel()  # the last message is out: nothing more to answer
        if close is not None and not self._left:
            await self._close(close)
        return self._outcome or "disconnected"

    # -- the start --

    async def _receive_start(self) -> dict[str, Any] | None:
        """The client's ``session.start``, or None if it left first; a :class:`_Refused` if it is not
        one, or comes too late."""
        with anyio.move_on_after(self.settings.start_timeout):
            message = await self._receive()
            if message["type"] == "websocket.disconnect":
                return None
            return _parse_start(message)
        raise _Refused(
            f"no session.start within {self.settings.start_timeout:g} s of connecting", code="start_timeout"
        )

    # -- the generation --

    async def _generate(self, start: dict[str, Any], admitted: AdmittedSession | None) -> None:
        """Call the generator, wait for a slot, and stream; the outcome is named however it ends, and the
        generation's video (for its viewers) ends with it."""
        videos = self.settings.videos
        if videos is None:
            await self._generate_video(start, admitted)
            return
        self._video = videos.open()
        try:
            await self._generate_video(start, admitted)
        finally:
            await videos.end(self._video, self._failure if self._outcome == "failed" else None)

    async def _generate_video(self, start: dict[str, Any], admitted: AdmittedSession | None) -> None:
        with self._generation:
            try:
                steps = call_generator(self.settings.generator, start, self._events.queue, owner=_OWNER)
            except ValueError as error:  # the generator refused the start's values
                self._end("failed", _StartRefused(str(error)))
                return
            except Exception as error:  # the generator's own failure, not the client's
                self._end("failed", error)
                return
            try:
                if admitted is not None:
                    await admitted.start()  # queued: the listener answers pings meanwhile
                config = {key: value for key, value in start.items() if key not in ("type", "format")}
                config["fps"] = float(self.settings.options.fps)
                self._config = config  # video.start goes with the first piece, which names the codecs
                self._active()  # the stall watch starts now: a wait in the queue is not a stall
                async with anyio.create_task_group() as group:
                    group.start_soon(self._watch_stall)
                    try:
                        await self._stream(steps)
                    except Exception as error:
                        self._end("failed", error)
                    else:
                        self._end("completed")
                    group.cancel_scope.cancel()
            finally:
                self._events.queue.close()

    async def _stream(self, steps: AsyncIterator[Tensor | RealtimePiece]) -> None:
        """Decode the generator's pieces as they come and send each whole MP4 piece as it is written."""
        settings = self.settings
        async with open_realtime(
            settings.decoder,
            steps,
            options=settings.options,
            decode_limiter=settings.decode_limiter,
            owner=_OWNER,
        ) as run:
            self._session = run.session
            async for sent in run.pieces():
                await self._send_piece(sent)

    async def _send_piece(self, sent: SentPiece) -> None:
        if self.pacer is not None:
            await self.pacer.wait(sent.piece.frames)
        frames: list[dict[str, Any] | bytes] = []
        if not self.pieces_sent:
            # The first piece holds the init segment: its codec string (avc1.64001f, av01.0.04M.08, ...) is
            # what a client passes to MediaSource.isTypeSupported and addSourceBuffer.
            config = {**self._config, "codecs": sent.piece.codecs}
            video_start = {
                "type": "video.start",
                "request_id": self.request_id,
                "format": "m4s",
                "config": config,
            }
            if self._video is not None:
                video_start |= {"video_id": self._video.id, "watch": watch_urls(self._video.id)}
            frames.append(video_start)
        frames.append(
            {
                "type": "video.chunk_metadata",
                "request_id": self.request_id,
                "kind": "media",
                "transport_chunk_index": self.pieces_sent,
                "generation_chunk_index": sent.step,
                "num_frames": sent.piece.frames,
                "byte_length": len(sent.piece.data),
                "started_event_ids": list(sent.started),
                "active_event_ids": list(sent.active),
                "completed_event_ids": list(sent.completed),
            }
        )
        frames.append(sent.piece.data)
        if self._video is not None:
            self._video.publish(sent.piece)  # before this client: a viewer never waits on it
        if not await self._send(*frames, whole=True):
            await anyio.lowlevel.checkpoint()  # a stall or a disconnect ended the generation: it stops here
            return
        self._events.shown(sent.started, at=anyio.current_time())
        self.pieces_sent += 1

    async def _watch_stall(self) -> None:
        while True:
            idle = anyio.current_time() - self._last_activity
            if idle >= self.settings.stall_timeout:
                self._stalled()
                return
            await anyio.sleep(self.settings.stall_timeout - idle)

    # -- the client's messages --

    async def _listen(self) -> None:
        """Answer the client's messages until the last message is sent or the client leaves."""
        while True:
            message = await self._receive()
            if message["type"] == "websocket.disconnect":
                self._client_left()
                return
            self._active()
            if self._last_sent:
                continue  # read after the session's end: the last message is on its way
            # Read before the last message: answered before it (the goodbye waits for this answer).
            answering = self._answering = anyio.Event()
            try:
                await self._answer(message)
            except Exception as error:  # a handler's own bug, not the client's: the session fails
                self._end("failed", error)
                self._generation.cancel()
                return
            finally:
                answering.set()

    async def _answer(self, message: Message) -> None:
        """Answer one client message by its type (:data:`_HANDLERS`), or with an ``error``."""
        try:
            control = _parsed(message, limit=MAX_CONTROL_BYTES, what="a control message")
            kind = control.get("type")
            handler = _HANDLERS.get(kind) if isinstance(kind, str) else None
            if handler is None:
                if kind == "session.start":
                    raise _Refused("session.start: this session has started already", code="already_started")
                raise _Refused(
                    f"unknown message type {shown(kind)} (expected {_EXPECTED})", code="unknown_type"
                )
            reply = handler(self, control)
        except _Refused as refused:
            reply = _error(refused.code, str(refused))
        if reply is not None:
            await self._send(reply)

    def _on_ping(self, control: Mapping[str, Any]) -> dict[str, Any]:
        return {"type": "session.pong"}

    def _on_stop(self, control: Mapping[str, Any]) -> None:
        if self._outcome == "stopped":
            raise _Refused("session.stop: the session is stopping already", code="session_stopped")
        self._end("stopped")
        self._generation.cancel()

    def _on_interaction(self, control: Mapping[str, Any]) -> dict[str, Any]:
        """Queue the interaction ``control`` asks for, for the generator; a :class:`_Refused` of the right
        code if it is not valid, comes after the end, or the generator cannot apply it."""
        if self._outcome is not None:
            raise _Refused(
                f"session.interaction: the session is ending ({_ENDING_WORDS[self._outcome]}): "
                "no interaction is applied",
                code="session_stopped",
            )
        interaction = _parse_interaction(control, received_at=anyio.current_time())
        event_id = interaction.event_id
        if event_id in self._events:
            raise _Refused(
                f"session.interaction: event_id {shown(event_id)} was queued already in this session",
                code="event_id_conflict",
            )
        if not self.settings.takes_interactions:
            raise _Refused(
                "session.interaction: this endpoint's generator takes no interactions",
                code="interaction_failed",
            )
        check = getattr(self.settings.generator, "check_interaction", None)
        if check is not None:
            try:
                check(interaction)
            except ValueError as error:  # the generator's word on the client's values
                raise _Refused(f"session.interaction: {error}", code="interaction_failed") from None
            except Exception as error:
                # The generator's bug, not the client's: the interaction still gets its one answer, and the
                # session then ends failed, as it does for any other failure of the generator.
                self._end("failed", error)
                self._generation.cancel()
                raise _Refused(
                    f"session.interaction: the generator could not check event_id {shown(event_id)} "
                    "(the server's log has why)",
                    code="interaction_failed",
                ) from None
        if self._events.queue.pending >= MAX_PENDING_INTERACTIONS:
            raise _Refused(
                f"session.interaction: {MAX_PENDING_INTERACTIONS} interactions wait for the generator "
                "already: send fewer",
                code="interaction_failed",
            )
        try:
            self._events.put(interaction)
        except anyio.ClosedResourceError:  # the generation has just ended
            raise _Refused(
                "session.interaction: the generation has ended: no interaction is applied",
                code="session_stopped",
            ) from None
        return {"type": "session.interaction.queued", "request_id": self.request_id, "event_id": event_id}

    # -- the end --

    def _end(self, outcome: Outcome, failure: Exception | None = None) -> None:
        """Name how the session ends; the first to say wins (a stop cancels a stream that then fails)."""
        if self._outcome is None:
            self._outcome, self._failure = outcome, failure

    def _stalled(self) -> None:
        """The client took nothing for ``stall_timeout`` seconds: the session ends, and its generation."""
        self._end("stalled")
        self._generation.cancel()

    def _client_left(self) -> None:
        """The client has gone: the session ends, and its generation; nobody is told."""
        self._left = True
        self._end("disconnected")
        self._generation.cancel()

    async def _say_how_it_ended(self) -> int | None:
        """Send the last message; the close code to end with (None: the client has gone)."""
        outcome, failure = self._outcome, self._failure
        if outcome in ("completed", "stopped"):
            statistics: dict[str, Any] = asdict(self._session.statistics()) if self._session else {}
            statistics["control_to_photon_seconds"] = list(self._events.control_to_photon)
            done = {
                "type": "session.done",
                "request_id": self.request_id,
                "chunks": self.pieces_sent,
                "stopped": outcome == "stopped",
                "statistics": statistics,
            }
            credentials = None if self._video is None else self._video.credentials()
            if credentials is not None:
                done["content_credentials"] = credentials
            return await self._send_last(done, 1000)
        if outcome == "stalled":
            seconds = f"{self.settings.stall_timeout:g} s"
            message = f"stall timeout: nothing sent and no message from the client for {seconds}"
            return await self._send_last(_error("stall_timeout", message), 1008)
        if outcome == "failed":
            if isinstance(failure, _StartRefused):
                return await self._send_last(_error("invalid_start", str(failure)), 1008)
            if isinstance(failure, ValueError):  # the generator's word on the client's values
                message = f"the generation failed: {failure}"
            else:
                logger.error("realtime session %s failed", self.request_id, exc_info=failure)
                message = "the generation failed (the server's log has why)"
            return await self._send_last(_error("generation_failed", message), 1011)
        return None  # disconnected: nobody to tell

    async def _send_last(self, message: dict[str, Any], code: int) -> int | None:
        """Send the session's last message, once the message the listener read is answered; ``code``,
        or None if the client has gone (one that reads nothing gets ``stall_timeout`` for it)."""
        with anyio.move_on_after(self.settings.stall_timeout):
            while self._answering is not None and not self._answering.is_set():
                await self._answering.wait()  # a message read before this one gets its answer first
            if await self._send(message, last=True):
                return code
        return None

    async def _say_goodbye(self, message: dict[str, Any], code: int) -> None:
        """Send the last message and close, before the session's tasks run."""
        if await self._send_last(message, code) is not None:
            await self._close(code)

    # -- the one way in and out --

    async def _receive(self) -> Message:
        """The client's next message; a disconnect once it has gone."""
        try:
            return await self.websocket.receive()
        except _GONE:  # closed under it: nobody to listen to
            return {"type": "websocket.disconnect"}

    async def _send(self, *frames: dict[str, Any] | bytes, whole: bool = False, last: bool = False) -> bool:
        """Send ``frames`` together (JSON text, or bytes as a binary frame); False if they did not all go
        out: the client has gone (the session ends so), a whole piece stalled, or the last message went out
        before them.

        ``whole``: the frames are one piece (its metadata and its bytes), shielded: a stop or a disconnect
        (a cancellation) between them would leave the client a metadata whose frame never comes. They are
        bounded, as any send is, by the stall timeout: a client that takes none in that time has stalled.
        ``last``: nothing is sent after these.
        """
        async with self._send_lock:
            if self._last_sent:
                return False
            self._last_sent = last
            if whole:
                deadline = anyio.current_time() + self.settings.stall_timeout
                sending = anyio.CancelScope(shield=True, deadline=deadline)
            else:
                sending = anyio.CancelScope()
            with sending:
                try:
                    await _send_frames(self.websocket, frames)
                except _GONE:
                    self._client_left()
                    return False
            if sending.cancelled_caught:
                self._stalled()
                return False
        self._active()
        return True

    async def _close(self, code: int) -> None:
        with anyio.move_on_after(self.settings.stall_timeout), contextlib.suppress(*_GONE):
            await self.websocket.close(code)  # a client gone meanwhile has nobody to tell

    def _active(self) -> None:
        self._last_activity = anyio.current_time()


class _Events:
    """A session's interactions: queued for its generator, and timed until a piece shows each."""

    def __init__(self) -> None:
        #: what the generator reads
        self.queue = Interactions()
        #: seconds from each interaction to the first binary frame that reflects it
        self.control_to_photon: list[float] = []
        self._ids: set[str] = set()  # every event id queued in this session
        self._waiting: dict[str, float] = {}  # queued event ids not yet shown, and when they came

    def __contains__(self, event_id: object) -> bool:
        return event_id in self._ids

    def put(self, interaction: Interaction) -> None:
        """Queue ``interaction`` (``anyio.ClosedResourceError`` once the generation has ended)."""
        self.queue.put(interaction)
        self._ids.add(interaction.event_id)
        self._waiting[interaction.event_id] = interaction.received_at

    def shown(self, started: Sequence[str], *, at: float) -> None:
        """A piece that starts to reflect ``started`` went out at loop time ``at``."""
        for event_id in started:
            received = self._waiting.pop(event_id, None)
            if received is not None:
                self.control_to_photon.append(at - received)


#: what each client message type after the start does: its reply (None: no reply)
_HANDLERS: dict[str, Callable[[_Connection, Mapping[str, Any]], dict[str, Any] | None]] = {
    "session.interaction": _Connection._on_interaction,
    "session.ping": _Connection._on_ping,
    "session.stop": _Connection._on_stop,
}
_EXPECTED = ", ".join(sorted(_HANDLERS)[:-1]) + " or " + sorted(_HANDLERS)[-1]
#: how an ``error`` names an outcome the session is ending with
_ENDING_WORDS: dict[Outcome, str] = {
    "completed": "done",
    "stopped": "stopped",
    "stalled": "stalled",
    "disconnected": "disconnected",
    "failed": "failed",
}


# -- spectators --


def spectator_endpoint(
    videos: VideoRegistry, fps: Fraction, stall_timeout: float
) -> Callable[[WebSocket], Awaitable[None]]:
    """``WS /v1/videos/{video_id}/watch``: a spectator of one of ``videos``.

    A spectator gets ``video.start`` ``{request_id, video_id, watch, format, config: {codecs, fps}}``, then
    the init segment and each part from the newest keyframe (the start, for an ended video), each as a
    ``video.chunk_metadata`` (``kind`` ``"init"`` or ``"media"``, ``num_frames``, ``byte_length``) and a
    binary frame of those bytes, then ``session.done`` ``{request_id, chunks, stopped}`` once the generation
    ends (or its own ``session.stop``), with the owner's ``content_credentials`` once it ended signed.
    The binary frames together are a fragmented MP4 that plays. It does
    not steer: a ``session.interaction`` is answered with an ``error`` ``not_owner``; ``session.ping`` gets
    ``session.pong``. An unknown video is an HTTP 404 at the handshake (410 past the retention), sent the
    way the busy 503 is; a spectator that falls more than its buffer behind gets ``error`` ``cut_off``, one
    whose generation failed ``generation_failed``; one that takes nothing for ``stall_timeout`` seconds is
    closed. Leaving changes nothing for the owner or the other viewers.
    """

    async def endpoint(websocket: WebSocket) -> None:
        video_id = websocket.path_params["video_id"]
        found = videos.get(video_id)
        if isinstance(found, int):
            await _refuse_unknown(websocket, video_id, found)
            return
        await _Spectator(websocket, found, float(fps), stall_timeout).run()

    return endpoint


async def _refuse_unknown(websocket: WebSocket, video_id: str, status: int) -> None:
    """No such video: HTTP ``status`` (404, or 410 past the retention) at the handshake where the server
    has the WebSocket Denial Response extension, else an ``error`` ``unknown_video`` and close 1008."""
    message = f"video {video_id} has ended and is no longer kept" if status == 410 else f"no video {video_id}"
    if await _denied(websocket, status, message):
        return
    await websocket.accept()
    with contextlib.suppress(*_GONE):
        await websocket.send_text(json.dumps({**_error("unknown_video", message), "status": status}))
        await websocket.close(1008)


class _Spectator:
    """One spectator: the video's viewer, sent piece by piece, and the spectator's messages answered."""

    def __init__(self, websocket: WebSocket, video: Video, fps: float, stall_timeout: float) -> None:
        self.websocket = websocket
        self.video = video
        self.fps = fps
        self.stall_timeout = stall_timeout
        self.request_id = f"video_watch-{uuid.uuid4().hex}"
        #: pieces sent, the init segment's included (``session.done``'s ``chunks``)
        self.pieces_sent = 0
        self.stopped = False
        self._send_lock = anyio.Lock()
        self._gone = False

    async def run(self) -> None:
        await self.websocket.accept()
        close = 1000
        async with anyio.create_task_group() as group:
            group.start_soon(self._listen, group.cancel_scope)
            try:
                with anyio.CancelScope() as self._watching:
                    last = await self._watch()
            except ViewerCutOffError as error:
                last, close = _error("cut_off", str(error)), 1008
            except Exception as error:  # the generation's own failure, after its last bytes
                logger.info("video %s failed under a spectator: %r", self.video.id, error)
                last, close = _error("generation_failed", "the generation failed"), 1011
            if self.stopped:
                last = self._done()
            group.cancel_scope.cancel()
        if not self._gone and await self._send(last):
            with anyio.move_on_after(self.stall_timeout), contextlib.suppress(*_GONE):
                await self.websocket.close(close)

    def _done(self) -> dict[str, Any]:
        done = {
            "type": "session.done",
            "request_id": self.request_id,
            "chunks": self.pieces_sent,
            "stopped": self.stopped,
        }
        credentials = self.video.credentials()
        if credentials is not None:
            done["content_credentials"] = credentials
        return done

    async def _watch(self) -> dict[str, Any]:
        """Send the video from the newest keyframe to its end; the last message to send."""
        video = self.video
        broadcast = video.broadcast
        next_part: int | None = None  # the index of the part the next media bytes are
        async with broadcast.viewer() as viewer:
            async for data in viewer:
                frames = 0
                if not self.pieces_sent:
                    start = {
                        "type": "video.start",
                        "request_id": self.request_id,
                        "video_id": video.id,
                        "watch": watch_urls(video.id),
                        "format": "m4s",
                        "config": {"codecs": broadcast.codecs, "fps": self.fps},
                    }
                    if not await self._send(start):
                        break
                else:
                    next_part, frames = _part_frames(broadcast, data, next_part)
                metadata = {
                    "type": "video.chunk_metadata",
                    "request_id": self.request_id,
                    "kind": "init" if not self.pieces_sent else "media",
                    "transport_chunk_index": self.pieces_sent,
                    "num_frames": frames,
                    "byte_length": len(data),
                }
                if not await self._send(metadata, data):
                    break
                video.served_bytes += len(data)
                self.pieces_sent += 1
        return self._done()

    async def _listen(self, scope: anyio.CancelScope) -> None:
        while True:
            try:
                message = await self.websocket.receive()
            except _GONE:
                message = {"type": "websocket.disconnect"}
            if message["type"] == "websocket.disconnect":
                self._gone = True
                scope.cancel()
                return
            reply = self._answer(message)
            if reply is not None:
                await self._send(reply)

    def _answer(self, message: Message) -> dict[str, Any] | None:
        """Answer one spectator message by its type (:data:`_SPECTATOR_HANDLERS`), or with an ``error``."""
        try:
            control = _parsed(message, limit=MAX_CONTROL_BYTES, what="a control message")
        except _Refused as refused:
            return _error(refused.code, str(refused))
        kind = control.get("type")
        handler = _SPECTATOR_HANDLERS.get(kind) if isinstance(kind, str) else None
        if handler is None:
            return _error(
                "unknown_type",
                f"unknown message type {shown(kind)} (a spectator sends {_SPECTATOR_EXPECTED})",
            )
        return handler(self, control)

    def _on_ping(self, control: Mapping[str, Any]) -> dict[str, Any]:
        return {"type": "session.pong"}

    def _on_stop(self, control: Mapping[str, Any]) -> None:
        self.stopped = True
        self._watching.cancel()

    def _on_interaction(self, control: Mapping[str, Any]) -> dict[str, Any]:
        return _error("not_owner", "session.interaction: a spectator does not steer the generation")

    async def _send(self, *frames: dict[str, Any] | bytes) -> bool:
        """Send ``frames`` together; False (and the spectator is done) if the client has gone or took
        nothing for ``stall_timeout`` seconds."""
        async with self._send_lock:
            if self._gone:
                return False
            with anyio.move_on_after(self.stall_timeout) as sending:
                try:
                    await _send_frames(self.websocket, frames)
                    return True
                except _GONE:
                    pass
            self._gone = True
            if sending.cancelled_caught:
                logger.info("cut off a spectator that took nothing for %s s", self.stall_timeout)
            return False


#: what each spectator message type does: its reply (None: no reply); a spectator does not steer
_SPECTATOR_HANDLERS: dict[str, Callable[[_Spectator, Mapping[str, Any]], dict[str, Any] | None]] = {
    "session.interaction": _Spectator._on_interaction,
    "session.ping": _Spectator._on_ping,
    "session.stop": _Spectator._on_stop,
}
_SPECTATOR_EXPECTED = "session.ping or session.stop"


def _part_frames(broadcast: Broadcast, data: bytes, expected: int | None) -> tuple[int | None, int]:
    """The index of the part after ``data`` and ``data``'s frames: ``data`` is the part ``expected`` (or,
    for the first, any held part) when it is that part's bytes, else bytes of 0 frames (the end's)."""
    if expected is not None:
        part = broadcast.part(expected)
        return (expected + 1, part.frames) if part is not None and part.data is data else (expected, 0)
    for part in reversed(broadcast.parts):  # the first media bytes: once a viewer
        if part.data is data:
            return part.index + 1, part.frames
    return None, 0
