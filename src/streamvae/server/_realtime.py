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
interaction the generator cannot apply gets its one answer before the generator sees it.
"""

from __future__ import annotations

import bisect
import hashlib
import inspect
import math
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Protocol

import anyio
import numpy as np
import torch
from starlette.datastructures import QueryParams
from torch import Tensor

from streamvae._checks import check_latents, check_limiter
from streamvae._fragments import MP4Piece
from streamvae._latent_stream import LatentStream, open_latent_stream
from streamvae._options import SessionOptions
from streamvae._session import ChunkedVideoMP4Session
from streamvae._sinks import MP4ByteStream
from streamvae.demo import DEMO_FPS, check_demo_request, demo_latent

__all__ = [
    "MAX_DELAY",
    "Interaction",
    "Interactions",
    "RealtimeGenerator",
    "RealtimePiece",
    "RealtimeRun",
    "SentPiece",
    "demo_generator",
    "open_realtime",
    "parse_realtime",
]

#: seconds a stand-in step may take at most: a longer one is a slow client's way to hold a slot
MAX_DELAY = 2.0
#: seconds a step takes when the query names no ``delay``
DEFAULT_DELAY = 0.1
#: a plain decimal: no sign, exponent, ``nan`` or ``inf`` (which ``float()`` would take)
_DECIMAL = re.compile(r"[0-9]+(\.[0-9]*)?|\.[0-9]+")
#: the largest seed ``torch.Generator.manual_seed`` takes
_MAX_SEED = 2**64 - 1
#: the stand-in's soundtrack
DEMO_SAMPLE_RATE = 48_000


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
    on_session: Callable[[ChunkedVideoMP4Session], None] | None = None,
) -> AsyncIterator[RealtimeRun]:
    """The fragmented MP4 of a generator's pieces, each decoded as it comes (``options`` must write
    fragmented MP4).

    The first piece is awaited before the session opens: whether it carries sound decides the session's
    audio track. The feed is the session's producer, so its error (the generator's, a bad piece's, the
    decode's) reaches the stream unwrapped. Leaving the block early stops the feed and aborts the stream.
    """
    first = _checked_piece(await _first_piece(steps), 0, None, owner)
    if first.audio is not None:
        assert first.sample_rate is not None
        options = _with_live_audio(options, first.sample_rate, first.audio.shape[0])
    async with open_latent_stream(vae, decode_limiter=decode_limiter, options=options) as stream:
        if on_session is not None:
            on_session(stream.session)
        run = RealtimeRun(stream, stream.open_stream(0))
        feed_scope = anyio.CancelScope()

        async def feed() -> None:
            with feed_scope:
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

        stream.session.start_producer(feed)
        try:
            yield run
        finally:
            feed_scope.cancel()  # a no-op once the feed is done; stops it if the reader left early
            await run.video.aclose()


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
    if isinstance(rate, bool) or not isinstance(rate, int) or rate < 1:
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
    import dataclasses

    if options.audio_waveforms is not None:
        raise ValueError("the session options give audio_waveforms, but the generator makes its own sound")
    return dataclasses.replace(options, audio_sample_rate=sample_rate, audio_channels=channels)


# -- the stand-in --


def seed_of_prompt(prompt: str) -> int:
    """The stand-in's seed for a prompt: the first 8 bytes of its UTF-8 SHA-256 (stable across runs)."""
    return int.from_bytes(hashlib.sha256(prompt.encode("utf-8")).digest()[:8], "big")


def tone_hz(seed: int) -> float:
    """The pitch of the stand-in's tone for ``seed``: one of 24 semitones from 220 Hz."""
    return float(220.0 * 2.0 ** ((seed % 24) / 12))


