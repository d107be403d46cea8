"""``WS /v1/realtime/video``: one generation a connection, its fragmented MP4 sent piece by piece as decoded.

The protocol is that of vllm-omni's endpoint of the same path, so its clients work unchanged:

- client ``session.start`` (JSON; ``format`` ``"m4s"``, the default; fields the server does not use,
  ``model``, ``prompt`` …, are ignored) → server ``video.start`` ``{request_id, format, config}``;
- per fMP4 piece, server ``video.chunk_metadata`` ``{request_id, kind: "media", transport_chunk_index,
  generation_chunk_index, num_frames, byte_length}``, then one binary frame of exactly those bytes; the
  binary frames, concatenated in order, are a fragmented MP4 that plays;
- client ``session.ping`` → server ``session.pong``; client ``session.stop`` ends the generation;
- server ``session.done`` ``{request_id, chunks, stopped}`` at the end (stopped by the client or not);
- server ``error`` ``{message}`` for a message that is not valid (the session goes on), and before
  closing for a refused ``session.start``, a start timeout, a stall or a failed generation.

A piece is a whole fragment (``moof`` + ``mdat``; the first also carries the ``ftyp`` and ``moov`` before
it, the last piece may be the ``mfra`` index alone, of 0 frames), so each binary frame can be appended to
a Media Source buffer as it comes and ``num_frames`` is exactly the frames it lets the client show.

Every connection ends its generation: a client that leaves, stops or stalls cancels it, and the decode
stops at its next step with its session closed (no container, thread or decode slot outlives the
connection), because a generation nobody watches would hold the accelerator for nothing.
"""

from __future__ import annotations

import bisect
import json
import logging
import struct
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

import anyio
from starlette.websockets import WebSocket, WebSocketDisconnect
from torch import Tensor

from streamvae._checks import check_callable, check_int, check_latents, check_limiter, check_seconds
from streamvae._fragments import FragmentCounter
from streamvae._latent_stream import open_latent_stream
from streamvae._options import SessionOptions, resolve_options
from streamvae.demo import DEMO_FPS, check_demo_request, demo_latent
from streamvae.models import ChunkedDecoder, as_decoder
from streamvae.server._pacing import MediaTimePacer

__all__ = [
    "MAX_CONTROL_BYTES",
    "MAX_START_BYTES",
    "LatentGenerator",
    "demo_generator",
    "realtime_video_endpoint",
]

logger = logging.getLogger("streamvae.server")

_OWNER = "realtime_video_endpoint"

#: what the endpoint runs: the ``session.start`` message in, latent pieces ``[1, C, t, H, W]`` out, in order
LatentGenerator = Callable[[dict[str, Any]], AsyncIterator[Tensor]]

#: the largest ``session.start`` (UTF-8 bytes): it may carry a prompt, or an image as a data URL
MAX_START_BYTES = 4 * 1024 * 1024
#: the largest of any other client message (``session.ping``, ``session.stop``)
MAX_CONTROL_BYTES = 128 * 1024
#: the largest seed ``torch.Generator.manual_seed`` takes
_MAX_SEED = 2**64 - 1

