"""The session: the lifecycle around the stage pipeline.

    new ──async with──▶ open ──finish()──▶ finishing ──▶ done ──end of block──▶ closed
                          └────── error, cancellation, or leaving the block early: abort ──────┘

A session checks its options when it is built (:class:`SessionOptions`), checks each chunk when it is
pushed, starts the :class:`StagePipeline` with the first chunk, and keeps one :class:`FailureRecord`:
the first error of any stage aborts every stage, and ``push``, ``finish``, the byte streams and leaving
the ``async with`` raise that original exception. Leaving the block with an error or a cancellation
aborts everything; no worker thread, slot or container outlives the block.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import anyio
import anyio.abc
import anyio.lowlevel
import torch
from anyio.streams.memory import MemoryObjectSendStream
from torch import Tensor

from streamvae._encode import EntryEncoder, OutputKind, PixelFormat
from streamvae._errors import SessionClosedError, check_int
from streamvae._failure import FailureRecord
from streamvae._options import NonFinite, SessionOptions
from streamvae._pipeline import StagePipeline, StageSpan
from streamvae._quantize import check_chunk
from streamvae._sinks import Arrivals, EntrySink, MP4ByteStream
from streamvae._statistics import LatencyRecorder, SessionStatistics
from streamvae._transfer import ChunkTransferStats, PinnedChunkRing

__all__ = ["ChunkedVideoMP4Session"]

_CLOSED = (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream)


class ChunkedVideoMP4Session:
    """Streams pushed BCTHW video chunks into one MP4 per batch entry.

    Use it as ``async with ChunkedVideoMP4Session(value_range=(-1, 1), fps=16) as session:``, then
    ``await session.push(chunk)`` for each chunk in order and ``videos = await session.finish()``.

    Options are keywords (every one is described at :class:`streamvae.SessionOptions`), or one checked
    :class:`streamvae.SessionOptions` as ``options=``. A bad option raises here, before any work.
    """

    def __init__(
        self,
        *,
        value_range: tuple[float, float] | None = None,
        fps: float | None = None,
        audio_waveforms: Sequence[Any] | None = None,
        audio_sample_rate: int | None = None,
        batch_frames: int = 1,
        crop: tuple[int, int] | None = None,
        transfer_slots: int = 2,
        video_codec: str = "libx264",
        video_codec_options: dict[str, str] | None = None,
        pixel_format: PixelFormat | Literal["auto"] = "auto",
        output: OutputKind = "mp4",
        keyframe_interval: int | None = None,
        fragment_frames: int | None = None,
        output_files: Sequence[str | Path] | None = None,
        queue_depth: int = 1,
        record_timeline: bool = False,
        nonfinite: NonFinite = "error",
        encode_limiter: anyio.CapacityLimiter | None = None,
        options: SessionOptions | None = None,
    ) -> None:
        if options is None:
            if value_range is None or fps is None:
                raise TypeError("ChunkedVideoMP4Session() needs value_range= and fps= (or options=)")
            options = SessionOptions(
                value_range=value_range,
                fps=fps,  # type: ignore[arg-type]  # any number: normalized to a Fraction
                audio_waveforms=audio_waveforms,  # type: ignore[arg-type]  # checked and normalized
                audio_sample_rate=audio_sample_rate,
                batch_frames=batch_frames,
                crop=crop,
                transfer_slots=transfer_slots,
                video_codec=video_codec,
                video_codec_options=video_codec_options,  # type: ignore[arg-type]  # None: no options
                pixel_format=pixel_format,
                output=output,
                keyframe_interval=keyframe_interval,
                fragment_frames=fragment_frames,
                output_files=output_files,  # type: ignore[arg-type]  # checked and normalized
                queue_depth=queue_depth,
                record_timeline=record_timeline,
                nonfinite=nonfinite,
                encode_limiter=encode_limiter,
            )
        elif not isinstance(options, SessionOptions):
            raise TypeError(f"options must be a streamvae.SessionOptions, got {type(options).__name__}")
        elif value_range is not None or fps is not None:
            raise TypeError("pass the session options as options= or as keywords, not both")
        #: the checked options
        self.options = options
        #: the pixel path settled on at the first push
        self.pixel_format: PixelFormat | None = None
        #: the ring of host slots settled on at the first push (None before it, or with transfer_slots=0)
        self.ring: PinnedChunkRing | None = None
        #: frames (per entry) pushed so far
        self.frames_pushed = 0
        #: what each stage did when, with ``record_timeline=True`` (for profiling and plots)
        self.timeline: list[StageSpan] | None = [] if options.record_timeline else None

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
        self._encoders: list[EntryEncoder] = []
        self._sinks: list[EntrySink] = []
        self._streams: dict[int, MP4ByteStream] = {}
        self._chunks_send: MemoryObjectSendStream[tuple[Tensor, Any]] | None = None

    def __getattr__(self, name: str) -> Any:
        # The options read as attributes, as they always have (session.fps, session.output, ...).
        if name != "options" and name in SessionOptions.__dataclass_fields__:
            return getattr(self.options, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # -- counters --

    @property
    def batch_size(self) -> int | None:
        """Batch entries (MP4s) of this session, known from the first push."""
        return None if self._shape is None else self._shape[0]

    @property
    def frames_encoded(self) -> int:
        """Frames every entry's encoder has taken so far."""
        return min((e.frames_encoded for e in self._encoders), default=0)

    @property
    def bytes_out(self) -> int:
        """MP4 bytes produced so far, all entries together."""
        return sum(e.bytes_out for e in self._encoders)

    @property
    def encoder_name(self) -> str | None:
        """The video encoder every entry opened (what ``video_codec="auto"`` chose), or None before."""
        return self._encoders[0].encoder_name if self._encoders else None

    @property
    def requested_pixel_format(self) -> PixelFormat | Literal["auto"]:
        return self.options.pixel_format

    def statistics(self) -> SessionStatistics:
        """A snapshot of the counters and latencies: time to the first push and to the first fragment that
        holds a frame, each chunk's push → its last frame's bytes handed on (median, max, count)."""
        return self._latency.snapshot(
            frames_pushed=self.frames_pushed, frames_encoded=self.frames_encoded, bytes_out=self.bytes_out
        )

    def transfer_stats(self) -> ChunkTransferStats | None:
        """The ring's statistics, or None without a ring."""
        return None if self.ring is None else self.ring.stats()

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
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._task_group is not None
        if self._state != "done":
            # Leaving before finish() completed (an error, a cancellation, or no finish at all) aborts.
            self.fail(None)
        self._state = "closed"
        # The task group runs the pipeline and producers, which never raise: this waits for them to end.
        # The body's own exception is not handed to it (anyio would wrap it in a group): it propagates
        # unchanged when this method returns.
        await self._task_group.__aexit__(None, None, None)
        # The pipeline holds this session's fail(): drop it, so a server's finished sessions are freed by
        # reference counting, not left for the cycle collector.
        self._pipeline = None
        if exc is None:
            self._failure.raise_if_undelivered()

    async def push(self, chunk: Tensor) -> None:
        """Queue a BCTHW chunk (the next frames of every entry) for encoding.

        Waits while the pipeline is full (backpressure). Raises the pipeline's original error if a stage
        has failed, and a ValueError for a chunk that does not fit the session, before any work on it.
        """
        await self._push(chunk, _record_ready(chunk))

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
        anyio.from_thread.run(self._push, chunk, _record_ready(chunk), token=self._token)

    async def finish(self) -> list[bytes]:
        """Encode everything pushed, close each MP4 and return them, one ``bytes`` per batch entry."""
        if self._state == "new":
            raise SessionClosedError("finish() before the session was entered (use `async with`)")
        if self._state != "open":
            raise SessionClosedError(f"finish() on a session that is already {self._state}")
        self._failure.raise_if_failed()
        if self._chunks_send is None or self._pipeline is None:
            raise SessionClosedError("finish() before any chunk was pushed: an MP4 needs at least one frame")
        self._state = "finishing"
        await self._chunks_send.aclose()
        await self._pipeline.done.wait()
        self._failure.raise_if_failed()
        self._state = "done"
        return [sink.getvalue() for sink in self._sinks]

    def open_stream(self, entry: int = 0, *, max_buffered: int = 4) -> MP4ByteStream:
        """Deliver entry ``entry``'s MP4 bytes as they are written, instead of keeping them for ``finish``.

        Call it before the first push. Use ``output="fragmented"`` to get bytes while chunks are still
        being pushed (a plain MP4 is only complete, and so only delivered, at the end). ``max_buffered``
        pieces (each what one transfer's encode wrote) wait for the reader before the encoder does.
        ``finish`` returns ``b""`` for a streamed entry: its bytes went to the stream. Streams of several
        entries must be read at once (:func:`streamvae.read_entries`, or a task each): see
        :class:`streamvae.UnreadStreamError`.
        """
        check_int("entry", entry, minimum=0)
        check_int("max_buffered", max_buffered, minimum=1)
        if self._shape is not None or self._state not in ("new", "open"):
            raise SessionClosedError("open_stream() must be called before the first push")
        if entry in self._streams:
            raise ValueError(f"entry {entry} already has a stream")
        stream = self._streams[entry] = MP4ByteStream(entry, max_buffered, self._failure, self._arrivals)
        return stream

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

    def fail(self, error: BaseException | None) -> None:
        """Abort the session with ``error`` (kept if it is the first), or without one; idempotent.

        Every stage stops; ``push``, ``finish``, the byte streams and the block raise the first error.
        """
        self._failure.record(error)
        if self._pipeline is not None:
            self._pipeline.cancel()
        if self.ring is not None:
            self.ring.abort(self._failure.first)
        if self._chunks_send is not None:
            self._chunks_send.close()
        else:
            # No stage ever started, so no encoder will end the streams: end them here, or their
            # readers (stream_mp4's, when the decode fails before its first chunk) would wait forever.
            for stream in self._streams.values():
                stream._send.close()
        self._arrivals.notify()

    # -- push side --

    async def _push(self, chunk: Tensor, ready: Any) -> None:
        if self._state == "new":
            raise SessionClosedError("push() before the session was entered (use `async with`)")
        self._failure.raise_if_failed()
        if self._state != "open":
            raise SessionClosedError(f"push() on a session that is {self._state}")
        self._check_chunk(chunk)
        self._latency.pushed(chunk.shape[2])
        if self._chunks_send is None:
            await self._start(chunk)
        assert self._chunks_send is not None
        try:
            await self._chunks_send.send((chunk, ready))
        except _CLOSED:
            self._failure.raise_if_failed()
            raise SessionClosedError("push() on a session that was aborted") from None
        self.frames_pushed += chunk.shape[2]

    def _check_chunk(self, chunk: object) -> None:
        chunk = check_chunk(chunk)
        batch, _, frames, height, width = chunk.shape
        if 0 in (batch, frames, height, width):
            raise ValueError(
                "chunk must hold at least one frame of one entry, at least 1×1 pixels "
                f"[batch, 3, frames, height, width], got shape {tuple(chunk.shape)}"
            )
        if self._shape is not None:
            if (batch, height, width) != self._shape:
                raise ValueError(
                    f"chunk shape changed mid-stream: batch, height, width {(batch, height, width)} "
                    f"after {self._shape}"
                )
            if chunk.device != self._device:
                raise ValueError(f"chunk device changed mid-stream: {chunk.device} after {self._device}")
            return
        self.options.check_first_chunk(batch, height, width, streamed=sorted(self._streams))

    async def _start(self, first: Tensor) -> None:
        """Settle the pixel path, ring and encoders from the first chunk and start the stages."""
        assert self._task_group is not None
        options = self.options
        batch, _, _, height, width = first.shape
        self._shape = (batch, height, width)
        self._device = first.device
        auto: PixelFormat = "yuv420p" if first.is_cuda else "rgb24"
        pixel_format = self.pixel_format = auto if options.pixel_format == "auto" else options.pixel_format
        if options.transfer_slots > 0:
            self.ring = PinnedChunkRing(options.transfer_slots, first.device)
        waveforms, files = options.audio_waveforms, options.output_files
        for entry in range(batch):
            self._encoders.append(
                EntryEncoder(
                    fps=options.fps,
                    pixel_format=pixel_format,
                    video_codec=options.video_codec,
                    video_codec_options=options.encoder_codec_options(),
                    audio=None if waveforms is None else waveforms[entry],
                    audio_sample_rate=options.audio_sample_rate,
                    output=options.output,
                    keyframe_interval=options.keyframe_interval,
                    fragment_frames=options.frames_per_fragment(),
                    file=None if files is None else files[entry],
                )
            )
            self._sinks.append(EntrySink(entry, self._streams.get(entry)))
        self._latency.started(batch)
        self._pipeline = StagePipeline(
            options,
            pixel_format=pixel_format,
            device=first.device,
            ring=self.ring,
            encoders=self._encoders,
            sinks=self._sinks,
            streams=self._streams,
            timeline=self.timeline,
            latency=self._latency,
            fail=self.fail,
        )
        self._chunks_send, chunks = anyio.create_memory_object_stream[tuple[Tensor, Any]](options.queue_depth)
        await self._task_group.start(self._run_pipeline, self._pipeline, chunks)

    async def _run_pipeline(
        self,
        pipeline: StagePipeline,
        chunks: Any,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        try:
            await pipeline.run(chunks, task_status=task_status)
        finally:
            if self.ring is not None:
                self.ring.abort(self._failure.first)


def _record_ready(chunk: object) -> Any:
    """CUDA streams are per thread: mark the chunk ready on the producer's stream before it crosses over."""
    if isinstance(chunk, Tensor) and chunk.is_cuda:
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(chunk.device))
        return ready
    return None
