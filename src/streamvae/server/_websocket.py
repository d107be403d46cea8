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
- server ``session.done`` ``{request_id, chunks, stopped, statistics}`` at the end;
- server ``error`` ``{code, message}`` for a message that is not valid (the session goes on), and before
  closing for a refused ``session.start``, a start timeout, a stall or a failed generation.

Error codes: ``invalid_message`` (not a JSON object, too big, a bad field), ``unknown_type``,
``already_started``, ``event_id_conflict`` (an ``event_id`` this session has queued already),
``interaction_failed`` (the generator cannot apply it), ``session_stopped`` (it came after
``session.stop``), ``invalid_start``, ``start_timeout``, ``stall_timeout``, ``generation_failed``, ``busy``.

A piece is a whole fragment (``moof`` + ``mdat``; the first also carries the ``ftyp`` and ``moov`` before
it, the last piece may be the ``mfra`` index alone, of 0 frames), so each binary frame can be appended to
a Media Source buffer as it comes and ``num_frames`` is exactly the frames it lets the client show.

Every connection ends its generation: a client that leaves, stops or stalls cancels it, and the decode
stops at its next step with its session closed (no container, thread or decode slot outlives the
connection), because a generation nobody watches would hold the accelerator for nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any, Literal, Protocol

import anyio
import anyio.lowlevel
from starlette.responses import PlainTextResponse
from starlette.websockets import WebSocket, WebSocketDisconnect
from torch import Tensor

from streamvae._checks import check_callable, check_int, check_limiter, check_seconds
from streamvae._options import SessionOptions, resolve_options
from streamvae._session import ChunkedVideoMP4Session
from streamvae._statistics import SessionStatistics
from streamvae.demo import DEMO_FPS
from streamvae.models import ChunkedDecoder, as_decoder
from streamvae.server._admission import Outcome
from streamvae.server._pacing import MediaTimePacer
from streamvae.server._realtime import (
    Interaction,
    Interactions,
    RealtimePiece,
    SentPiece,
    call_generator,
    demo_generator,
    open_realtime,
    takes_interactions,
)

__all__ = [
    "MAX_CONTROL_BYTES",
    "MAX_PENDING_INTERACTIONS",
    "MAX_START_BYTES",
    "LatentGenerator",
    "SessionHooks",
    "realtime_video_endpoint",
]

logger = logging.getLogger("streamvae.server")

_OWNER = "realtime_video_endpoint"

#: what the endpoint runs: the ``session.start`` message and the session's interactions in, pieces out
#: (a latent ``[1, C, t, H, W]`` or a :class:`streamvae.server.RealtimePiece`), in order; a callable of
#: the start alone is also taken (it takes no interactions)
LatentGenerator = Callable[..., AsyncIterator[Tensor | RealtimePiece]]

#: the largest ``session.start`` (UTF-8 bytes): it may carry a prompt, or an image as a data URL
MAX_START_BYTES = 4 * 1024 * 1024
#: the largest of any other client message (``session.ping``, ``session.interaction``, ``session.stop``)
MAX_CONTROL_BYTES = 128 * 1024
#: interactions queued and not yet taken by the generator; one more is ``interaction_failed``
MAX_PENDING_INTERACTIONS = 1024
#: the longest ``event_id`` (characters)
_MAX_EVENT_ID = 256


# -- the endpoint --