class demo_generator:  # a function to its callers (it was one): a class for check_interaction
    """The stand-in model: :func:`streamvae.demo.demo_latent` of the request, one latent frame a step,
    steered by the client's interactions.

    It reads from the start message:

    - ``num_frames``: 1 + 4k, at most ``max_frames``; default 33.
    - ``width`` and ``height``: multiples of 16, at most ``max_size``; default 128.
    - ``seed``: 0 … 2**64 − 1; default 0.
    - ``step_seconds``: 0 … 2 (a number); default 0. The wait between the pieces it generates, so that an
      interaction meets pieces still to come.
    - ``audio``: a boolean; default false. With true it makes a soundtrack: a tone whose pitch follows the
      seed, at 48 kHz mono, as long as the video.

    Any other value is a ValueError naming it (an ``error`` to the client). The latents are built in a
    worker thread under ``limiter`` (default anyio's own), and decode to ``num_frames`` frames of ``width``
    × ``height`` with :func:`streamvae.demo.demo_vae`.

    An interaction whose event has a ``prompt`` (a string; or a ``seed``, an integer) reseeds the latent
    from the next piece, to ``seed_of_prompt(prompt)``. With ``transition_chunks`` n it blends from the
    old latent to the new over n + 1 pieces: the event is started at the first and completed at the last.
    The pieces before are those of the same session without the interaction. An event with neither is
    refused by :meth:`check_interaction` (the client's ``interaction_failed``).
    """

    def __init__(
        self,
        *,
        max_frames: int = 257,
        max_size: int = 512,
        limiter: anyio.CapacityLimiter | None = None,
        fps: float | Fraction = DEMO_FPS,
    ) -> None:
        from streamvae._checks import check_fps, check_int

        check_int("max_frames", max_frames, minimum=1, owner="demo_generator")
        check_int("max_size", max_size, minimum=16, owner="demo_generator")
        self.max_frames = max_frames
        self.max_size = max_size
        self.limiter = check_limiter("limiter", limiter, owner="demo_generator")
        self.fps = check_fps(fps, owner="demo_generator")

    def __call__(
        self, start: dict[str, Any], interactions: Interactions | None = None
    ) -> AsyncIterator[RealtimePiece]:
        frames = _start_integer(start, "num_frames", default=33, low=1, high=self.max_frames)
        width = _start_integer(start, "width", default=128, low=16, high=self.max_size)
        height = _start_integer(start, "height", default=128, low=16, high=self.max_size)
        seed = _start_integer(start, "seed", default=0, low=0, high=_MAX_SEED)
        step_seconds = _start_number(start, "step_seconds", default=0.0, low=0.0, high=MAX_DELAY)
        audio = start.get("audio", False)
        if not isinstance(audio, bool):
            raise ValueError(f"session.start: audio must be true or false, got {_shown(audio)}")
        # The demo's own rules (1 + 4k frames, sides a multiple of 16), one field at a time to name it.
        for name, request in (("num_frames", (frames, 16)), ("width", (1, width)), ("height", (1, height))):
            try:
                check_demo_request(*request)
            except ValueError as error:
                raise ValueError(f"session.start: {name}: {error}") from None
        return _StandIn(self, frames, width, height, seed, step_seconds, audio).steps(
            interactions if interactions is not None else Interactions()
        )

    def check_interaction(self, interaction: Interaction) -> None:
        """A ValueError unless the stand-in can apply ``interaction``: a ``prompt`` or a ``seed``."""
        event = interaction.event
        prompt, seed = event.get("prompt"), event.get("seed")
        if prompt is None and seed is None:
            raise ValueError("the stand-in applies an event with a prompt (a string) or a seed (an integer)")
        if prompt is not None and not isinstance(prompt, str):
            raise ValueError(f"event.prompt must be a string, got {_shown(prompt)}")
        if seed is not None and (
            isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= _MAX_SEED
        ):
            raise ValueError(f"event.seed must be an integer from 0 to {_MAX_SEED}, got {_shown(seed)}")


