"""The session: the lifecycle around the stage pipeline.

    new ──async with──▶ open ──finish()──▶ finishing ──▶ done ──end of block──▶ closed
                          └────── error, cancellation, or leaving the block early: abort ──────┘

A session resolves its options when it is built (:class:`SessionOptions`), checks each chunk when it is
pushed, builds the :class:`StagePipeline` from the first chunk and runs it in its task group, and keeps
one :class:`FailureRecord`: the first error of any stage or producer aborts every stage, and ``push``,
``finish``, the byte streams and leaving the ``async with`` raise that original exception. Leaving the
block with an error or a cancellation aborts everything; no worker thread, slot or container outlives the
block. The session calls down into the pipeline (send, end its input, abort) and reads what it exposes;
the pipeline never calls back up. With ``audio_channels`` it also holds each entry's live audio track
(:class:`LiveAudio`), which ``push_audio`` fills from any thread and the pipeline's encoders drain.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any, Literal, Unpack

import anyio
import anyio.abc
import anyio.lowlevel
import numpy as np
import torch
from torch import Tensor

from streamvae._checks import check_chunk, check_int
from streamvae._cuda import ready_event
from streamvae._errors import STREAM_ENDED, SessionClosedError
from streamvae._failure import FailureRecord
from streamvae._live_audio import LiveAudio
from streamvae._options import SessionKeywords, SessionOptions, resolve_options
from streamvae._pipeline import StagePipeline, StageSpan
from streamvae._public import public
from streamvae._quantize import PixelFormat
from streamvae._sinks import Arrivals, MP4ByteStream
from streamvae._statistics import LatencyRecorder, SessionStatistics
from streamvae._transfer import ChunkTransferStats, PinnedChunkRing

__all__ = ["ChunkedVideoMP4Session"]


@public
class ChunkedVideoMP4Session:
    """Streams pushed BCTHW video chunks into one MP4 per batch entry.

    Use it as ``async with ChunkedVideoMP4Session(value_range=(-1, 1), fps=16) as session:``, then
    ``await session.push(chunk)`` for each chunk in order and ``videos = await session.finish()``.

    Options are the keywords of :class:`streamvae.SessionOptions` (each is described there), or one
    :class:`streamvae.SessionOptions` as ``options=``. A bad option raises here, before any work.
    """

    def __init__(self, *, options: SessionOptions | None = None, **keywords: Unpack[SessionKeywords]) -> None:
        #: the checked options
        self.options = resolve_options(type(self).__name__, options, keywords)
        #: frames (per entry) pushed so far
        self.frames_pushed = 0
        #: what each stage did when, with ``record_timeline=True`` (for profiling and plots)
        self.timeline: list[StageSpan] | None = [] if self.options.record_timeline else None

        self._state: Literal["new", "open", "finishing", "done", "closed"] = "new"
        self._task_group: anyio.abc.TaskGroup | None = None
        self._token: Any = None
        self._loop_thread: int | None = None
        self._failure = FailureRecord()
        self._arrivals = Arrivals()
        self._latency = LatencyRecorder()
        self._pipeline: StagePipeline | None = None
        self._shape: tuple[int, int, int] | None = None  # batch, height, width of pushed chunks
        self._device: torch.device | None = None
        self._streams: dict[int, MP4ByteStream] = {}
        channels, rate = self.options.audio_channels, self.options.audio_sample_rate
        # Each entry's live audio track (audio_channels): pushes from any thread, drained by its encoder.
        self._live_audio = LiveAudio(channels, rate) if channels is not None and rate is not None else None
        #: the exception (or cancellation) the block was left with before finish(), if any
        self._closed_by: BaseException | None = None

    # -- counters --

    @property
    def pixel_format(self) -> PixelFormat | None:
        """The pixel path settled on at the first push (None before it)."""
        return None if self._pipeline is None else self._pipeline.pixel_format

    @property
    def ring(self) -> PinnedChunkRing | None:
        """The ring of host slots settled on at the first push (None before it, or with
        ``transfer_slots=0``)."""
        return None if self._pipeline is None else self._pipeline.ring

    @property
    def batch_size(self) -> int | None:
        """Batch entries (MP4s) of this session, known from the first push."""
        return None if self._shape is None else self._shape[0]

    @property
    def frames_encoded(self) -> int:
        """Frames every entry's encoder has taken so far."""
        return 0 if self._pipeline is None else self._pipeline.frames_encoded

    @property
    def bytes_out(self) -> int:
        """MP4 bytes produced so far, all entries together."""
        return 0 if self._pipeline is None else self._pipeline.bytes_out

    @property
    def encoder_name(self) -> str | None:
        """The video encoder every entry opened (what ``video_codec="auto"`` chose), or None before."""
        return None if self._pipeline is None else self._pipeline.encoder_name

    def statistics(self) -> SessionStatistics:
        """A snapshot of the counters and latencies: time to the first push and to the first fragment that
        holds a frame, each chunk's push → its last frame's bytes handed on (median, max, count)."""
        return self._latency.snapshot(
            frames_pushed=self.frames_pushed,
            frames_encoded=self.frames_encoded,
            bytes_out=self.bytes_out,
            encoder_name=self.encoder_name,
        )

    def transfer_stats(self) -> ChunkTransferStats | None:
        """The ring's statistics, or None without a ring."""
        ring = self.ring
        return None if ring is None else ring.stats()

    # -- lifecycle --

    async def __aenter__(self) -> ChunkedVideoMP4Session:
        if self._state != "new":
            raise RuntimeError("a ChunkedVideoMP4Session can be entered once")
        self._token = anyio.lowlevel.current_token()
        self._loop_thread = threading.get_ident()
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        self._state = "open"
        self._latency.entered()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._task_group is not None
        if self._state != "done":
            # Leaving before finish() completed (an error, a cancellation, or no finish at all) aborts. A
            # producer's push after it raises SessionClosedError caused by that exception, its first cause.
            self._closed_by = exc
            self.abort()
        self._state = "closed"
        if self._live_audio is not None:
            self._live_audio.close("closed")
        # The task group runs the pipeline and producers, which never raise: this waits for them to end.
        # The body's own exception is not handed to it (anyio would wrap it in a group): it propagates
        # unchanged when this method returns.
        await self._task_group.__aexit__(None, None, None)
        self._closed_by = None  # its producers have ended: hold no traceback (and its frames) past the block
        if exc is None:
            self._failure.raise_if_undelivered()

    async def push(self, chunk: Tensor) -> None:
        """Queue a BCTHW chunk (the next frames of every entry) for encoding.

        Waits while the pipeline is full (backpressure). Raises the pipeline's original error if a stage
        has failed, and a ValueError for a chunk that does not fit the session, before any work on it.
        """
        await self._push(chunk, _ready(chunk), "push")

    def push_from_thread(self, chunk: Tensor) -> None:
        """Blocking, thread-safe :meth:`push` for a producer that runs in a worker thread.

        Same backpressure and errors as :meth:`push`. Call it from any thread but the event loop's.
        """
        if self._token is None:
            raise SessionClosedError("push_from_thread() before the session was entered")
        if threading.get_ident() == self._loop_thread:
            # It would block the event loop thread until the loop itself takes the chunk: forever.
            raise RuntimeError(
                "push_from_thread() was called on the event loop's thread; there, use `await session.push()`"
            )
        anyio.from_thread.run(self._push, chunk, _ready(chunk), "push_from_thread", token=self._token)

    def push_audio(self, waveform: Tensor | np.ndarray[Any, Any], *, entry: int = 0) -> None:
        """Append ``waveform`` to entry ``entry``'s live audio track (``audio_channels``); returns at once.

        ``waveform``: finite float samples ``[channels, samples]`` (``[samples]`` for mono), a torch
        tensor on any device or a numpy array, at ``audio_sample_rate``; it is copied, so the caller may
        reuse its buffer. Synchronous and thread-safe: call it from the event loop or any thread, also
        before the first :meth:`push` (the samples wait for the encoder). The entry's encoder encodes the
        track as the video is encoded, up to the video's time as far as samples have arrived — never ahead
        of the video; a lagging track catches up at the next encode — as one AAC stream (no gap or click
        where pushes meet), and drops what it encoded from memory.

        Sync: push a piece's audio before the chunks (or latents) of that piece, and every fragment of a
        fragmented MP4 holds audio within one video frame of its video. The muxer interleaves the tracks
        by time, so video whose audio has not come waits for it: a track that lags holds the video's
        fragments back by as much (they leave once it catches up). At :meth:`finish` each track must last
        as long as the video: within one video frame's samples it is padded with silence or trimmed;
        further off, ``finish`` fails the session with a ValueError that says both durations.

        Raises ValueError for a session without a live track, a waveform that is not finite float
        samples with the session's channel count, or an ``entry`` outside the batch (known from the
        first push; a push before it is checked then); the session's error once it has failed, and
        :class:`streamvae.SessionClosedError` once :meth:`finish` was called or the session aborted.
        """
        if self._live_audio is None:
            raise ValueError(
                "push_audio: this session has no live audio track; pass audio_channels=1 or 2 (with "
                "audio_sample_rate) to push sound as it is made, or audio_waveforms for whole waveforms"
            )
        self._failure.raise_if_failed()
        self._live_audio.push(waveform, entry=entry, owner="push_audio")

    async def finish(self) -> list[bytes]:
        """Encode everything pushed, close each MP4 and return them, one ``bytes`` per batch entry."""
        if self._state == "new":
            raise SessionClosedError("finish() before the session was entered (use `async with`)")
        if self._state != "open":
            raise SessionClosedError(f"finish() on a session that is already {self._state}")
        self._failure.raise_if_failed()
        pipeline = self._pipeline
        if pipeline is None:
            error = SessionClosedError(
                "finish() before any chunk was pushed: an MP4 needs at least one frame"
            )
            self._fail_readers(error)  # raises it if readers wait
            raise error
        self._state = "finishing"
        if self._live_audio is not None:
            self._live_audio.close("finishing")  # every sample is in: the tracks' durations are known
            try:
                self._live_audio.check_durations(self.frames_pushed, self.options.fps, owner="finish")
            except ValueError as error:
                self.fail(error)
                self._failure.raise_if_failed()  # raised here, so not again when the block ends
        await pipeline.end_input()
        await pipeline.done.wait()
        self._failure.raise_if_failed()
        self._state = "done"
        if self._live_audio is not None:
            self._live_audio.close("done")
        return pipeline.videos()

    def open_stream(self, entry: int = 0, *, max_buffered: int = 4) -> MP4ByteStream:
        """Deliver entry ``entry``'s MP4 bytes as they are written, instead of keeping them for ``finish``.

        Call it before the first push. Use ``output="fragmented"`` to get bytes while chunks are still
        being pushed (a plain MP4 is only complete, and so only delivered, at the end). ``max_buffered``
        pieces (each what one transfer's encode wrote) wait for the reader before the encoder does.
        ``finish`` returns ``b""`` for a streamed entry: its bytes went to the stream. Streams of several
        entries must be read at once (:func:`streamvae.read_entries`, or a task each): see
        :class:`streamvae.UnreadStreamError`.
        """
        check_int("entry", entry, minimum=0, owner="open_stream")
        check_int("max_buffered", max_buffered, minimum=1, owner="open_stream")
        if self._shape is not None or self._state not in ("new", "open"):
            raise SessionClosedError("open_stream() must be called before the first push")
        if entry in self._streams:
            raise ValueError(f"open_stream: entry {entry} already has a stream")
        stream = MP4ByteStream(entry, max_buffered, self._failure, self._arrivals)
        self._streams[entry] = stream
        return stream

    def check_batch(self, batch: int, *, owner: str = "push") -> None:
        """Raise ValueError unless a batch of ``batch`` entries fits this session: a waveform and an output
        file per entry, and every entry given to :meth:`open_stream` or :meth:`push_audio` within the batch.

        :meth:`push` checks its first chunk with it; a producer that knows the batch before it has a chunk
        (a latent's shape) checks it first, so no decode step is spent on a session that cannot take it.
        With byte streams open, a batch that does not fit fails the session with that error: its readers
        are told, as of any later failure (without streams the session goes on).
        """
        try:
            self.options.check_batch(batch, streamed=sorted(self._streams), owner=owner)
            if self._live_audio is not None:
                self._live_audio.check_batch(batch, owner=owner)
        except ValueError as error:
            self._fail_readers(error)
            raise

    def start_producer(self, producer: Callable[[], Awaitable[None]]) -> None:
        """Run ``producer`` as a task of the session: a producer that pushes (and finishes) on its own.

        The task lives inside the session's ``async with``, which waits for it. An exception it raises
        fails the session: ``push``, ``finish``, the byte streams and the block raise it, unwrapped.
        This is how :func:`streamvae.stream_mp4` decodes while the caller reads the streams.
        """
        if self._task_group is None or self._state != "open":
            raise SessionClosedError("start_producer() on a session that is not open")

        async def run() -> None:
            try:
                await producer()
            except Exception as error:
                self.fail(error)

        self._task_group.start_soon(run)

    @asynccontextmanager
    async def producing(
        self, producer: Callable[[], Awaitable[None]], streams: Sequence[MP4ByteStream]
    ) -> AsyncIterator[None]:
        """Run ``producer`` as the session's producer (:meth:`start_producer`) for the block, whose end
        stops it and closes ``streams``.

        Leaving the block cancels the producer (a no-op once it is done; it stops one whose reader left
        early) and closes every stream ``streams`` holds by then (one opened while the block ran too).
        :func:`streamvae.stream_mp4` reads its decode's streams in such a block.
        """
        scope = anyio.CancelScope()

        async def produce() -> None:
            with scope:
                await producer()

        self.start_producer(produce)
        try:
            yield
        finally:
            scope.cancel()
            for stream in streams:
                await stream.aclose()

    def fail(self, error: BaseException) -> None:
        """Fail the session with ``error`` (kept if it is the first) and abort it; idempotent.

        Every stage stops; ``push``, ``finish``, the byte streams and the block raise the first error.
        """
        self._failure.record(error)
        self.abort()

    def abort(self) -> None:
        """Stop every stage without recording an error (one already recorded stays first); idempotent.

        What leaving the block before :meth:`finish` does. Readers of the byte streams that get no
        complete MP4 raise the recorded failure, or :class:`streamvae.SessionClosedError`.
        """
        if self._live_audio is not None:
            self._live_audio.close("aborted")
        if self._pipeline is not None:
            self._pipeline.abort()
        else:
            # No stage ever started, so no encoder will end the byte streams: end them here, or their
            # readers (stream_mp4's, when the decode fails before its first chunk) would wait forever.
            for stream in self._streams.values():
                stream.end_unwritten()
        self._arrivals.notify()

    # -- push side --

    async def _push(self, chunk: object, ready: Any, owner: str) -> None:
        # ``owner``: the method the user called, which every error names
        if self._state == "new":
            raise SessionClosedError(f"{owner}() before the session was entered (use `async with`)")
        self._failure.raise_if_failed()
        if self._state != "open":
            raise SessionClosedError(f"{owner}() on a session that is {self._state}") from self._closed_by
        checked = self._check_chunk(chunk, owner)
        self._latency.pushed(checked.shape[2])
        pipeline = self._pipeline
        if pipeline is None:
            pipeline = await self._start(checked)
        try:
            await pipeline.send(checked, ready)
        except STREAM_ENDED:
            self._failure.raise_if_failed()
            raise SessionClosedError(f"{owner}() on a session that was aborted") from self._closed_by
        self.frames_pushed += checked.shape[2]

    def _check_chunk(self, chunk: object, owner: str) -> Tensor:
        checked = check_chunk(chunk, owner=owner)
        batch, _, _, height, width = checked.shape
        if self._shape is not None:
            if (batch, height, width) != self._shape:
                raise ValueError(
                    f"{owner}: chunk shape changed mid-stream: batch, height, width "
                    f"{(batch, height, width)} after {self._shape}"
                )
            if checked.device != self._device:
                raise ValueError(
                    f"{owner}: chunk device changed mid-stream: {checked.device} after {self._device}"
                )
            return checked
        self.check_batch(batch, owner=owner)
        try:
            self.options.check_frame_size(height, width, owner=owner)
        except ValueError as error:
            self._fail_readers(error)
            raise
        return checked

    def _fail_readers(self, error: Exception) -> None:
        """Fail the session with ``error`` raised at its door when byte streams are open on it: their
        readers wait for bytes it will not have, and are told, as of a failure later on. Without readers
        the session goes on (a chunk that fits may follow)."""
        if self._streams:
            self.fail(error)
            self._failure.raise_if_failed()  # raised by the caller, so not again when the block ends

    async def _start(self, first: Tensor) -> StagePipeline:
        """Build the pipeline from the first chunk and start its stages."""
        assert self._task_group is not None
        batch, _, _, height, width = first.shape
        tracks = None if self._live_audio is None else self._live_audio.start(batch)
        self._shape = (batch, height, width)
        self._device = first.device
        pipeline = StagePipeline(
            self.options,
            first,
            streams=self._streams,
            failure=self._failure,
            latency=self._latency,
            timeline=self.timeline,
            live_audio=tracks,
        )
        self._pipeline = pipeline
        await self._task_group.start(pipeline.run)
        return pipeline


def _ready(chunk: object) -> Any:
    """The pushed chunk's ready event on the producer's CUDA stream, recorded before it crosses threads."""
    return ready_event(chunk.device) if isinstance(chunk, Tensor) else None