def realtime_video_endpoint(
    vae: Any,
    *,
    generator: LatentGenerator | None = None,
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
      be ``"fragmented"``. Default fragmented MP4 at :data:`streamvae.demo.DEMO_FPS` in the decoder's
      value range.
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
    return websocket_endpoint(
        vae,
        generator=generator,
        options=options,
        decode_limiter=decode_limiter,
        pacer=pacer,
        start_timeout=start_timeout,
        stall_timeout=stall_timeout,
        max_frames=max_frames,
        max_size=max_size,
        hooks=None,
    )


class SessionHooks(Protocol):
    """What an app keeps of its WebSocket sessions: their admission, events, outcomes and latency."""

    #: seconds a refused client is told to wait (``Retry-After``)
    retry_after: int

    def enter(self, request_id: str) -> Admitted | None:
        """Queue a new session, or None (counted as rejected) when every slot and queue place is taken."""


class Admitted(Protocol):
    """One admitted session, as the app counts it."""

    async def start(self) -> None:
        """Wait for a decode slot and take it."""

    def end(
        self,
        outcome: Outcome,
        statistics: SessionStatistics | None,
        control_to_photon: list[float],
    ) -> None:
        """The session has ended, its generation stopped and its MP4 session closed; once."""


def websocket_endpoint(
    vae: Any,
    *,
    generator: LatentGenerator | None,
    options: SessionOptions | None,
    decode_limiter: anyio.CapacityLimiter | None,
    pacer: Callable[[Fraction], MediaTimePacer] | None,
    start_timeout: float,
    stall_timeout: float,
    max_frames: int,
    max_size: int,
    hooks: SessionHooks | None,
    owner: str = _OWNER,
) -> Callable[[WebSocket], Awaitable[None]]:
    """:func:`realtime_video_endpoint`, with ``hooks`` (an app's admission and counts) when given."""
    decoder = as_decoder(vae, owner=owner, pieces=True)
    decoder.check_takes_pieces(owner=owner)
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

    settings = _Settings(
        decoder, generator, checked_options, limiter, float(start_timeout), float(stall_timeout)
    )

    async def endpoint(websocket: WebSocket) -> None:
        pacing = None if pacer is None else pacer(checked_options.fps)  # one schedule per connection
        await _Connection(websocket, settings, pacing, hooks).run()

    return endpoint


def _checked_options(options: object, decoder: ChunkedDecoder, owner: str) -> SessionOptions:
    """The sessions' options: ``options``, which must write fragmented MP4, or the default."""
    defaults = {"fps": DEMO_FPS, "output": "fragmented"} if options is None else {}
    checked = resolve_options(owner, options, defaults, value_range=decoder.chunk_value_range)
    if checked.output != "fragmented":
        raise ValueError(
            f"{owner}: options must write fragmented MP4 (output='fragmented'), got output={checked.output!r}"
        )
    return checked


# -- one connection --


class _Refused(Exception):
    """A client message that is not valid; its text goes to the client as an ``error`` of ``code``."""

    def __init__(self, message: str, *, code: str = "invalid_message", close: int = 1008) -> None:
        super().__init__(message)
        self.code = code
        #: the close code if the session ends over it (1008 policy violation, 1009 message too big)
        self.close = close


@dataclass(frozen=True)
class _Settings:
    """What every connection of one endpoint runs with: realtime_video_endpoint's checked arguments."""

    decoder: ChunkedDecoder
    generator: LatentGenerator
    options: SessionOptions
    decode_limiter: anyio.CapacityLimiter
    start_timeout: float
    stall_timeout: float


_Ending = Literal["done", "stopped", "stalled", "disconnected", "failed"]


class _Connection:
    """One client's session: its start, the generation streamed to it, its messages, its end.

    The ladder: :meth:`run` admits the connection (or refuses it), takes the start, and owns the task
    group of the listener (client messages, until the last message is sent) and the generation, whose own
    scope a stop, a stall or a disconnect cancels; :meth:`run` then says goodbye and counts the outcome.
    """

    def __init__(
        self,
        websocket: WebSocket,
        settings: _Settings,
        pacer: MediaTimePacer | None,
        hooks: SessionHooks | None,
    ) -> None:
        self.websocket = websocket
        self.settings = settings
        self.pacer = pacer
        self.hooks = hooks
        self.request_id = f"video_stream-{uuid.uuid4().hex}"
        self.chunks = 0  # pieces sent
        self._config: dict[str, Any] = {}  # video.start's config, sent with the first piece
        #: seconds from each interaction to the first binary frame that reflects it
        self.control_to_photon: list[float] = []
        self._send_lock = anyio.Lock()  # a metadata message and its binary frame go out together
        self._last_activity = 0.0  # loop time of the last client message or completed send
        self._ending: _Ending | None = None
        self._failure: Exception | None = None
        self._generation = anyio.CancelScope()  # the generation's: a stop, stall or disconnect cancels it
        self._interactions = Interactions()
        self._event_ids: set[str] = set()  # every event id queued in this session
        self._received: dict[str, float] = {}  # queued event ids not yet shown, and when they came
        self._takes_interactions = takes_interactions(settings.generator)
        self._sessions: list[ChunkedVideoMP4Session] = []
        self._goodbye_sent = False  # the last message is out: nothing more is answered
        self._answering: anyio.Event | None = None  # set once the message the listener read is answered
        self._left = False  # the client disconnected

    async def run(self) -> None:
        admitted: Admitted | None = None
        if self.hooks is not None:
            admitted = self.hooks.enter(self.request_id)
            if admitted is None:
                await self._refuse_busy(self.hooks.retry_after)
                return
        outcome: Outcome = "failed"
        try:
            outcome = await self._run(admitted)
        finally:
            if admitted is not None:
                statistics = self._sessions[0].statistics() if self._sessions else None
                admitted.end(outcome, statistics, self.control_to_photon)

    async def _refuse_busy(self, retry_after: int) -> None:
        """Every slot and queue place is taken: HTTP 503 with Retry-After at the handshake where the server
        supports the WebSocket Denial Response extension (uvicorn does), else an ``error`` and close 1013
        (try again later) right after accepting."""
        message = "busy: every decode slot and queue place is taken, retry later"
        if "websocket.http.response" in self.websocket.scope.get("extensions", {}):
            response = PlainTextResponse(
                f"{message}\n", status_code=503, headers={"Retry-After": str(retry_after)}
            )
            await self.websocket.send_denial_response(response)
            return
        await self.websocket.accept()
        error = {"type": "error", "code": "busy", "message": message, "retry_after": retry_after}
        with anyio.move_on_after(self.settings.stall_timeout):
            try:
                await self.websocket.send_text(json.dumps(error))
                await self.websocket.close(1013)
            except WebSocketDisconnect:
                pass

    async def _run(self, admitted: Admitted | None) -> Outcome:
        await self.websocket.accept()
        self._active()
        try:
            start = await self._receive_start()
        except _Refused as refused:
            await self._goodbye(_error(refused.code, str(refused)), code=refused.close)
            return "stalled" if refused.code == "start_timeout" else "failed"
        except WebSocketDisconnect:
            return "disconnected"
        if start is None:
            return "disconnected"
        async with anyio.create_task_group() as group:
            group.start_soon(self._listen)
            await self._generate(start, admitted)
            close = await self._say_how_it_ended()
            group.cancel_scope.cancel()  # the last message is out: nothing more to answer
        if close is not None and not self._left:
            with anyio.move_on_after(self.settings.stall_timeout), _gone():
                await self.websocket.close(close)
        return _OUTCOMES[self._ending or "disconnected"]

    # -- the start --

    async def _receive_start(self) -> dict[str, Any] | None:
        """The client's ``session.start``, or None if it left first; a :class:`_Refused` if it is not
        one, or comes too late."""
        with anyio.move_on_after(self.settings.start_timeout):
            message = await self.websocket.receive()
            if message["type"] == "websocket.disconnect":
                return None
            start = _parsed(message, limit=MAX_START_BYTES, what="session.start")
            if start.get("type") != "session.start":
                raise _Refused(
                    f"the first message must be session.start, got type {_shown(start.get('type'))}",
                    code="invalid_start",
                )
            if start.get("format", "m4s") != "m4s":
                shown = _shown(start.get("format"))
                raise _Refused(
                    f"session.start: format must be 'm4s' (fragmented MP4), got {shown}", code="invalid_start"
                )
            return start
        raise _Refused(
            f"no session.start within {self.settings.start_timeout:g} s of connecting", code="start_timeout"
        )

    # -- the generation --

    async def _generate(self, start: dict[str, Any], admitted: Admitted | None) -> None:
        """Call the generator, wait for a slot, and stream; the ending is named however it ends."""
        with self._generation:
            try:
                steps = call_generator(self.settings.generator, start, self._interactions, owner=_OWNER)
            except ValueError as error:  # the generator refused the start's values
                self._end("failed", _StartRefused(str(error)))
                return
            except Exception as error:  # the generator's own failure, not the client's
                self._end("failed", error)
                return
            try:
                try:
                    if admitted is not None:
                        await admitted.start()  # queued: the listener answers pings meanwhile
                    config = {key: value for key, value in start.items() if key not in ("type", "format")}
                    config["fps"] = float(self.settings.options.fps)
                    self._config = config  # video.start goes with the first piece, which names the codecs
                    self._active()  # the stall watch starts now: a wait in the queue is not a stall
                except WebSocketDisconnect:
                    self._end("disconnected")
                    return
                async with anyio.create_task_group() as group:
                    group.start_soon(self._watch_stall)
                    try:
                        await self._stream(steps)
                    except WebSocketDisconnect:
                        self._end("disconnected")
                    except Exception as error:
                        self._end("failed", error)
                    else:
                        self._end("done")
                    group.cancel_scope.cancel()
            finally:
                await _close_steps(steps)
                self._interactions.close()

    async def _stream(self, steps: AsyncIterator[Tensor | RealtimePiece]) -> None:
        """Decode the generator's pieces as they come and send each whole MP4 piece as it is written."""
        settings = self.settings
        async with open_realtime(
            settings.decoder,
            steps,
            options=settings.options,
            decode_limiter=settings.decode_limiter,
            owner=_OWNER,
            on_session=self._sessions.append,
        ) as run:
            async for sent in run.pieces():
                await self._send_piece(sent)

    async def _send_piece(self, sent: SentPiece) -> None:
        if self.pacer is not None:
            await self.pacer.wait(sent.piece.frames)
        if not self.chunks:
            # The first piece holds the init segment: its codec string (avc1.64001f, av01.0.04M.08, ...) is
            # what a client passes to MediaSource.isTypeSupported and addSourceBuffer.
            config = {**self._config, "codecs": sent.piece.codecs}
            start = {"type": "video.start", "request_id": self.request_id, "format": "m4s", "config": config}
            await self._send_json(start)
        metadata = {
            "type": "video.chunk_metadata",
            "request_id": self.request_id,
            "kind": "media",
            "transport_chunk_index": self.chunks,
            "generation_chunk_index": sent.step,
            "num_frames": sent.piece.frames,
            "byte_length": len(sent.piece.data),
            "started_event_ids": list(sent.started),
            "active_event_ids": list(sent.active),
            "completed_event_ids": list(sent.completed),
        }
        async with self._send_lock:
            # A piece is its metadata and its bytes: a stop or a disconnect (a cancellation) between the two
            # would leave the client a metadata whose frame never comes. So the pair is shielded, bounded
            # as any send is by the stall timeout: a client that takes neither in that time has stalled.
            deadline = anyio.current_time() + self.settings.stall_timeout
            with anyio.CancelScope(shield=True, deadline=deadline) as sending:
                await self.websocket.send_text(json.dumps(metadata))
                await self.websocket.send_bytes(sent.piece.data)
            if sending.cancelled_caught:
                self._stalled()
                await anyio.lowlevel.checkpoint()  # the cancellation ends the generation here
        shown = anyio.current_time()
        for event_id in sent.started:
            received = self._received.pop(event_id, None)
            if received is not None:
                self.control_to_photon.append(shown - received)
        self.chunks += 1
        self._active()

    def _stalled(self) -> None:
        """The client took nothing for ``stall_timeout`` seconds: the session ends, and its generation."""
        self._end("stalled")
        self._generation.cancel()

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
            try:
                message = await self.websocket.receive()
            except (WebSocketDisconnect, RuntimeError):  # closed under it: nobody to listen to
                message = {"type": "websocket.disconnect"}
            if message["type"] == "websocket.disconnect":
                self._left = True
                self._end("disconnected")
                self._generation.cancel()
                return
            self._active()
            if self._goodbye_sent:
                continue  # read after the session's end: the last message is on its way
            # Read before the last message: answered before it (the goodbye waits for this answer).
            answering = self._answering = anyio.Event()
            try:
                try:
                    await self._answer(_parsed(message, limit=MAX_CONTROL_BYTES, what="a control message"))
                except _Refused as refused:
                    await self._reply(_error(refused.code, str(refused)))
            except (WebSocketDisconnect, RuntimeError):  # gone while answered: its disconnect comes next
                continue
            finally:
                answering.set()

    async def _answer(self, control: dict[str, Any]) -> None:
        kind = control.get("type")
        if kind == "session.ping":
            await self._reply({"type": "session.pong"})
        elif kind == "session.interaction":
            interaction = self._interaction(control)
            await self._reply(
                {
                    "type": "session.interaction.queued",
                    "request_id": self.request_id,
                    "event_id": interaction.event_id,
                }
            )
        elif kind == "session.stop":
            if self._ending == "stopped":
                raise _Refused("session.stop: the session is stopping already", code="session_stopped")
            self._end("stopped")
            self._generation.cancel()
        elif kind == "session.start":
            raise _Refused("session.start: this session has started already", code="already_started")
        else:
            raise _Refused(
                f"unknown message type {_shown(kind)} (expected session.interaction, session.ping or "
                "session.stop)",
                code="unknown_type",
            )

    def _interaction(self, control: Mapping[str, Any]) -> Interaction:
        """The interaction ``control`` asks for, queued for the generator; a :class:`_Refused` of the
        right code if it is not valid, comes after the end, or the generator cannot apply it."""
        if self._ending is not None:
            raise _Refused(
                f"session.interaction: the session is ending ({self._ending}): no interaction is applied",
                code="session_stopped",
            )
        body = control.get("interaction")
        if not isinstance(body, dict):
            raise _Refused(f"session.interaction: interaction must be an object, got {_shown(body)}")
        event_id = body.get("event_id")
        if event_id is None:
            event_id = f"evt-{uuid.uuid4().hex}"
        elif not isinstance(event_id, str) or not 1 <= len(event_id) <= _MAX_EVENT_ID:
            raise _Refused(
                f"session.interaction: event_id must be a string of 1 to {_MAX_EVENT_ID} characters, "
                f"got {_shown(event_id)}"
            )
        event = body.get("event")
        if not isinstance(event, dict):
            raise _Refused(f"session.interaction: event must be an object, got {_shown(event)}")
        transition = body.get("transition_chunks", 0)
        if isinstance(transition, bool) or not isinstance(transition, int) or transition < 0:
            raise _Refused(
                f"session.interaction: transition_chunks must be an integer >= 0, got {_shown(transition)}"
            )
        if event_id in self._event_ids:
            raise _Refused(
                f"session.interaction: event_id {_shown(event_id)} was queued already in this session",
                code="event_id_conflict",
            )
        interaction = Interaction(event_id, event, transition, received_at=anyio.current_time())
        if not self._takes_interactions:
            raise _Refused(
                "session.interaction: this endpoint's generator takes no interactions",
                code="interaction_failed",
            )
        check = getattr(self.settings.generator, "check_interaction", None)
        if check is not None:
            try:
                check(interaction)
            except ValueError as error:
                raise _Refused(f"session.interaction: {error}", code="interaction_failed") from None
        if self._interactions.pending >= MAX_PENDING_INTERACTIONS:
            raise _Refused(
                f"session.interaction: {MAX_PENDING_INTERACTIONS} interactions wait for the generator "
                "already: send fewer",
                code="interaction_failed",
            )
        try:
            self._interactions.put(interaction)
        except anyio.ClosedResourceError:  # the generation has just ended
            raise _Refused(
                "session.interaction: the generation has ended: no interaction is applied",
                code="session_stopped",
            ) from None
        self._event_ids.add(event_id)
        self._received[event_id] = interaction.received_at
        return interaction

    # -- the end --

    def _end(self, ending: _Ending, failure: Exception | None = None) -> None:
        """Name how the session ends; the first to say wins (a stop cancels a stream that then fails)."""
        if self._ending is None:
            self._ending, self._failure = ending, failure

    async def _say_how_it_ended(self) -> int | None:
        """Send the last message; the close code to end with (None: the client has gone)."""
        ending, failure = self._ending, self._failure
        if ending in ("done", "stopped"):
            statistics: dict[str, Any] = asdict(self._sessions[0].statistics()) if self._sessions else {}
            statistics["control_to_photon_seconds"] = list(self.control_to_photon)
            done = {
                "type": "session.done",
                "request_id": self.request_id,
                "chunks": self.chunks,
                "stopped": ending == "stopped",
                "statistics": statistics,
            }
            return await self._last(done, 1000)
        if ending == "stalled":
            seconds = f"{self.settings.stall_timeout:g} s"
            message = f"stall timeout: nothing sent and no message from the client for {seconds}"
            return await self._last(_error("stall_timeout", message), 1008)
        if ending == "failed":
            if isinstance(failure, _StartRefused):
                return await self._last(_error("invalid_start", str(failure)), 1008)
            if isinstance(failure, ValueError):  # the generator's word on the client's values
                message = f"the generation failed: {failure}"
            else:
                logger.error("realtime session %s failed", self.request_id, exc_info=failure)
                message = "the generation failed (the server's log has why)"
            return await self._last(_error("generation_failed", message), 1011)
        return None  # disconnected: nobody to tell

    async def _last(self, message: dict[str, Any], code: int) -> int | None:
        """Send the session's last message (a client that reads nothing gets ``stall_timeout`` for it)."""
        with anyio.move_on_after(self.settings.stall_timeout):
            try:
                while self._answering is not None and not self._answering.is_set():
                    await self._answering.wait()  # a message read before this one gets its answer first
                self._goodbye_sent = True  # from here on what the listener reads comes after the end
                async with self._send_lock:
                    await self.websocket.send_text(json.dumps(message))
                return code
            except (WebSocketDisconnect, RuntimeError):
                pass  # it left meanwhile: nobody to tell
        return None

    async def _goodbye(self, message: dict[str, Any], *, code: int) -> None:
        """Send the last message and close, before the session's tasks run."""
        if await self._last(message, code) is not None:
            with anyio.move_on_after(self.settings.stall_timeout):
                with _gone():
                    await self.websocket.close(code)

    async def _reply(self, message: dict[str, Any]) -> None:
        """Answer a client message, unless the session's last message has gone out already."""
        async with self._send_lock:
            if self._goodbye_sent:
                return
            await self.websocket.send_text(json.dumps(message))
        self._active()

    async def _send_json(self, message: dict[str, Any]) -> None:
        async with self._send_lock:
            await self.websocket.send_text(json.dumps(message))
        self._active()

    def _active(self) -> None:
        self._last_activity = anyio.current_time()


class _StartRefused(ValueError):
    """The generator refused the start's values: the client's mistake, told as ``invalid_start``."""


_OUTCOMES: dict[_Ending, Outcome] = {
    "done": "completed",
    "stopped": "stopped",
    "stalled": "stalled",
    "disconnected": "disconnected",
    "failed": "failed",
}


def _gone() -> contextlib.suppress:
    """Ignore what a send or close raises once the client has gone: there is nobody left to tell."""
    return contextlib.suppress(WebSocketDisconnect, RuntimeError)


def _error(code: str, message: str) -> dict[str, Any]:
    return {"type": "error", "code": code, "message": message}


async def _close_steps(steps: AsyncIterator[Any]) -> None:
    """Close the generator (its ``finally`` runs now, not at garbage collection), even when cancelled."""
    close = getattr(steps, "aclose", None)
    if close is not None:
        with anyio.CancelScope(shield=True):
            await close()


def _parsed(message: Mapping[str, Any], *, limit: int, what: str) -> dict[str, Any]:
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


def _shown(value: object) -> str:
    """``value`` as an error message quotes it: a client's megabyte is not echoed back."""
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "…"
