"""The stage pipeline: a chunk's way from ``push`` to an entry's MP4 bytes.

    chunks ─▶ prepare ─▶ transfer ─▶ land ─▶ encode[entry] ─▶ sink[entry]

- **prepare** (worker thread, the session's CUDA stream): crop, quantize (and colour-convert) into
  ``batch_frames``-frame groups, counting NaN on the device.
- **transfer**: copy each group into a slot of the host ring (non-blocking on CUDA), or plainly.
- **land**: await the copy (an abandonable poll), read the NaN count that travelled with it, hand the
  slot to every entry's encoder.
- **encode[entry]** (worker thread): PyAV encodes the entry's frames; its bytes go to the entry's sink;
  the entry releases its reader of the slot. Fragmented output is handed on after a group's first frame
  too: that frame's packet closes the fragment holding the previous group, which leaves at once.

Each stage is a task of one task group, joined to the next by a bounded memory-object stream, so a slow
encoder backs up into the ring and finally into ``push``, never into unbounded memory. Work runs in worker
threads under limiters owned by role — never anyio's default limiter, which an ASGI server shares with
its own thread pool. Every stage closes its streams when it ends, so its neighbours end too.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import anyio
import anyio.abc
import torch
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from torch import Tensor

from streamvae._encode import EntryEncoder, PixelFormat, open_entry_encoders
from streamvae._errors import RingAbortedError
from streamvae._options import SessionOptions
from streamvae._quantize import ChunkQuantizer
from streamvae._sinks import EntrySink, MP4ByteStream, watch_readers
from streamvae._statistics import LatencyRecorder
from streamvae._transfer import ChunkLease, PinnedChunkRing, host_lease

__all__ = ["StagePipeline", "StageSpan"]

_CLOSED = (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream)


@dataclass(frozen=True)
class StageSpan:
    """One piece of work of a stage, in ``time.perf_counter()`` seconds (``record_timeline=True``)."""

    #: "prepare", "transfer", "land" or "encode[<entry>]"
    stage: str
    start: float
    end: float


@dataclass
class _Prepared:
    """A group of quantized frames on the chunk's device, ready to copy once full."""

    frames: Tensor  # [B, t, ...] uint8, contiguous; filled from the front
    nan_count: Tensor | None  # NaN values quantized into it, on the device (None with nonfinite="ignore")
    filled: int = 0  # frames quantized into it so far
    ready: Any = None  # torch.cuda.Event recorded after its last frame was quantized, or None


