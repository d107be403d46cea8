"""The session: a chunk's whole way from ``push`` to MP4 bytes.

    push ─▶ prepare ─▶ transfer ─▶ land ─▶ encode[entry] ─▶ sink[entry]

Each stage is a task of one task group owned by the session, joined to the next by a bounded memory-object
stream, so a slow encoder backs up into the ring of host slots and finally into ``push`` — never into
unbounded memory. Tensor math, copies and codec work run in worker threads under limiters the session owns
(never anyio's default limiter, which an ASGI server shares with its own thread pool).

Failure: the first error of any stage (an encoder that cannot open, a bad chunk) aborts every stage, and
``push``, ``finish`` and leaving the ``async with`` raise that original exception — an exception group only
when several independent failures happened. Leaving the block with an error or a cancellation aborts
everything; no worker thread, slot or container outlives the block.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import anyio
import anyio.abc
import anyio.lowlevel
import numpy as np
import torch
from anyio.streams.memory import (
    MemoryObjectReceiveStream,
    MemoryObjectSendStream,
    MemoryObjectStreamStatistics,
)
from torch import Tensor

from streamvae._output_file import check_output_files
from streamvae.encode import (
    EntryEncoder,
    OutputKind,
    PixelFormat,
    as_fps,
    check_video_codec,
    check_waveform,
)
from streamvae.quantize import ChunkQuantizer, check_chunk, check_value_range
from streamvae.transfer import ChunkLease, ChunkTransferStats, PinnedChunkRing, host_lease

__all__ = [
    "ChunkedVideoMP4Session",
    "MP4ByteStream",
    "SessionClosedError",
    "StageSpan",
    "UnreadStreamError",
    "read_entries",
]

_CLOSED = (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream)
#: how often a session with several byte streams looks for a reader that waits on an unread entry
_READER_CHECK_SECONDS = 0.05


class SessionClosedError(RuntimeError):
    """The session no longer accepts chunks (finished, aborted, or not entered)."""


class UnreadStreamError(RuntimeError):
    """A reader waits for an entry's bytes that cannot come, because another entry's stream is unread.

    The entries of a session share one pipeline: while one entry's bounded buffer is full and nobody reads
    it, no entry gets new frames. Read every entry at once — with :func:`read_entries`, or one task per
    stream — instead of one after the other.
    """

    def __init__(self, waiting: int, unread: int) -> None:
        super().__init__(
            f"entry {waiting}'s reader waits for bytes that cannot come: entry {unread}'s stream is full and "
            f"nobody has read it, which stops the pipeline every entry shares. Read the entries at once, "
            f"with `async for entry, data in streamvae.read_entries(streams)` or one task per stream"
        )
        #: the entry whose reader was waiting
        self.waiting = waiting
        #: the entry whose full, unread stream stopped the pipeline
        self.unread = unread


@dataclass
class _Prepared:
    """A group of quantized frames on the chunk's device, ready to copy once full."""

    frames: Tensor  # [B, t, ...] uint8, contiguous; filled from the front
    nan_count: Tensor | None  # NaN values quantized into it, on the device (None with nonfinite="ignore")
    filled: int = 0  # frames quantized into it so far
    ready: Any = None  # torch.cuda.Event recorded after its last frame was quantized, or None


@dataclass(frozen=True)
class StageSpan:
    """One piece of work of a stage, in ``time.perf_counter()`` seconds (``record_timeline=True``)."""

    #: "prepare", "transfer", "land" or "encode[<entry>]"
    stage: str
    start: float
    end: float


class MP4ByteStream:
    """One entry's MP4 bytes as they are written; iterate it with ``async for``.

    The buffer between the encoder and the reader is bounded: a slow reader holds up that entry's encoder,
    then the ring and finally ``push``. The iteration ends after the last bytes; if the session failed, it
    raises the session's error instead of ending quietly. Closing the stream (``aclose``) before the end
    aborts the session — nobody is left to read the entry.
    """

    def __init__(self, session: ChunkedVideoMP4Session, entry: int, max_buffered: int) -> None:
        self._session = session
        self._send, self._receive = anyio.create_memory_object_stream[bytes](max_buffered)
        self.entry = entry
        #: set once the entry's MP4 is complete (every byte has been handed to the stream)
        self.completed = False
        self._read_started = False  # a reader has come: a full buffer is then not left behind for good
        self._reading = False

    def __aiter__(self) -> MP4ByteStream:
        return self

    async def __anext__(self) -> bytes:
        with self._claim():
            try:
                return await self._receive.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                self._raise_end()
                raise StopAsyncIteration from None

    @contextmanager
    def _claim(self) -> Iterator[None]:
        # Two readers would each get part of the bytes, and both MP4s would be corrupt.
        if self._reading:
            raise anyio.BusyResourceError("reading from")
        self._reading = self._read_started = True
        try:
            yield
        finally:
            self._reading = False

    def _raise_end(self) -> None:
        """The stream ended: return if the MP4 is complete, else raise why it is not."""
        if self.completed:
            return
        self._session._raise_if_failed()
        raise SessionClosedError(f"the session was aborted before entry {self.entry}'s MP4 was complete")

    def statistics(self) -> MemoryObjectStreamStatistics:
        """The bounded buffer's statistics (``current_buffer_used``, ``max_buffer_size``, ...)."""
        return self._receive.statistics()

    async def aclose(self) -> None:
        self._receive.close()