_Ending = Literal["done", "stopped", "stalled", "disconnected", "failed"]


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
    - ``generator``: called with the ``session.start`` message (a dict) once per connection, it returns
      an async iterator of the latent's pieces ``[1, C, t, H, W]`` (t ≥ 1), in order, each decoded as it
      comes. A ValueError it raises (when called or while iterated) is the client's mistake: its message
      goes to the client as an ``error``. Default :func:`demo_generator` (``max_frames``, ``max_size``).
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
    each naming realtime_video_endpoint.
    """
    decoder = as_decoder(vae, owner=_OWNER, pieces=True)
    decoder.check_takes_pieces(owner=_OWNER)
    check_callable("generator", generator, owner=_OWNER)
    check_callable("pacer", pacer, owner=_OWNER)
    limiter = check_limiter("decode_limiter", decode_limiter, owner=_OWNER) or anyio.CapacityLimiter(1)
    checked_options = _checked_options(options, decoder)
    check_seconds("start_timeout", start_timeout, owner=_OWNER)
    check_seconds("stall_timeout", stall_timeout, owner=_OWNER)
    check_int("max_frames", max_frames, minimum=1, owner=_OWNER)
    check_int("max_size", max_size, minimum=16, owner=_OWNER)
    if generator is None:
        generator = demo_generator(max_frames=max_frames, max_size=max_size, limiter=limiter)

    settings = _Settings(
        decoder, generator, checked_options, limiter, float(start_timeout), float(stall_timeout)
    )

    async def endpoint(websocket: WebSocket) -> None:
        pacing = None if pacer is None else pacer(checked_options.fps)  # one schedule per connection
        await _Connection(websocket, settings, pacing).run()

    return endpoint


def _checked_options(options: object, decoder: ChunkedDecoder) -> SessionOptions:
    """The sessions' options: ``options``, which must write fragmented MP4, or the default."""
    defaults = {"fps": DEMO_FPS, "output": "fragmented"} if options is None else {}
    checked = resolve_options(_OWNER, options, defaults, value_range=decoder.chunk_value_range)
    if checked.output != "fragmented":
        raise ValueError(
            f"{_OWNER}: options must write fragmented MP4 (output='fragmented'), "
            f"got output={checked.output!r}"
        )
    return checked


# -- the stand-in generator --