class _StandIn:
    """One session of the stand-in: its latents (the old and the new while a transition runs) and tone."""

    def __init__(
        self,
        model: demo_generator,
        frames: int,
        width: int,
        height: int,
        seed: int,
        step_seconds: float,
        audio: bool,
    ) -> None:
        self.model = model
        self.frames, self.width, self.height = frames, width, height
        self.seed = seed
        self.step_seconds = step_seconds
        self.audio = audio
        self._phase = 0.0  # the tone's phase at the end of the last piece (continuous across pieces)
        self._samples = 0  # samples made so far
        self._frames = 0  # video frames those samples last

    async def _latent(self, seed: int) -> Tensor:
        def build() -> Tensor:
            side = demo_latent(self.frames, max(self.width, self.height), seed)
            return side[..., : self.height // 8, : self.width // 8].contiguous()

        return await anyio.to_thread.run_sync(build, limiter=self.model.limiter)

    async def steps(self, interactions: Interactions) -> AsyncIterator[RealtimePiece]:
        old = await self._latent(self.seed)
        new: Tensor | None = None  # the latent a transition goes to
        blend = 1.0  # how far the transition has gone: 1 = at ``new``
        transition: tuple[list[str], int, int] | None = None  # (event ids, first step, pieces)
        tone_seed = self.seed
        for step in range(old.shape[2]):
            if step and self.step_seconds:
                await anyio.sleep(self.step_seconds)
            started: list[str] = []
            completed: list[str] = []
            arrived = [i for i in interactions.take() if "prompt" in i.event or "seed" in i.event]
            if arrived:
                if transition is not None:  # a new target supersedes the one on its way
                    completed += transition[0]
                if new is not None:
                    old = old * (1 - blend) + new * blend
                last = arrived[-1].event
                seed = seed_of_prompt(last["prompt"]) if "prompt" in last else int(last["seed"])
                new, tone_seed = await self._latent(seed), seed
                ids = [i.event_id for i in arrived]
                started += ids
                transition = (ids, step, arrived[-1].transition_chunks)
            if transition is not None and new is not None:
                ids, first, pieces = transition
                blend = min(1.0, (step - first + 1) / (pieces + 1))
                z = old[:, :, step : step + 1] * (1 - blend) + new[:, :, step : step + 1] * blend
                if blend >= 1.0:
                    completed += ids
                    old, new, transition = new, None, None
            else:
                z = old[:, :, step : step + 1]
            yield RealtimePiece(
                z.contiguous(),
                self._tone(1 if step == 0 else 4, tone_seed) if self.audio else None,
                DEMO_SAMPLE_RATE if self.audio else None,
                started,
                completed,
            )

    def _tone(self, frames: int, seed: int) -> Tensor:
        """The next ``frames`` video frames' worth of the tone, its phase carried on (no click)."""
        self._frames += frames
        until = int(Fraction(self._frames) / self.model.fps * DEMO_SAMPLE_RATE)
        count = until - self._samples
        self._samples = until
        step = 2 * math.pi * tone_hz(seed) / DEMO_SAMPLE_RATE
        phases = self._phase + step * torch.arange(1, count + 1, dtype=torch.float64)
        self._phase = float(phases[-1]) % (2 * math.pi) if count else self._phase
        return (0.25 * torch.sin(phases - step)).to(torch.float32)[None]


def _start_integer(start: Mapping[str, Any], name: str, *, default: int, low: int, high: int) -> int:
    """``start[name]`` (``default`` without one), or a ValueError unless it is an integer from ``low`` to
    ``high``. JSON's integers only: ``9.0``, ``"9"`` and ``true`` are refused, not converted."""
    value = start.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(
            f"session.start: {name} must be an integer from {low} to {high}, got {_shown(value)}"
        )
    return value


def _start_number(start: Mapping[str, Any], name: str, *, default: float, low: float, high: float) -> float:
    """``start[name]`` (``default`` without one), or a ValueError unless it is a number from ``low`` to
    ``high`` (JSON's numbers: not a string or a boolean)."""
    value = start.get(name, default)
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        raise ValueError(
            f"session.start: {name} must be a number from {low:g} to {high:g}, got {_shown(value)}"
        )
    return float(value)


def _shown(value: object) -> str:
    """``value`` as an error message quotes it: a client's megabyte is not echoed back."""
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "…"


# -- HTTP's real-time mode --


def parse_realtime(query: QueryParams) -> tuple[bool, float]:
    """``realtime`` (``0`` or ``1``, default 0) and ``delay`` (0 … :data:`MAX_DELAY` seconds), or a
    ValueError (a 400) naming the value."""
    realtime = query.get("realtime", "0")
    if realtime not in ("0", "1"):
        raise ValueError(f"realtime must be 0 or 1, got {realtime[:24]!r}")
    text = query.get("delay", str(DEFAULT_DELAY))
    shown = text if len(text) <= 24 else text[:24] + "…"
    if len(text) > 24 or not _DECIMAL.fullmatch(text):
        raise ValueError(f"delay must be a number of seconds, got {shown!r}")
    delay = float(text)
    if not 0 <= delay <= MAX_DELAY:
        raise ValueError(f"delay must be at least 0 and at most {MAX_DELAY:g} seconds, got {shown}")
    return realtime == "1", delay


async def latent_steps(
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