class _EntryOutput:
    """Where one entry's MP4 bytes go: kept in memory for ``finish``, or sent to an :class:`MP4ByteStream`."""

    def __init__(self, entry: int, stream: MP4ByteStream | None = None) -> None:
        self.entry = entry
        self.parts: list[bytes] = []
        self.stream = stream

    async def write(self, data: bytes) -> None:
        if not data:
            return
        if self.stream is None:
            self.parts.append(data)
            return
        try:
            await self.stream._send.send(data)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            raise SessionClosedError(
                f"the reader of entry {self.entry}'s stream closed it before the MP4 was complete"
            ) from None
        self.stream._session._notify_readers()

    def complete(self) -> None:
        """Every byte of the entry's MP4 has been written."""
        if self.stream is not None:
            self.stream.completed = True

    def close(self) -> None:
        if self.stream is not None:
            self.stream._send.close()
            self.stream._session._notify_readers()

    def getvalue(self) -> bytes:
        return b"".join(self.parts)


class ChunkedVideoMP4Session:
    """Streams pushed BCTHW video chunks into one MP4 per batch entry.

    Use it as ``async with ChunkedVideoMP4Session(value_range=(-1, 1), fps=16) as session:``, then
    ``await session.push(chunk)`` for each chunk in order and ``videos = await session.finish()``.

    Options:

    - ``value_range``: the (low, high) range of the chunks' values, mapped to 0–255.
    - ``fps``: frames per second, any positive number (stored as an exact rational).
    - ``audio_waveforms``: one waveform per batch entry (``None`` for an entry without audio), float
      ``[samples]`` or ``[channels, samples]``, resampled by nobody: give ``audio_sample_rate``. Each track
      is trimmed or padded with silence to the video's duration.
    - ``batch_frames``: frames per host transfer; pushed chunks are regrouped to this size (the last group
      may be smaller).
    - ``crop``: ``(height, width)`` to keep from the top-left of each frame, e.g. to trim a decoder's padding.
    - ``transfer_slots``: depth of the host-slot ring; ``0`` selects a plain blocking copy per group.
    - ``video_codec`` / ``video_codec_options``: an FFmpeg encoder and its options, merged over the defaults
      (libx264: ``crf`` 18, ``preset`` veryfast, ``threads`` min(4, cores) — pin ``threads`` for
      byte-identical output).
    - ``pixel_format``: ``"rgb24"`` (quantize to RGB; the host converts with swscale), ``"yuv420p"`` (convert
      on the chunk's device; half the bytes, no host conversion) or ``"auto"``: yuv420p for CUDA chunks,
      rgb24 otherwise (on a CPU the rgb24 path is the cheaper one, see docs/benchmarks.md).
    - ``output``: ``"mp4"`` (a complete MP4 with the moov first) or ``"fragmented"`` (fragmented MP4).
    - ``keyframe_interval``: frames between keyframes (codec option ``g``); fragmented MP4 writes a fragment
      per keyframe, so the default for it is one keyframe a second.
    - ``output_files``: one path per batch entry to also write each MP4 to. A regular file is written to a
      temporary ``<name>.part`` beside it and replaced only when complete (a failure removes only the
      temporary file); a device or FIFO is written directly. Unwritable paths raise here, before any work.
    - ``queue_depth``: items each inter-stage stream holds before its sender waits.
    - ``record_timeline``: keep a :class:`StageSpan` per piece of stage work in :attr:`timeline`.
    - ``nonfinite``: what a NaN in a chunk does. ``"error"`` (the default) fails the session with a
      ValueError naming the frames: NaN is a broken decode (typically a float16 overflow in the VAE) that
      would otherwise encode as black or green pixels. ``"ignore"`` encodes it anyway. ±inf is never an
      error: it is clamped to ``value_range`` like any value outside it.
    - ``encode_limiter``: an encode budget shared with other sessions (a server's): every encoder call of
      this session runs under one of its tokens, and ``threads`` defaults to 1, so the encoder threads
      running at once never exceed its tokens however many sessions run. Without it each session encodes
      its entries side by side with the codec's default threads.
    """

    def __init__(
        self,
        *,
        value_range: tuple[float, float],
        fps: float,
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
        output_files: Sequence[str | Path] | None = None,
        queue_depth: int = 1,
        record_timeline: bool = False,
        nonfinite: Literal["error", "ignore"] = "error",
        encode_limiter: anyio.CapacityLimiter | None = None,
    ) -> None:
        self.value_range = check_value_range(value_range)
        self.fps = as_fps(fps)
        _check_int("batch_frames", batch_frames, minimum=1)
        _check_int("transfer_slots", transfer_slots, minimum=0)
        _check_int("queue_depth", queue_depth, minimum=0)
        if crop is not None:
            if (
                not isinstance(crop, (tuple, list))
                or len(crop) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in crop)
            ):
                raise ValueError(f"crop must be (height, width) with two positive ints, got {crop!r}")
            crop = (int(crop[0]), int(crop[1]))
        if pixel_format not in ("auto", "rgb24", "yuv420p"):
            raise ValueError(f"pixel_format must be 'auto', 'rgb24' or 'yuv420p', got {pixel_format!r}")
        if output not in ("mp4", "fragmented"):
            raise ValueError(f"output must be 'mp4' or 'fragmented', got {output!r}")
        if nonfinite not in ("error", "ignore"):
            raise ValueError(f"nonfinite must be 'error' or 'ignore', got {nonfinite!r}")
        if video_codec_options is not None and not (
            isinstance(video_codec_options, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in video_codec_options.items())
        ):
            raise ValueError(
                "video_codec_options must be a dict of FFmpeg option strings, e.g. "
                f"{{'crf': '18', 'preset': 'veryfast'}}, got {video_codec_options!r}"
            )
        check_video_codec(video_codec, video_codec_options)
        if keyframe_interval is not None:
            _check_int("keyframe_interval", keyframe_interval, minimum=1)
        elif output == "fragmented":
            keyframe_interval = max(1, round(self.fps))
        self._waveforms: list[np.ndarray[Any, np.dtype[np.float32]] | None] | None = None
        if audio_waveforms is not None:
            if isinstance(audio_waveforms, (Tensor, np.ndarray)) or not isinstance(audio_waveforms, Sequence):
                raise ValueError(
                    "audio_waveforms must be a sequence with one waveform (or None) per batch entry"
                )
            if isinstance(audio_sample_rate, bool) or not isinstance(audio_sample_rate, int):
                raise ValueError(
                    f"audio_sample_rate must be a positive int when audio_waveforms is given, "
                    f"got {audio_sample_rate!r}"
                )
            _check_int("audio_sample_rate", audio_sample_rate, minimum=1)
            self._waveforms = [
                None if w is None else check_waveform(w, name=f"audio_waveforms[{i}]")
                for i, w in enumerate(audio_waveforms)
            ]
        if output_files is not None:
            output_files = check_output_files(output_files)
        self.audio_sample_rate = audio_sample_rate
        self.batch_frames = batch_frames
        self.crop = crop
        self.transfer_slots = transfer_slots
        self.video_codec = video_codec
        self.video_codec_options = dict(video_codec_options or {})
        self.requested_pixel_format = pixel_format
        self.output = output
        self.keyframe_interval = keyframe_interval
        self.output_files = output_files
        self.queue_depth = queue_depth
        self.nonfinite = nonfinite
        self._chunk_starts: deque[tuple[int, int]] = deque()  # (index, first frame) of chunks in flight
        if encode_limiter is not None and not isinstance(encode_limiter, anyio.CapacityLimiter):
            raise TypeError(f"encode_limiter must be an anyio.CapacityLimiter, got {encode_limiter!r}")
        self.encode_limiter = encode_limiter

        #: the pixel path settled on at the first push
        self.pixel_format: PixelFormat | None = None
        #: the ring of host slots settled on at the first push (None before it, or with transfer_slots=0)
        self.ring: PinnedChunkRing | None = None
        #: frames (per entry) pushed so far
        self.frames_pushed = 0
        #: what each stage did when, with ``record_timeline=True`` (for profiling and plots)
        self.timeline: list[StageSpan] | None = [] if record_timeline else None

        self._state: Literal["new", "open", "finishing", "done", "closed"] = "new"
        self._task_group: anyio.abc.TaskGroup | None = None
        self._stages_scope: anyio.CancelScope | None = None
        self._token: Any = None
        self._errors: list[BaseException] = []
        self._error_delivered = False
        self._stages_done = anyio.Event()
        self._shape: tuple[int, int, int] | None = None  # batch, height, width of pushed chunks
        self._device: torch.device | None = None
        self._encoders: list[EntryEncoder] = []
        self._outputs: list[_EntryOutput] = []
        self._streams: dict[int, MP4ByteStream] = {}
        self._chunks_send: MemoryObjectSendStream[tuple[Tensor, Any]] | None = None
        self._loop_thread: int | None = None
        self._quantize_stream: Any = None  # torch.cuda.Stream of the prepare stage (CUDA chunks)
        self._bytes_arrived = anyio.Event()  # set (and replaced) when any stream gets bytes or ends

    # -- public counters --

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
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._task_group is not None
        if self._state != "done":
            # Leaving before finish() completed (an error, a cancellation, or no finish at all) aborts.
            self._abort(None)
        self._state = "closed"
        # The task group only runs the supervisor, which never raises: this waits for every stage to end.
        # The body's own exception is not handed to it (anyio would wrap it in a group): it propagates
        # unchanged when this method returns.
        await self._task_group.__aexit__(None, None, None)
        # Streams point back at the session: drop the session's side, so a server's finished sessions
        # are freed by reference counting, not left for the cycle collector.
        self._streams = {}
        for output in self._outputs:
            output.stream = None
        if exc is None and self._errors and not self._error_delivered:
            self._raise_errors()

    async def push(self, chunk: Tensor) -> None:
        """Queue a BCTHW chunk (the next frames of every entry) for encoding.

        Waits while the pipeline is full (backpressure). Raises the pipeline's original error if a stage
        has failed, and a ValueError for a chunk that does not fit the session, before any work on it.
        """
        await self._push(chunk, self._record_ready(chunk))

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
        anyio.from_thread.run(self._push, chunk, self._record_ready(chunk), token=self._token)

    async def finish(self) -> list[bytes]:
        """Encode everything pushed, close each MP4 and return them, one ``bytes`` per batch entry."""
        if self._state == "new":
            raise SessionClosedError("finish() before the session was entered (use `async with`)")
        if self._state != "open":
            raise SessionClosedError(f"finish() on a session that is already {self._state}")
        self._raise_if_failed()
        if self._chunks_send is None:
            raise SessionClosedError("finish() before any chunk was pushed: an MP4 needs at least one frame")
        self._state = "finishing"
        await self._chunks_send.aclose()
        await self._stages_done.wait()
        self._raise_if_failed()
        self._state = "done"
        return [output.getvalue() for output in self._outputs]

    def open_stream(self, entry: int = 0, *, max_buffered: int = 4) -> MP4ByteStream:
        """Deliver entry ``entry``'s MP4 bytes as they are written, instead of keeping them for ``finish``.

        Call it before the first push. Use ``output="fragmented"`` to get bytes while chunks are still
        being pushed (a plain MP4 is only complete, and so only delivered, at the end). ``max_buffered``
        pieces (each what one transfer's encode wrote) wait for the reader before the encoder does.
        ``finish`` returns ``b""`` for a streamed entry: its bytes went to the stream. Streams of several
        entries must be read at once (:func:`read_entries`, or a task each): see :class:`UnreadStreamError`.
        """
        _check_int("entry", entry, minimum=0)
        _check_int("max_buffered", max_buffered, minimum=1)
        if self._shape is not None or self._state not in ("new", "open"):
            raise SessionClosedError("open_stream() must be called before the first push")
        if entry in self._streams:
            raise ValueError(f"entry {entry} already has a stream")
        stream = self._streams[entry] = MP4ByteStream(self, entry, max_buffered)
        return stream

    def _start_background(self, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``work`` as a task of the session; it must not raise (record errors with ``_abort``)."""
        if self._task_group is None or self._state != "open":
            raise SessionClosedError("the session is not open")
        self._task_group.start_soon(work)

    # -- push side --

    def _record_ready(self, chunk: Tensor) -> Any:
        # CUDA streams are per thread: mark the chunk ready on the producer's stream before it crosses over.
        if isinstance(chunk, Tensor) and chunk.is_cuda:
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(chunk.device))
            return ready
        return None

    async def _push(self, chunk: Tensor, ready: Any) -> None:
        if self._state == "new":
            raise SessionClosedError("push() before the session was entered (use `async with`)")
        self._raise_if_failed()
        if self._state != "open":
            raise SessionClosedError(f"push() on a session that is {self._state}")
        self._check_chunk(chunk)
        if self._chunks_send is None:
            await self._start(chunk)
        assert self._chunks_send is not None
        try:
            await self._chunks_send.send((chunk, ready))
        except _CLOSED:
            self._raise_if_failed()
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
        if self._waveforms is not None and len(self._waveforms) != batch:
            raise ValueError(
                f"audio_waveforms has {len(self._waveforms)} entries but the chunks have batch size {batch}"
            )
        if any(entry >= batch for entry in self._streams):
            raise ValueError(
                f"open_stream() was called for entry {max(self._streams)}, but the batch size is {batch}"
            )
        if self.output_files is not None and len(self.output_files) != batch:
            raise ValueError(
                f"output_files has {len(self.output_files)} paths but the chunks have batch size {batch}"
            )
        out_height, out_width = height, width
        if self.crop is not None:
            if self.crop[0] > height or self.crop[1] > width:
                raise ValueError(f"crop {self.crop} is larger than the {height}×{width} frames")
            out_height, out_width = self.crop
        if out_height % 2 or out_width % 2:
            raise ValueError(
                f"yuv420p video needs an even height and width, got {out_height}×{out_width}; "
                f"pass crop=({out_height - out_height % 2}, {out_width - out_width % 2}) to trim a row/column"
            )

    async def _start(self, first: Tensor) -> None:
        """Settle the pixel path, ring and encoders from the first chunk and start the stages."""
        assert self._task_group is not None
        batch, _, _, height, width = first.shape
        self._shape = (batch, height, width)
        self._device = first.device
        if first.is_cuda:
            # Every quantize call runs on this one stream, whichever worker thread runs it: each group's
            # ready event is recorded where its frames were written (never on a caller's stream).
            self._quantize_stream = torch.cuda.Stream(first.device)
        if self.requested_pixel_format == "auto":
            self.pixel_format = "yuv420p" if first.is_cuda else "rgb24"
        else:
            self.pixel_format = self.requested_pixel_format
        if self.transfer_slots > 0:
            self.ring = PinnedChunkRing(self.transfer_slots, first.device)
        codec_options = self.video_codec_options
        if self.encode_limiter is not None:
            # A shared budget counts encoder calls: one thread each keeps the threads at work within it.
            codec_options = {"threads": "1", **codec_options}
        for entry in range(batch):
            self._encoders.append(
                EntryEncoder(
                    fps=self.fps,
                    pixel_format=self.pixel_format,
                    video_codec=self.video_codec,
                    video_codec_options=codec_options,
                    audio=None if self._waveforms is None else self._waveforms[entry],
                    audio_sample_rate=self.audio_sample_rate,
                    output=self.output,
                    keyframe_interval=self.keyframe_interval,
                    file=None if self.output_files is None else self.output_files[entry],
                )
            )
            self._outputs.append(_EntryOutput(entry, self._streams.get(entry)))
        self._chunks_send, chunks_receive = anyio.create_memory_object_stream[tuple[Tensor, Any]](
            self.queue_depth
        )
        await self._task_group.start(self._run_stages, chunks_receive)

    # -- the stages --

    async def _run_stages(
        self,
        chunks: MemoryObjectReceiveStream[tuple[Tensor, Any]],
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        depth = self.queue_depth
        prepared_send, prepared_receive = anyio.create_memory_object_stream[_Prepared](depth)
        leases_send, leases_receive = anyio.create_memory_object_stream[ChunkLease](depth)
        entry_streams = [anyio.create_memory_object_stream[ChunkLease](depth) for _ in self._encoders]
        limiters = {
            "prepare": anyio.CapacityLimiter(1),
            "transfer": anyio.CapacityLimiter(1),
            "encode": (
                self.encode_limiter
                if self.encode_limiter is not None
                else anyio.CapacityLimiter(len(self._encoders))
            ),
        }
        try:
            async with anyio.create_task_group() as watch:
                if len(self._streams) > 1:
                    watch.start_soon(self._watch_readers, [receive for _, receive in entry_streams])
                async with anyio.create_task_group() as stages:
                    self._stages_scope = stages.cancel_scope
                    stages.start_soon(self._stage, self._prepare, chunks, prepared_send, limiters["prepare"])
                    stages.start_soon(
                        self._stage, self._transfer, prepared_receive, leases_send, limiters["transfer"]
                    )
                    stages.start_soon(self._stage, self._land, leases_receive, [s for s, _ in entry_streams])
                    for entry, (_, receive) in enumerate(entry_streams):
                        stages.start_soon(self._stage, self._encode, entry, receive, limiters["encode"])
                    task_status.started()
                watch.cancel_scope.cancel()  # every stage has ended
        finally:
            if self.ring is not None:
                self.ring.abort(self._errors[0] if self._errors else None)
            self._stages_done.set()

    async def _watch_readers(self, entry_leases: list[MemoryObjectReceiveStream[ChunkLease]]) -> None:
        """Fail the session with :class:`UnreadStreamError` instead of letting its readers hang.

        Readers that take one entry to its end before starting the next wait forever once the unread
        entry's buffer fills: its encoder stops, the land stage stops at it, and no entry gets new frames.
        The state is checked a few times a second while it lasts and reported once seen twice in a row,
        so a reader task that is about to start is not mistaken for one that never will.
        """
        suspect: tuple[int, int] | None = None
        while True:
            await anyio.sleep(_READER_CHECK_SECONDS)
            stalled = self._stalled_readers(entry_leases)
            if stalled is not None and stalled == suspect:
                self._abort(UnreadStreamError(*stalled))
                return
            suspect = stalled

    def _stalled_readers(
        self, entry_leases: list[MemoryObjectReceiveStream[ChunkLease]]
    ) -> tuple[int, int] | None:
        """``(waiting, unread)`` when entry ``waiting``'s reader can only get bytes after entry ``unread``'s
        never-read stream is read: the reader waits on an empty buffer, its encoder on an empty queue, and
        the land stage on the unread entry's encoder, which waits on its full buffer."""
        for waiting, stream in self._streams.items():
            output, queue = stream.statistics(), entry_leases[waiting].statistics()
            if output.tasks_waiting_receive == 0 or output.current_buffer_used:
                continue
            if queue.tasks_waiting_receive == 0 or queue.current_buffer_used:
                continue
            for unread, other in self._streams.items():
                if unread == waiting or other._read_started:
                    continue
                full, landing = other.statistics(), entry_leases[unread].statistics()
                if (
                    full.current_buffer_used >= full.max_buffer_size
                    and full.tasks_waiting_send
                    and landing.tasks_waiting_send
                ):
                    return waiting, unread
        return None

    def _notify_readers(self) -> None:
        """Wake :func:`read_entries`: some stream got bytes, ended, or the session failed."""
        arrived, self._bytes_arrived = self._bytes_arrived, anyio.Event()
        arrived.set()

    async def _stage(self, stage: Callable[..., Any], *args: Any) -> None:
        """Run one stage; its first real error aborts the pipeline instead of cancelling the caller."""
        try:
            await stage(*args)
        except _CLOSED:
            pass  # a neighbouring stage ended first; whatever made it end is recorded there
        except Exception as error:
            self._abort(error)

    async def _prepare(
        self,
        chunks: MemoryObjectReceiveStream[tuple[Tensor, Any]],
        prepared: MemoryObjectSendStream[_Prepared],
        limiter: anyio.CapacityLimiter,
    ) -> None:
        # One quantizer and its scratch for the whole stream: no chunk-sized temporaries per chunk.
        quantizer = ChunkQuantizer(self.value_range, self.pixel_format or "rgb24")
        partial: _Prepared | None = None  # a group short of batch_frames frames
        index = first = 0
        with chunks, prepared:
            async for chunk, ready in chunks:
                if self.nonfinite == "error":
                    self._chunk_starts.append((index, first))
                index, first = index + 1, first + chunk.shape[2]
                with self._span("prepare"):
                    groups, partial = await anyio.to_thread.run_sync(
                        self._quantize_groups, quantizer, chunk, ready, partial, limiter=limiter
                    )
                del chunk
                for group in groups:
                    await prepared.send(group)
            if partial is not None:
                last = await anyio.to_thread.run_sync(self._last_group, partial, limiter=limiter)
                await prepared.send(last)

    def _quantize_groups(
        self, quantizer: ChunkQuantizer, chunk: Tensor, ready: Any, partial: _Prepared | None
    ) -> tuple[list[_Prepared], _Prepared | None]:
        """Worker thread: crop one chunk and quantize it straight into ``batch_frames``-frame groups.

        Returns the full groups and the group still short of frames (filled further by the next chunk).
        """
        with self._on_quantize_stream():
            return self._quantize_groups_here(quantizer, chunk, ready, partial)

    def _quantize_groups_here(
        self, quantizer: ChunkQuantizer, chunk: Tensor, ready: Any, partial: _Prepared | None
    ) -> tuple[list[_Prepared], _Prepared | None]:
        if ready is not None:
            stream = torch.cuda.current_stream(chunk.device)
            stream.wait_event(ready)
            # The chunk was allocated on the producer's stream: keep its memory until this stream is done.
            chunk.record_stream(stream)
        if self.crop is not None:
            chunk = chunk[..., : self.crop[0], : self.crop[1]]
        batch, _, frames, height, width = chunk.shape
        step, groups, start = self.batch_frames, [], 0
        while start < frames:
            if partial is None:
                # A fresh buffer per group, not a pool: the ring's copy, or (transfer_slots=0) the
                # encoders, may still read the last one.
                device = chunk.device
                shape = (batch, step, *quantizer.frame_shape(height, width))
                partial = _Prepared(
                    torch.empty(shape, dtype=torch.uint8, device=device),
                    None if self.nonfinite == "ignore" else torch.zeros((), dtype=torch.int64, device=device),
                )
            take = min(frames - start, step - partial.filled)
            quantizer.quantize_into(
                chunk[:, :, start : start + take],
                partial.frames[:, partial.filled : partial.filled + take],
                partial.nan_count,
            )
            partial.filled += take
            start += take
            if partial.filled == step:
                partial.ready = self._ready_after(partial.frames)
                groups.append(partial)
                partial = None
        return groups, partial

    def _last_group(self, partial: _Prepared) -> _Prepared:
        """Worker thread: the stream's last group, short of ``batch_frames`` frames, made contiguous."""
        with self._on_quantize_stream():
            partial.frames = partial.frames[:, : partial.filled].contiguous()
            partial.ready = self._ready_after(partial.frames)
        return partial

    def _on_quantize_stream(self) -> contextlib.AbstractContextManager[Any]:
        if self._quantize_stream is None:
            return contextlib.nullcontext()
        return torch.cuda.stream(self._quantize_stream)

    @staticmethod
    def _ready_after(frames: Tensor) -> Any:
        if not frames.is_cuda:
            return None
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(frames.device))
        return ready

    async def _transfer(
        self,
        prepared: MemoryObjectReceiveStream[_Prepared],
        leases: MemoryObjectSendStream[ChunkLease],
        limiter: anyio.CapacityLimiter,
    ) -> None:
        readers = len(self._encoders)
        with prepared, leases:
            async for group in prepared:
                with self._span("transfer"):
                    if self.ring is not None:
                        lease = await self.ring.transfer(
                            group.frames, readers=readers, ready=group.ready, extra=group.nan_count
                        )
                    else:
                        lease = await anyio.to_thread.run_sync(
                            partial(
                                host_lease,
                                group.frames,
                                readers=readers,
                                ready=group.ready,
                                extra=group.nan_count,
                            ),
                            limiter=limiter,
                        )
                del group
                try:
                    await leases.send(lease)
                except BaseException:
                    lease.discard()
                    raise

    async def _land(
        self,
        leases: MemoryObjectReceiveStream[ChunkLease],
        entries: list[MemoryObjectSendStream[ChunkLease]],
    ) -> None:
        landed = 0  # frames (per entry) landed before this lease's
        with leases:
            try:
                async for lease in leases:
                    try:
                        with self._span("land"):
                            await lease.wait_landed()
                        self._check_no_nan(lease, landed)
                    except BaseException:
                        lease.discard()
                        raise
                    landed += lease.shape[1]
                    for index, entry in enumerate(entries):
                        try:
                            await entry.send(lease)
                        except BaseException:
                            # Entries not reached never read it: give their readers back.
                            for _ in range(len(entries) - index):
                                lease.release()
                            raise
            finally:
                for entry in entries:
                    entry.close()

    def _check_no_nan(self, lease: ChunkLease, first: int) -> None:
        """Raise a ValueError if the landed group of frames ``first``… held NaN (``nonfinite="error"``)."""
        if lease.extra is None:
            return
        last = first + lease.shape[1] - 1
        starts = self._chunk_starts
        while len(starts) > 1 and starts[1][1] <= first:
            starts.popleft()  # chunks wholly before this group: no later group needs them
        count = int(lease.extra)  # landed with the frames: reading it waits for nothing
        if not count:
            return
        chunks = [index for index, start in starts if start <= last]
        where = f"frame {first} holds" if first == last else f"frames {first}–{last} hold"
        source = f"chunk {chunks[0]}" if len(chunks) == 1 else f"chunks {chunks[0]}–{chunks[-1]}"
        raise ValueError(
            f"{where} {count} NaN value{'s' * (count != 1)} (pushed {source}, counting from 0): a broken "
            "decode, most likely a float16 overflow in the VAE decoder; decode in float32 or bfloat16, or "
            "pass nonfinite='ignore' to encode such frames anyway"
        )

    async def _encode(
        self,
        entry: int,
        leases: MemoryObjectReceiveStream[ChunkLease],
        limiter: anyio.CapacityLimiter,
    ) -> None:
        encoder, output = self._encoders[entry], self._outputs[entry]
        try:
            with leases:
                async for lease in leases:
                    try:
                        frames = lease.numpy()[entry]
                        with self._span(f"encode[{entry}]"):
                            data = await anyio.to_thread.run_sync(encoder.encode, frames, limiter=limiter)
                        del frames
                    finally:
                        # Nothing reads the slot once encode() returned: rgb24 was converted into a
                        # frame PyAV owns, and yuv420p frames wrap the slot only for encoders that copy
                        # the picture inside encode() (x264, x265; EntryEncoder copies for others).
                        lease.release()
                    await output.write(data)
                with self._span(f"encode[{entry}]"):
                    data = await anyio.to_thread.run_sync(encoder.finish, limiter=limiter)
                await output.write(data)
                output.complete()
        except Exception as error:
            # Record it before the cleanup below yields: neighbours ending meanwhile must find it.
            self._abort(error)
            raise
        finally:
            output.close()
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(encoder.close, limiter=limiter)

    @contextmanager
    def _span(self, stage: str) -> Iterator[None]:
        if self.timeline is None:
            yield
            return
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timeline.append(StageSpan(stage, start, time.perf_counter()))

    # -- failure --

    def _abort(self, error: BaseException | None) -> None:
        """Record ``error`` (if it is new) and stop every stage."""
        if error is not None and not any(error is seen for seen in self._errors):
            self._errors.append(error)
        if self._stages_scope is not None:
            self._stages_scope.cancel()
        if self.ring is not None:
            self.ring.abort(self._errors[0] if self._errors else None)
        if self._chunks_send is not None:
            self._chunks_send.close()
        else:
            # No stage ever started, so no encoder will end the streams: end them here, or their
            # readers (stream_mp4's, when the decode fails before its first chunk) would wait forever.
            for stream in self._streams.values():
                stream._send.close()
        self._notify_readers()

    def _raise_if_failed(self) -> None:
        if self._errors:
            self._raise_errors()

    def _raise_errors(self) -> None:
        self._error_delivered = True
        errors = self._errors
        # Entries that fail the same way (a bad codec option reaches every encoder) are one failure.
        distinct = {(type(e), str(e)) for e in errors}
        if len(distinct) == 1:
            raise errors[0]
        raise BaseExceptionGroup("several stages of the streamvae session failed", errors)