def demo_generator(
    *, max_frames: int = 257, max_size: int = 512, limiter: anyio.CapacityLimiter | None = None
) -> LatentGenerator:
    """The stand-in model: :func:`streamvae.demo.demo_latent` of the request, one latent frame a step.

    It reads ``num_frames`` (1 + 4k, at most ``max_frames``; default 33), ``width`` and ``height``
    (multiples of 16, at most ``max_size``; default 128) and ``seed`` (0 … 2**64 − 1; default 0) from
    ``session.start``, within the bounds of ``/video.mp4``; any other value is a ValueError naming it
    (an ``error`` to the client). The latent is built in a worker thread under ``limiter`` (default
    anyio's own), and decodes to ``num_frames`` frames of ``width`` × ``height`` with
    :func:`streamvae.demo.demo_vae`.
    """
    check_int("max_frames", max_frames, minimum=1, owner="demo_generator")
    check_int("max_size", max_size, minimum=16, owner="demo_generator")
    check_limiter("limiter", limiter, owner="demo_generator")

    def generate(start: dict[str, Any]) -> AsyncIterator[Tensor]:
        frames = _start_integer(start, "num_frames", default=33, low=1, high=max_frames)
        width = _start_integer(start, "width", default=128, low=16, high=max_size)
        height = _start_integer(start, "height", default=128, low=16, high=max_size)
        seed = _start_integer(start, "seed", default=0, low=0, high=_MAX_SEED)
        # The demo's own rules (1 + 4k frames, sides a multiple of 16), one field at a time to name it.
        for name, request in (("num_frames", (frames, 16)), ("width", (1, width)), ("height", (1, height))):
            try:
                check_demo_request(*request)
            except ValueError as error:
                raise ValueError(f"session.start: {name}: {error}") from None

        def build() -> Tensor:
            side = demo_latent(frames, max(width, height), seed)
            return side[..., : height // 8, : width // 8].contiguous()

        async def steps() -> AsyncIterator[Tensor]:
            z = await anyio.to_thread.run_sync(build, limiter=limiter)
            for step in range(z.shape[2]):
                yield z[:, :, step : step + 1]

        return steps()

    return generate


def _start_integer(start: Mapping[str, Any], name: str, *, default: int, low: int, high: int) -> int:
    """``start[name]`` (``default`` without one), or a ValueError unless it is an integer from ``low`` to
    ``high``. JSON's integers only: ``9.0``, ``"9"`` and ``true`` are refused, not converted."""
    value = start.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(
            f"session.start: {name} must be an integer from {low} to {high}, got {_shown(value)}"
        )
    return value


# -- one connection --


class _Refused(Exception):
    """A client message that is not valid; its text goes to the client as an ``error``."""

    def __init__(self, message: str, *, code: int = 1008) -> None:
        super().__init__(message)
        #: the close code if the session ends over it (1008 policy violation, 1009 message too big)
        self.code = code


@dataclass(frozen=True)
class _Settings:
    """What every connection of one endpoint runs with: realtime_video_endpoint's checked arguments."""

    decoder: ChunkedDecoder
    generator: LatentGenerator
    options: SessionOptions
    decode_limiter: anyio.CapacityLimiter
    start_timeout: float
    stall_timeout: float


class _Connection:
    """One client's session: its start, the generation streamed to it, its control messages, its end.

    The ladder: :meth:`run` takes the start and owns the task group of the session's three tasks: the
    stream (generation, decode, sending), the listener (client messages) and the stall watch. Whichever
    ends the session first names the ending and cancels the group; :meth:`run` then says goodbye.
    """

    def __init__(self, websocket: WebSocket, settings: _Settings, pacer: MediaTimePacer | None) -> None:
        self.websocket = websocket
        self.settings = settings
        self.pacer = pacer
        self.request_id = f"video_stream-{uuid.uuid4().hex}"
        self.chunks = 0  # pieces sent
        self._send_lock = anyio.Lock()  # a metadata message and its binary frame go out together
        self._last_activity = 0.0  # loop time of the last client message or completed send
        self._ending: _Ending | None = None
        self._failure: Exception | None = None

    async def run(self) -> None:
        await self.websocket.accept()
        self._active()
        try:
            start = await self._receive_start()
            if start is None:
                return
            steps = self.settings.generator(start)
            if not hasattr(steps, "__anext__"):
                raise TypeError(
                    f"{_OWNER}: generator must return an async iterator of latent pieces, "
                    f"got {type(steps).__name__}"
                )
        except _Refused as refused:
            await self._goodbye({"type": "error", "message": str(refused)}, code=refused.code)
            return
        except ValueError as error:  # the generator refused the start's values
            await self._goodbye({"type": "error", "message": str(error)}, code=1008)
            return
        except WebSocketDisconnect:
            return
        except Exception as error:  # the generator's own failure, not the client's
            self._end("failed", error)
            await self._say_how_it_ended()
            return
        config = {key: value for key, value in start.items() if key not in ("type", "format")}
        config["fps"] = float(self.settings.options.fps)
        try:
            await self._send_json(
                {"type": "video.start", "request_id": self.request_id, "format": "m4s", "config": config}
            )
            await self._serve(steps)
        except WebSocketDisconnect:
            self._end("disconnected")
        finally:
            await _close_steps(steps)
        await self._say_how_it_ended()

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
                    f"the first message must be session.start, got type {_shown(start.get('type'))}"
                )
            if start.get("format", "m4s") != "m4s":
                raise _Refused(
                    f"session.start: format must be 'm4s' (fragmented MP4), got {_shown(start.get('format'))}"
                )
            return start
        raise _Refused(f"no session.start within {self.settings.start_timeout:g} s of connecting")

    # -- the session's tasks --

    async def _serve(self, steps: AsyncIterator[Tensor]) -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(self._listen, group.cancel_scope)
            group.start_soon(self._watch_stall, group.cancel_scope)
            try:
                await self._stream(steps)
            except WebSocketDisconnect:
                self._end("disconnected")
            except Exception as error:
                self._end("failed", error)
            else:
                self._end("done")
            group.cancel_scope.cancel()

    async def _stream(self, steps: AsyncIterator[Tensor]) -> None:
        """Decode the generator's pieces as they come and send each whole fragment as it is written."""
        pieces = _PieceCutter()
        # The video's frames once each step's decode was done: the step a frame came from is found there.
        step_ends: list[int] = []
        settings = self.settings
        async with open_latent_stream(
            settings.decoder, decode_limiter=settings.decode_limiter, options=settings.options
        ) as stream:
            video = stream.open_stream(0)
            feed_scope = anyio.CancelScope()

            async def feed() -> None:
                with feed_scope:
                    pushed = 0
                    async for piece in steps:
                        _check_piece(piece, pushed)
                        await stream.push_latents(piece)
                        # push_latents returns once the worker took this piece: the previous one's decode is
                        # done, all its chunks are in the session, and none of this one's are yet.
                        if pushed:
                            step_ends.append(stream.session.frames_pushed)
                        pushed += 1
                    if not pushed:
                        raise ValueError("the generator gave no latent piece: a video needs at least one")
                    await stream.finish()

            stream.session.start_producer(feed)
            try:
                async for data in video:
                    for piece in pieces.feed(data):
                        await self._send_piece(piece, step_ends)
                rest = pieces.rest()
                if rest.data:
                    await self._send_piece(rest, step_ends)
            finally:
                feed_scope.cancel()  # a no-op once the feed is done; stops it if the session ended early
                await video.aclose()

    async def _send_piece(self, piece: _Piece, step_ends: list[int]) -> None:
        # A piece's step is that of its last frame (frames - 1 is the video's last frame so far); a step
        # past every recorded end is the one decoding now, or the last one.
        step = bisect.bisect_right(step_ends, max(piece.frames_until - 1, 0))
        if self.pacer is not None:
            await self.pacer.wait(piece.frames)
        metadata = {
            "type": "video.chunk_metadata",
            "request_id": self.request_id,
            "kind": "media",
            "transport_chunk_index": self.chunks,
            "generation_chunk_index": step,
            "num_frames": piece.frames,
            "byte_length": len(piece.data),
        }
        async with self._send_lock:
            await self.websocket.send_text(json.dumps(metadata))
            await self.websocket.send_bytes(piece.data)
        self.chunks += 1
        self._active()

    async def _listen(self, scope: anyio.CancelScope) -> None:
        """Answer the client's messages until it stops the session or leaves."""
        while True:
            message = await self.websocket.receive()
            if message["type"] == "websocket.disconnect":
                self._end("disconnected")
                scope.cancel()
                return
            self._active()
            try:
                control = _parsed(message, limit=MAX_CONTROL_BYTES, what="a control message")
                kind = control.get("type")
                if kind == "session.stop":
                    self._end("stopped")
                    scope.cancel()
                    return
                if kind == "session.ping":
                    await self._send_json({"type": "session.pong"})
                elif kind == "session.start":
                    raise _Refused("session.start: this session has started already")
                else:
                    raise _Refused(
                        f"unknown message type {_shown(kind)} (expected session.ping or session.stop)"
                    )
            except _Refused as refused:
                await self._send_json({"type": "error", "message": str(refused)})

    async def _watch_stall(self, scope: anyio.CancelScope) -> None:
        while True:
            idle = anyio.current_time() - self._last_activity
            if idle >= self.settings.stall_timeout:
                self._end("stalled")
                scope.cancel()
                return
            await anyio.sleep(self.settings.stall_timeout - idle)

    # -- the end --

    def _end(self, ending: _Ending, failure: Exception | None = None) -> None:
        """Name how the session ends; the first to say wins (a stop cancels a stream that then fails)."""
        if self._ending is None:
            self._ending, self._failure = ending, failure

    async def _say_how_it_ended(self) -> None:
        ending, failure = self._ending, self._failure
        if ending in ("done", "stopped"):
            done = {"type": "session.done", "request_id": self.request_id, "chunks": self.chunks}
            await self._goodbye({**done, "stopped": ending == "stopped"}, code=1000)
        elif ending == "stalled":
            seconds = f"{self.settings.stall_timeout:g} s"
            message = f"stall timeout: nothing sent and no message from the client for {seconds}"
            await self._goodbye({"type": "error", "message": message}, code=1008)
        elif ending == "failed":
            if isinstance(failure, ValueError):  # the generator's word on the client's values
                message = f"the generation failed: {failure}"
            else:
                logger.error("realtime session %s failed", self.request_id, exc_info=failure)
                message = "the generation failed (the server's log has why)"
            await self._goodbye({"type": "error", "message": message}, code=1011)

    async def _goodbye(self, message: dict[str, Any], *, code: int) -> None:
        """Send the last message and close; a client that reads nothing gets ``stall_timeout`` for it."""
        with anyio.move_on_after(self.settings.stall_timeout):
            try:
                await self._send_json(message)
                await self.websocket.close(code)
            except WebSocketDisconnect:
                pass  # it left meanwhile: nobody to tell

    async def _send_json(self, message: dict[str, Any]) -> None:
        async with self._send_lock:
            await self.websocket.send_text(json.dumps(message))
        self._active()

    def _active(self) -> None:
        self._last_activity = anyio.current_time()


