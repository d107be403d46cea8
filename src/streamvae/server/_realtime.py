"""Real-time generation: a generator's pieces in, whole MP4 pieces out, each with the events it reflects.

One path for every transport. ``GET /video.mp4?realtime=1`` streams the bytes; ``WS /v1/realtime/video``
sends each piece with its metadata. Both run :func:`open_realtime` on a generator's pieces. The generator
protocol is the smallest a model loop can use:

- it is called with the client's start message (a dict) and the session's :class:`Interactions`;
- it returns an async iterator of pieces, each a latent ``[1, C, t, H, W]`` or a :class:`RealtimePiece`;
- a :class:`RealtimePiece` adds the piece's sound and the events it starts and completes.

Each piece is decoded while the generator makes the next one. A generator that takes the start alone
(``generator(start)``) works too: it takes no interactions, and each one is refused.

A generator may have a ``check_interaction(interaction)`` method. The server calls it before it queues an
interaction, and a ValueError it raises is the client's ``interaction_failed`` error. That is how an
interaction the generator cannot apply gets its one answer before the generator sees it. Any other
exception it raises is a bug in the generator, not the client's: the interaction is still answered
``interaction_failed`` first, then the session fails (``generation_failed``).

The stand-in model is in ``_standin``; the transports are ``_app`` and ``_websocket``.
"""

from __future__ import annotations

import bisect
import dataclasses
import inspect
import math
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import numpy as np
from torch import Tensor

from streamvae._checks import check_latents, is_int
from streamvae._fragments import MP4Piece
from streamvae._latent_stream import LatentStream, open_latent_stream
from streamvae._options import SessionOptions
from streamvae._session import ChunkedVideoMP4Session
from streamvae._sinks import MP4ByteStream

__all__ = [
    "Interaction",
    "Interactions",
    "RealtimeGenerator",
    "RealtimePiece",
    "RealtimeRun",
    "SentPiece",
    "call_generator",
    "open_realtime",
    "takes_interactions",
]


# -- interactions --


@dataclass(frozen=True)
class Interaction:
    """One client interaction (vllm-omni's ``session.interaction``), as the generator receives it."""

    #: the client's id for it (or one the server made); unique within the session
    event_id: str
    #: what to change: ``{"prompt": "..."}`` and whatever else the generator understands
    event: Mapping[str, Any]
    #: pieces the change may take to complete (0: at once)
    transition_chunks: int = 0
    #: the event loop's time when the server read it (what control-to-photon latency counts from)
    received_at: float = field(default=0.0, compare=False)


class Interactions:
    """The session's interactions, in the order the client sent them, for its generator.

    A model loop takes what has come between its steps with :meth:`take` (it never waits), or waits for
    the next one with ``async for`` (it ends when the session does).
    """

    def __init__(self) -> None:
        self._send, self._receive = anyio.create_memory_object_stream[Interaction](math.inf)

    def take(self) -> list[Interaction]:
        """Every interaction that has come since the last take, oldest first (maybe none)."""
        taken = []
        while True:
            try:
                taken.append(self._receive.receive_nowait())
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                return taken

    def __aiter__(self) -> Interactions:
        return self

    async def __anext__(self) -> Interaction:
        try:
            return await self._receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    @property
    def pending(self) -> int:
        """Interactions queued and not yet taken."""
        return self._receive.statistics().current_buffer_used

    def put(self, interaction: Interaction) -> None:
        """Queue ``interaction`` for the generator (the transport's side)."""
        self._send.send_nowait(interaction)

    def close(self) -> None:
        """No more interactions: a waiting ``async for`` ends (the transport's side)."""
        self._send.close()


# -- pieces --


@dataclass(frozen=True)
class RealtimePiece:
    """One piece of a real-time generation, with what it carries beside its latent.

    - ``latents``: ``[1, C, t, H, W]`` (t ≥ 1), decoded as it comes.
    - ``audio``: the sound of this piece's frames, ``[channels, samples]`` (or ``[samples]``) float at
      ``sample_rate``, played from where the last piece's ended. Either every piece of a generation
      carries audio at one rate and channel count, or none does. The server pushes it before the latent,
      so the sound is there when the frames are encoded.
    - ``started`` / ``completed``: the event ids this piece starts to reflect, and those it completes
      (an event with ``transition_chunks`` n is started at one piece and completed n pieces later).
    """

    latents: Tensor
    audio: Tensor | np.ndarray[Any, Any] | None = None
    sample_rate: int | None = None
    started: Sequence[str] = ()
    completed: Sequence[str] = ()