def _check_int(name: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


async def read_entries(streams: Sequence[MP4ByteStream]) -> AsyncIterator[tuple[int, bytes]]:
    """Every entry's MP4 bytes as ``(entry, data)``, in the order they are written, until all are complete.

    The way to read several entries from one task: ``async for entry, data in read_entries(streams)``. The
    entries share one pipeline, so reading one to its end before the next would stop it once the unread
    entry's buffer fills (the session then fails with :class:`UnreadStreamError`); this takes whatever
    any entry has. Raises the session's error if it failed, like iterating a stream does; while it runs,
    the streams are its own (another reader gets ``anyio.BusyResourceError``).
    """
    streams = list(streams)
    if not streams or not all(isinstance(stream, MP4ByteStream) for stream in streams):
        raise TypeError("read_entries() takes a non-empty sequence of MP4ByteStream (from stream_mp4)")
    session = streams[0]._session
    if any(stream._session is not session for stream in streams):
        raise ValueError("read_entries() takes the streams of one session")
    with contextlib.ExitStack() as claims:
        for stream in streams:
            claims.enter_context(stream._claim())
        pending = streams
        while pending:
            arrived = session._bytes_arrived  # taken before looking, so no wake-up falls in between
            taken = False
            for stream in list(pending):
                try:
                    data = stream._receive.receive_nowait()
                except anyio.WouldBlock:
                    continue
                except (anyio.EndOfStream, anyio.ClosedResourceError):
                    stream._raise_end()
                    pending.remove(stream)
                else:
                    yield stream.entry, data
                taken = True
            if not taken:
                await arrived.wait()
