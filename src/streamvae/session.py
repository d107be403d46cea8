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

import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
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

from streamvae.encode import EntryEncoder, OutputKind, PixelFormat, as_fps, check_waveform
from streamvae.quantize import check_chunk, check_value_range, quantize_chunk, quantize_chunk_yuv420
from streamvae.transfer import ChunkLease, ChunkTransferStats, PinnedChunkRing, host_lease

__all__ = ["ChunkedVideoMP4Session", "MP4ByteStream", "SessionClosedError", "StageSpan"]

_CLOSED = (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream)


class SessionClosedError(RuntimeError):
    """The session no longer accepts chunks (finished, aborted, or not entered)."""


@dataclass
class _Prepared:
    """A group of quantized frames on the chunk's device, ready to copy."""

    frames: Tensor  # [B, t, ...] uint8, contiguous
    ready: Any  # torch.cuda.Event recorded after quantizing, or None


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

    def __aiter__(self) -> MP4ByteStream:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self._receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            if self.completed:
                raise StopAsyncIteration from None
            self._session._raise_if_failed()
            raise SessionClosedError(
                f"the session was aborted before entry {self.entry}'s MP4 was complete"
            ) from None

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

    def complete(self) -> None:
        """Every byte of the entry's MP4 has been written."""
        if self.stream is not None:
            self.stream.completed = True

    def close(self) -> None:
        if self.stream is not None:
            self.stream._send.close()

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
    - ``output_files``: one path per batch entry to also write each MP4 to.
    - ``queue_depth``: items each inter-stage stream holds before its sender waits.
    - ``record_timeline``: keep a :class:`StageSpan` per piece of stage work in :attr:`timeline`.
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
        if not isinstance(video_codec, str) or not video_codec:
            raise ValueError(f"video_codec must be an FFmpeg encoder name, got {video_codec!r}")
        if video_codec_options is not None and not (
            isinstance(video_codec_options, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in video_codec_options.items())
        ):
            raise ValueError(
                "video_codec_options must be a dict of FFmpeg option strings, e.g. "
                f"{{'crf': '18', 'preset': 'veryfast'}}, got {video_codec_options!r}"
            )
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
            output_files = [Path(p) for p in output_files]
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
        ``finish`` returns ``b""`` for a streamed entry: its bytes went to the stream.
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
        if frames == 0 or batch == 0:
            raise ValueError(f"chunk must hold at least one frame of one entry, got shape {(batch, frames)}")
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
        if self.requested_pixel_format == "auto":
            self.pixel_format = "yuv420p" if first.is_cuda else "rgb24"
        else:
            self.pixel_format = self.requested_pixel_format
        if self.transfer_slots > 0:
            self.ring = PinnedChunkRing(self.transfer_slots, first.device)
        for entry in range(batch):
            self._encoders.append(
                EntryEncoder(
                    fps=self.fps,
                    pixel_format=self.pixel_format,
                    video_codec=self.video_codec,
                    video_codec_options=self.video_codec_options,
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
            "encode": anyio.CapacityLimiter(len(self._encoders)),
        }
        try:
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
        finally:
            if self.ring is not None:
                self.ring.abort(self._errors[0] if self._errors else None)
            self._stages_done.set()

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
        carry: Tensor | None = None  # quantized frames short of a full group
        with chunks, prepared:
            async for chunk, ready in chunks:
                with self._span("prepare"):
                    groups, carry = await anyio.to_thread.run_sync(
                        self._quantize_groups, chunk, ready, carry, limiter=limiter
                    )
                del chunk
                for group in groups:
                    await prepared.send(group)
            if carry is not None:
                await prepared.send(_Prepared(carry, self._ready_after(carry)))

    def _quantize_groups(
        self, chunk: Tensor, ready: Any, carry: Tensor | None
    ) -> tuple[list[_Prepared], Tensor | None]:
        """Worker thread: crop, quantize and regroup one chunk into ``batch_frames``-frame groups."""
        if ready is not None:
            stream = torch.cuda.current_stream(chunk.device)
            stream.wait_event(ready)
            # The chunk was allocated on the producer's stream: keep its memory until this stream is done.
            chunk.record_stream(stream)
        if self.crop is not None:
            chunk = chunk[..., : self.crop[0], : self.crop[1]]
        quantize = quantize_chunk_yuv420 if self.pixel_format == "yuv420p" else quantize_chunk
        with torch.no_grad():
            frames = quantize(chunk, self.value_range)
            if carry is not None:
                frames = torch.cat([carry, frames], dim=1)
            step = self.batch_frames
            whole = frames.shape[1] // step * step
            groups = [frames[:, i : i + step].contiguous() for i in range(0, whole, step)]
            rest = frames[:, whole:].contiguous() if whole < frames.shape[1] else None
        return [_Prepared(g, self._ready_after(g)) for g in groups], rest

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
                        lease = await self.ring.transfer(group.frames, readers=readers, ready=group.ready)
                    else:
                        lease = await anyio.to_thread.run_sync(
                            partial(host_lease, group.frames, readers=readers, ready=group.ready),
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
        with leases:
            try:
                async for lease in leases:
                    try:
                        with self._span("land"):
                            await lease.wait_landed()
                    except BaseException:
                        lease.discard()
                        raise
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
                        # PyAV has consumed the buffer once encode() returned (the codec copies
                        # frames that do not own their memory), so the slot may be reused.
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