class RealtimeGenerator(Protocol):
    """A real-time model: the start message and the session's interactions in, pieces out."""

    def __call__(
        self, start: dict[str, Any], interactions: Interactions, /
    ) -> AsyncIterator[Tensor | RealtimePiece]: ...


def takes_interactions(generator: Callable[..., Any]) -> bool:
    """Whether ``generator`` is called with the interactions (two positional arguments) or the start
    alone (a one-argument generator of an earlier release)."""
    try:
        parameters = inspect.signature(generator).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: give it both
        return True
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in parameters)


def call_generator(
    generator: Callable[..., Any], start: dict[str, Any], interactions: Interactions, *, owner: str
) -> AsyncIterator[Tensor | RealtimePiece]:
    """The generator's pieces for ``start``; a TypeError naming ``owner`` unless it returned an async
    iterator."""
    steps = generator(start, interactions) if takes_interactions(generator) else generator(start)
    if not hasattr(steps, "__anext__"):
        raise TypeError(
            f"{owner}: generator must return an async iterator of latent pieces, got {type(steps).__name__}"
        )
    return steps  # type: ignore[no-any-return]


@dataclass(frozen=True)
class SentPiece:
    """One whole MP4 piece to send, with the generation step its frames came from and its events."""

    piece: MP4Piece
    #: the generator's piece (step) its last frame came from
    step: int
    started: tuple[str, ...]
    active: tuple[str, ...]
    completed: tuple[str, ...]


@dataclass
class _Step:
    """What the feed knows of one generator piece: its events, and the video frames once decoded."""

    started: tuple[str, ...]
    completed: tuple[str, ...]


class RealtimeRun:
    """One generation in flight: its MP4 as bytes (:attr:`video`) or as pieces with their events
    (:meth:`pieces`); read one of the two."""

    def __init__(self, stream: LatentStream, video: MP4ByteStream) -> None:
        self.stream = stream
        self.video = video
        #: the session's video frames once each generator piece's decode was done
        self.step_ends: list[int] = []
        self.steps: list[_Step] = []
        self._reported = 0  # generator pieces whose events a sent piece has reported
        self._active: dict[str, None] = {}

    @property
    def session(self) -> ChunkedVideoMP4Session:
        return self.stream.session

    async def pieces(self) -> AsyncIterator[SentPiece]:
        """Each whole MP4 piece as it is written, with the events its frames are the first to show."""
        async for piece in self.video.pieces():
            yield self._described(piece)

    def _described(self, piece: MP4Piece) -> SentPiece:
        # A frame's step is found among the recorded ends; a frame past every one is the piece decoding
        # now (or the last): its end is recorded only when the next piece is taken.
        last = bisect.bisect_right(self.step_ends, max(piece.frames_until - 1, 0))
        started: list[str] = []
        completed: list[str] = []
        if piece.frames:
            while self._reported <= last and self._reported < len(self.steps):
                step = self.steps[self._reported]
                started += step.started
                completed += step.completed
                self._reported += 1
            for event_id in started:
                self._active[event_id] = None
            for event_id in completed:
                self._active.pop(event_id, None)
        return SentPiece(piece, last, tuple(started), tuple(self._active), tuple(completed))