def _check_piece(piece: object, step: int) -> None:
    """A ValueError (TypeError for no tensor) unless ``piece`` is a latent of batch 1."""
    name = f"the generator's piece {step}"
    z = check_latents(piece, None, owner=_OWNER, name=name)
    if z.shape[0] != 1:
        raise ValueError(f"{_OWNER}: {name} must be of batch 1, got shape {tuple(z.shape)}")


async def _close_steps(steps: AsyncIterator[Tensor]) -> None:
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
        raise _Refused(f"{what} is {size} bytes, over the limit of {limit} bytes", code=1009)
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


# -- fragments --


@dataclass(frozen=True)
class _Piece:
    """What one binary frame carries: whole top-level boxes, up to the end of a fragment."""

    data: bytes
    frames: int  # video frames the piece's fragment holds
    frames_until: int  # the video's frames up to the end of this piece


_BOX_HEADER = struct.Struct(">I4s")


class _PieceCutter:
    """Cuts the bytes of a fragmented MP4, as they are written, after each fragment's ``mdat``.

    The session hands on bytes in whatever pieces its encoder wrote (the first holds the ``ftyp``, ``moov``
    and first fragment, the last ends with the ``mfra``); the client gets them as whole fragments, each
    counted by a :class:`~streamvae._fragments.FragmentCounter`.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._scanned = 0  # bytes of the buffer that are whole boxes
        self._counter = FragmentCounter()

    def feed(self, data: bytes) -> list[_Piece]:
        """The pieces ``data`` completes."""
        self._buffer += data
        pieces = []
        while self._scanned + 8 <= len(self._buffer):
            size, kind = _BOX_HEADER.unpack_from(self._buffer, self._scanned)
            if size == 1 and self._scanned + 16 <= len(self._buffer):  # a 64-bit size follows the type
                size = struct.unpack_from(">Q", self._buffer, self._scanned + 8)[0]
            if size < 8 or self._scanned + size > len(self._buffer):
                break  # incomplete, or runs to the end of the file (size 0): it ends with the stream
            self._scanned += size
            if kind == b"mdat":
                pieces.append(self._cut())
        return pieces

    def rest(self) -> _Piece:
        """What is left at the end of the stream (the ``mfra``, 0 frames), maybe nothing."""
        self._scanned = len(self._buffer)
        return self._cut()

    def _cut(self) -> _Piece:
        data = bytes(self._buffer[: self._scanned])
        del self._buffer[: self._scanned]
        self._scanned = 0
        before = self._counter.samples
        self._counter.feed(data)
        return _Piece(data, self._counter.samples - before, self._counter.samples)