class StagePipeline:
    """The stages of one session, settled from its first chunk.

    ``fail`` is called with the first real error of any stage; it must stop the pipeline (:meth:`cancel`)
    and the ring. :attr:`done` is set once every stage has ended.
    """

    def __init__(
        self,
        options: SessionOptions,
        *,
        pixel_format: PixelFormat,
        device: torch.device,
        ring: PinnedChunkRing | None,
        encoders: list[EntryEncoder],
        sinks: list[EntrySink],
        streams: dict[int, MP4ByteStream],
        timeline: list[StageSpan] | None,
        latency: LatencyRecorder,
        fail: Callable[[BaseException], None],
    ) -> None:
        self.options = options
        self.pixel_format = pixel_format
        self.ring = ring
        self.encoders = encoders
        self.sinks = sinks
        self.streams = streams
        self.timeline = timeline
        self.latency = latency
        self.done = anyio.Event()
        self._fail = fail
        self._scope: anyio.CancelScope | None = None
        self._chunk_starts: deque[tuple[int, int]] = deque()  # (index, first frame) of chunks in flight
        # Every quantize call runs on this one stream, whichever worker thread runs it: each group's ready
        # event is recorded where its frames were written (never on a caller's stream).
        self._quantize_stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def cancel(self) -> None:
        """Stop every stage (their cleanup still runs)."""
        if self._scope is not None:
            self._scope.cancel()

    async def run(
        self,
        chunks: MemoryObjectReceiveStream[tuple[Tensor, Any]],
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run every stage until the chunks end (or a failure); never raises."""
        depth = self.options.queue_depth
        prepared_send, prepared_receive = anyio.create_memory_object_stream[_Prepared](depth)
        leases_send, leases_receive = anyio.create_memory_object_stream[ChunkLease](depth)
        entry_queues = [anyio.create_memory_object_stream[ChunkLease](depth) for _ in self.encoders]
        budget = self.options.encode_limiter
        encode = budget if budget is not None else anyio.CapacityLimiter(len(self.encoders))
        try:
            async with anyio.create_task_group() as watch:
                if len(self.streams) > 1:
                    queues = [receive for _, receive in entry_queues]
                    watch.start_soon(watch_readers, self.streams, queues, self._fail)
                async with anyio.create_task_group() as stages:
                    self._scope = stages.cancel_scope

                    def start(*args: Any) -> None:
                        stages.start_soon(self._stage, *args)

                    start(self._prepare, chunks, prepared_send, anyio.CapacityLimiter(1))
                    start(self._transfer, prepared_receive, leases_send, anyio.CapacityLimiter(1))
                    start(self._land, leases_receive, [send for send, _ in entry_queues], encode)
                    for entry, (_, receive) in enumerate(entry_queues):
                        start(self._encode, entry, receive, encode)
                    task_status.started()
                watch.cancel_scope.cancel()  # every stage has ended
        finally:
            self.done.set()

    async def _stage(self, stage: Callable[..., Any], *args: Any) -> None:
        """Run one stage; its first real error fails the session instead of cancelling the caller."""
        try:
            await stage(*args)
        except (*_CLOSED, RingAbortedError):
            # A neighbouring stage ended first, or the session is being left without an error (the ring
            # aborted without one): whatever made it end is recorded there, or is no failure at all.
            pass
        except Exception as error:
            self._fail(error)

    # -- prepare --

    async def _prepare(
        self,
        chunks: MemoryObjectReceiveStream[tuple[Tensor, Any]],
        prepared: MemoryObjectSendStream[_Prepared],
        limiter: anyio.CapacityLimiter,
    ) -> None:
        # One quantizer and its scratch for the whole stream: no chunk-sized temporaries per chunk.
        quantizer = ChunkQuantizer(self.options.value_range, self.pixel_format)
        partial_group: _Prepared | None = None  # a group short of batch_frames frames
        index = first = 0
        with chunks, prepared:
            async for chunk, ready in chunks:
                if self.options.nonfinite == "error":
                    self._chunk_starts.append((index, first))
                index, first = index + 1, first + chunk.shape[2]
                with self._span("prepare"):
                    groups, partial_group = await anyio.to_thread.run_sync(
                        self._quantize_groups, quantizer, chunk, ready, partial_group, limiter=limiter
                    )
                del chunk
                for group in groups:
                    await prepared.send(group)
            if partial_group is not None:
                last = await anyio.to_thread.run_sync(self._last_group, partial_group, limiter=limiter)
                await prepared.send(last)

    def _quantize_groups(
        self, quantizer: ChunkQuantizer, chunk: Tensor, ready: Any, partial_group: _Prepared | None
    ) -> tuple[list[_Prepared], _Prepared | None]:
        """Worker thread: crop one chunk and quantize it straight into ``batch_frames``-frame groups.

        Returns the full groups and the group still short of frames (filled further by the next chunk).
        """
        with self._on_quantize_stream():
            if ready is not None:
                stream = torch.cuda.current_stream(chunk.device)
                stream.wait_event(ready)
                # The chunk was allocated on the producer's stream: keep its memory until this one is done.
                chunk.record_stream(stream)
            crop = self.options.crop
            if crop is not None:
                chunk = chunk[..., : crop[0], : crop[1]]
            groups: list[_Prepared] = []
            start, frames = 0, chunk.shape[2]
            while start < frames:
                group = partial_group if partial_group is not None else self._new_group(quantizer, chunk)
                take = min(frames - start, self.options.batch_frames - group.filled)
                quantizer.quantize_into(
                    chunk[:, :, start : start + take],
                    group.frames[:, group.filled : group.filled + take],
                    group.nan_count,
                )
                group.filled += take
                start += take
                partial_group = group
                if group.filled == self.options.batch_frames:
                    group.ready = _ready_after(group.frames)
                    groups.append(group)
                    partial_group = None
            return groups, partial_group

    def _new_group(self, quantizer: ChunkQuantizer, chunk: Tensor) -> _Prepared:
        # A fresh buffer per group, not a pool: the ring's copy, or (transfer_slots=0) the encoders, may
        # still read the last one.
        batch, _, _, height, width = chunk.shape
        shape = (batch, self.options.batch_frames, *quantizer.frame_shape(height, width))
        counting = self.options.nonfinite == "error"
        return _Prepared(
            torch.empty(shape, dtype=torch.uint8, device=chunk.device),
            torch.zeros((), dtype=torch.int64, device=chunk.device) if counting else None,
        )

    def _last_group(self, group: _Prepared) -> _Prepared:
        """Worker thread: the stream's last group, short of ``batch_frames`` frames, made contiguous."""
        with self._on_quantize_stream():
            group.frames = group.frames[:, : group.filled].contiguous()
            group.ready = _ready_after(group.frames)
        return group

    def _on_quantize_stream(self) -> contextlib.AbstractContextManager[Any]:
        if self._quantize_stream is None:
            return contextlib.nullcontext()
        return torch.cuda.stream(self._quantize_stream)

    # -- transfer and land --

    async def _transfer(
        self,
        prepared: MemoryObjectReceiveStream[_Prepared],
        leases: MemoryObjectSendStream[ChunkLease],
        limiter: anyio.CapacityLimiter,
    ) -> None:
        readers = len(self.encoders)
        with prepared, leases:
            async for group in prepared:
                with self._span("transfer"):
                    copy = {"readers": readers, "ready": group.ready, "extra": group.nan_count}
                    if self.ring is not None:
                        lease = await self.ring.transfer(group.frames, **copy)
                    else:
                        lease = await anyio.to_thread.run_sync(
                            partial(host_lease, group.frames, **copy), limiter=limiter
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
        limiter: anyio.CapacityLimiter,
    ) -> None:
        landed = 0  # frames (per entry) landed before this lease's
        with leases:
            try:
                async for lease in leases:
                    try:
                        with self._span("land"):
                            await lease.wait_landed()
                        self._check_no_nan(lease, landed)
                        if not landed:  # every entry's encoder opens here, all with one codec
                            shape = lease.shape[2:]
                            await anyio.to_thread.run_sync(
                                open_entry_encoders, self.encoders, shape, limiter=limiter
                            )
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

    # -- encode --

    async def _encode(
        self,
        entry: int,
        leases: MemoryObjectReceiveStream[ChunkLease],
        limiter: anyio.CapacityLimiter,
    ) -> None:
        encoder, sink = self.encoders[entry], self.sinks[entry]

        async def encode(frames: Any) -> bytes:
            with self._span(f"encode[{entry}]"):
                return await anyio.to_thread.run_sync(encoder.encode, frames, limiter=limiter)

        try:
            with leases:
                async for lease in leases:
                    try:
                        frames = lease.numpy()[entry]
                        held = b""
                        if self.options.output == "fragmented" and len(frames) > 1:
                            # The first frame's packet closes the previous group's fragment: hand it on
                            # before the rest, unless that would wait (never wait while holding the slot).
                            held = await encode(frames[:1])
                            if sink.offer(held):
                                self.latency.handed_on(entry, encoder.frames_out)
                                held = b""
                            frames = frames[1:]
                        data = held + await encode(frames)
                        del frames
                    finally:
                        # Nothing reads the slot once encode() returned: rgb24 was converted into a
                        # frame PyAV owns, and yuv420p frames wrap the slot only for encoders that copy
                        # the picture inside encode() (x264, x265; EntryEncoder copies for others).
                        lease.release()
                    await self._hand_on(entry, data)
                with self._span(f"encode[{entry}]"):
                    data = await anyio.to_thread.run_sync(encoder.finish, limiter=limiter)
                await self._hand_on(entry, data)
                sink.complete()
        except Exception as error:
            # Record it before the cleanup below yields: neighbours ending meanwhile must find it.
            self._fail(error)
            raise
        finally:
            sink.close()
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(encoder.close, limiter=limiter)

    async def _hand_on(self, entry: int, data: bytes) -> None:
        """Give ``data`` to the entry's sink and record the frames it holds as out (the latency numbers)."""
        frames_out = self.encoders[entry].frames_out  # what ``data`` and the bytes before it hold
        await self.sinks[entry].write(data)
        self.latency.handed_on(entry, frames_out)

    @contextlib.contextmanager
    def _span(self, stage: str) -> Iterator[None]:
        if self.timeline is None:
            yield
            return
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timeline.append(StageSpan(stage, start, time.perf_counter()))


def _ready_after(frames: Tensor) -> Any:
    """A CUDA event after the work queued so far on the current stream (None for CPU frames)."""
    if not frames.is_cuda:
        return None
    ready = torch.cuda.Event()
    ready.record(torch.cuda.current_stream(frames.device))
    return ready