@asynccontextmanager
async def open_realtime(
    vae: Any,
    steps: AsyncIterator[Tensor | RealtimePiece],
    *,
    options: SessionOptions,
    decode_limiter: anyio.CapacityLimiter,
    owner: str,
) -> AsyncIterator[RealtimeRun]:
    """The fragmented MP4 of a generator's pieces, each decoded as it comes (``options`` must write
    fragmented MP4).

    The first piece is awaited before the session opens: whether it carries sound decides the session's
    audio track. The feed is the session's producer, so its error (the generator's, a bad piece's, the
    decode's) reaches the stream unwrapped. Leaving the block early stops the feed and aborts the stream.
    ``steps`` is closed when the block ends, however it ends, even when cancelled.
    """
    try:
        first = _checked_piece(await _first_piece(steps), 0, None, owner)
        if first.audio is not None:
            assert first.sample_rate is not None
            options = _with_live_audio(options, first.sample_rate, first.audio.shape[0])
        async with open_latent_stream(vae, decode_limiter=decode_limiter, options=options) as stream:
            run = RealtimeRun(stream, stream.open_stream(0))

            async def feed() -> None:
                piece, index = first, 0
                while True:
                    run.steps.append(_Step(tuple(piece.started), tuple(piece.completed)))
                    if piece.audio is not None:
                        stream.push_audio(piece.audio)  # before the latent: its frames find their sound
                    await stream.push_latents(piece.latents)
                    # push_latents returns once the worker took this piece: the previous one's decode is
                    # done, all its chunks are in the session, and none of this one's are yet.
                    if index:
                        run.step_ends.append(stream.session.frames_pushed)
                    try:
                        following = await anext(steps)
                    except StopAsyncIteration:
                        break
                    index += 1
                    piece = _checked_piece(following, index, first, owner)
                await stream.finish()

            async with stream.session.producing(feed, [run.video]):
                yield run
    finally:
        close = getattr(steps, "aclose", None)  # its ``finally`` runs now, not at garbage collection
        if close is not None:
            with anyio.CancelScope(shield=True):
                await close()


async def _first_piece(steps: AsyncIterator[Tensor | RealtimePiece]) -> object:
    try:
        return await anext(steps)
    except StopAsyncIteration:
        raise ValueError("the generator gave no latent piece: a video needs at least one") from None


def _checked_piece(piece: object, index: int, first: RealtimePiece | None, owner: str) -> RealtimePiece:
    """``piece`` as a :class:`RealtimePiece` with a checked latent of batch 1 and audio like the first
    piece's; a ValueError (TypeError for no tensor) naming the piece otherwise."""
    name = f"the generator's piece {index}"
    if not isinstance(piece, RealtimePiece):
        piece = RealtimePiece(piece)  # type: ignore[arg-type]  # checked as a latent below
    z = check_latents(piece.latents, None, owner=owner, name=name)
    if z.shape[0] != 1:
        raise ValueError(f"{owner}: {name} must be of batch 1, got shape {tuple(z.shape)}")
    for kind in ("started", "completed"):
        ids = getattr(piece, kind)
        if isinstance(ids, str) or not all(isinstance(i, str) for i in ids):
            raise TypeError(f"{owner}: {name}: {kind} must be a sequence of event ids (str), got {ids!r}")
    audio = piece.audio
    if audio is None:
        if first is not None and first.audio is not None:
            raise ValueError(f"{owner}: {name} has no audio, but the generation's first piece had")
        return piece
    if first is not None and first.audio is None:
        raise ValueError(f"{owner}: {name} has audio, but the generation's first piece had none")
    if not isinstance(audio, (Tensor, np.ndarray)) or audio.ndim not in (1, 2):
        raise ValueError(
            f"{owner}: {name}: audio must be a [channels, samples] (or [samples]) float tensor or array, "
            f"got {type(audio).__name__} of {getattr(audio, 'ndim', '?')} dimensions"
        )
    if audio.ndim == 1:
        audio = audio[None]
    rate = piece.sample_rate
    if not is_int(rate) or rate < 1:
        raise ValueError(f"{owner}: {name}: sample_rate must be a positive int with audio, got {rate!r}")
    if first is not None:
        assert first.audio is not None
        if rate != first.sample_rate or audio.shape[0] != first.audio.shape[0]:
            raise ValueError(
                f"{owner}: {name}: audio of {audio.shape[0]} channels at {rate} Hz, but the first piece's "
                f"is {first.audio.shape[0]} channels at {first.sample_rate} Hz"
            )
    return RealtimePiece(piece.latents, audio, rate, piece.started, piece.completed)


def _with_live_audio(options: SessionOptions, sample_rate: int, channels: int) -> SessionOptions:
    if options.audio_waveforms is not None:
        raise ValueError("the session options give audio_waveforms, but the generator makes its own sound")
    return dataclasses.replace(options, audio_sample_rate=sample_rate, audio_channels=channels)
