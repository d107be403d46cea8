"""The stage pipeline: a chunk's way from ``push`` to an entry's MP4 bytes.

    chunks ─▶ prepare ─▶ transfer ─▶ land ─▶ encode[entry] ─▶ sink[entry]

- **prepare** (worker thread, the pipeline's CUDA stream): crop, the user's ``chunk_transform`` (a
  watermark), quantize (and colour-convert) into ``batch_frames``-frame groups, counting NaN on the
  device.
- **transfer**: copy each group into a slot of the host ring (non-blocking on CUDA), or plainly.
- **land**: await the copy (an abandonable poll), read the NaN count that travelled with it, hand the
  slot to every entry's encoder.
- **encode[entry]** (the entry encoder's own thread, a wait a cancel leaves): PyAV encodes the entry's
  frames (and its live audio up to them); its output, cut into whole fragments that know their frames
  (:class:`~streamvae.MP4Piece`), goes to the entry's sink; the entry releases its reader of the slot.
  Fragmented output is handed on after a group's first frame too: that frame's packet closes the
  fragment holding the previous group, which leaves at once.

Each stage is a task of one task group, joined to the next by a bounded memory-object stream, so a slow
encoder backs up into the ring and finally into ``push``, never into unbounded memory. Work runs in worker
threads under limiters owned by role — never anyio's default limiter, which an ASGI server shares with
its own thread pool. Every stage closes its memory-object streams when it ends, so its neighbours end too.

The session is the rung above: it builds a pipeline from its first chunk, sends it chunks, ends its input
at ``finish``, aborts it, and reads what it exposes (its ring, its encoders' counters, the videos). The
pipeline builds and owns what it runs — the ring, the encoders, the sinks, the memory-object streams
between stages — and cleans them up; nothing here calls back up into the session. A stage's error is
written into the session's :class:`FailureRecord` (handed down, like the entries' byte streams) at the
moment it happens, so a reader whose stream ends with it finds it, and then the pipeline stops itself.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import anyio
import anyio.abc
import torch
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from torch import Tensor

from streamvae._cuda import ready_event
from streamvae._encode import EntryEncoder, end_workers, open_entry_encoders
from streamvae._errors import STREAM_ENDED, RingAbortedError
from streamvae._failure import FailureRecord
from streamvae._fragments import MP4Piece
from streamvae._live_audio import LiveAudioTrack
from streamvae._options import SessionOptions
from streamvae._public import public
from streamvae._quantize import ChunkQuantizer, PixelFormat
from streamvae._sinks import EntrySink, MP4ByteStream, watch_readers
from streamvae._statistics import LatencyRecorder
from streamvae._transfer import ChunkLease, PinnedChunkRing, host_lease

__all__ = ["StagePipeline", "StageSpan"]


def _transformed(transform: Callable[[Tensor], Tensor], chunk: Tensor) -> Tensor:
    """Worker thread: ``chunk_transform``'s output for ``chunk``, checked to be what can be quantized in
    its place — a TypeError for what is not a tensor, a ValueError for a tensor of another shape, device
    or dtype (its own exception goes up as it is: the session's first cause)."""
    with torch.no_grad():
        out = transform(chunk)
    if not isinstance(out, Tensor):
        raise TypeError(
            f"chunk_transform must return a tensor of the chunk's shape {tuple(chunk.shape)}, "
            f"got {type(out).__name__}"
        )
    if out.shape != chunk.shape or out.device != chunk.device or not out.is_floating_point():
        raise ValueError(
            f"chunk_transform must return a float tensor of the chunk's shape {tuple(chunk.shape)} on "
            f"{chunk.device}, got {out.dtype} {tuple(out.shape)} on {out.device}"
        )
    return out


@public
@dataclass(frozen=True)
class StageSpan:
    """One piece of work of a stage, in ``time.perf_counter()`` seconds (``record_timeline=True``)."""

    #: "prepare", "transfer", "land" or "encode[<entry>]"
    stage: str
    start: float
    end: float


@dataclass
class _QuantizedGroup:
    """A transfer group: ``batch_frames`` quantized frames on the chunk's device, copied once full."""

    frames: Tensor  # [B, t, ...] uint8, contiguous; filled from the front
    nan_count: Tensor | None  # NaN values quantized into it, on the device (None with nonfinite="ignore")
    filled: int = 0  # frames quantized into it so far
    ready: Any = None  # torch.cuda.Event recorded after its last frame was quantized, or None


class StagePipeline:
    """The stages of one session, built from its first chunk: its pixel path, ring, encoders and sinks.

    ``streams`` are the entries' byte streams opened before the first chunk (the others keep their bytes
    for :meth:`videos`); ``live_audio`` the entries' live audio tracks (``audio_channels``), one per
    entry; ``failure`` is the session's record, where each stage writes its first real error. Run it
    with :meth:`run` in a task group, feed it with :meth:`send`, end its input with :meth:`end_input` (it
    then finishes every MP4) or stop it with :meth:`abort`. :attr:`done` is set once every stage has
    ended and the ring has let go of its slots.
    """

    def __init__(
        self,
        options: SessionOptions,
        first: Tensor,
        *,
        streams: Mapping[int, MP4ByteStream],
        failure: FailureRecord,
        latency: LatencyRecorder,
        timeline: list[StageSpan] | None,
        live_audio: Sequence[LiveAudioTrack] | None = None,
    ) -> None:
        batch, _, _, _, _ = first.shape
        auto: PixelFormat = "yuv420p" if first.is_cuda else "rgb24"
        #: the pixel path: ``options.pixel_format``, with "auto" settled by the first chunk's device
        self.pixel_format: PixelFormat = auto if options.pixel_format == "auto" else options.pixel_format
        #: the ring of host slots (None with ``transfer_slots=0``: a plain blocking copy per group)
        self.ring = PinnedChunkRing(options.transfer_slots, first.device) if options.transfer_slots else None
        #: one encoder per batch entry, opened when the first group lands
        self.encoders = [self._entry_encoder(options, entry, live_audio) for entry in range(batch)]
        self.done = anyio.Event()
        self._options = options
        self._sinks = [EntrySink(entry, streams.get(entry)) for entry in range(batch)]
        self._streams = dict(streams)
        self._failure = failure
        self._latency = latency
        latency.started(batch)  # one latency slot per entry, before any encoder hands bytes on
        self._timeline = timeline
        self._scope = anyio.CancelScope()
        self._chunks_send, self._chunks = anyio.create_memory_object_stream[tuple[Tensor, Any]](
            options.queue_depth
        )
        self._chunk_starts: deque[tuple[int, int]] = deque()  # (index, first frame) of chunks in flight
        # Every quantize call runs on this one CUDA stream, whichever worker thread runs it: each group's
        # ready event is recorded where its frames were written (never on a caller's stream).
        self._quantize_stream = torch.cuda.Stream(first.device) if first.is_cuda else None

    def _entry_encoder(
        self, options: SessionOptions, entry: int, live_audio: Sequence[LiveAudioTrack] | None
    ) -> EntryEncoder:
        waveforms, files = options.audio_waveforms, options.output_files
        return EntryEncoder(
            fps=options.fps,
            pixel_format=self.pixel_format,
            video_codec=options.video_codec,
            video_codec_options=options.encoder_codec_options(),
            audio=None if waveforms is None else waveforms[entry],
            audio_sample_rate=options.audio_sample_rate,
            live_audio=None if live_audio is None else live_audio[entry],
            output=options.output,
            keyframe_interval=options.keyframe_interval,
            fragment_frames=options.frames_per_fragment(),
            file=None if files is None else files[entry],
            provenance=options.provenance,
        )

    # -- what the session reads --

    @property
    def frames_encoded(self) -> int:
        """Frames every entry's encoder has taken so far."""
        return min((encoder.frames_encoded for encoder in self.encoders), default=0)

    @property
    def bytes_out(self) -> int:
        """MP4 bytes produced so far, all entries together."""
        return sum(encoder.bytes_out for encoder in self.encoders)

    @property
    def encoder_name(self) -> str | None:
        """The video encoder every entry opened (what ``video_codec="auto"`` chose), or None before."""
        return self.encoders[0].encoder_name

    def videos(self) -> list[bytes]:
        """Each entry's MP4, once the pipeline is done (``b""`` for an entry read through its stream)."""
        return [sink.getvalue() for sink in self._sinks]

    # -- what the session calls --

    async def send(self, chunk: Tensor, ready: Any) -> None:
        """Queue ``chunk`` (its CUDA ``ready`` event, or None) for the stages; waits while they are full.

        Raises ``anyio.ClosedResourceError`` / ``BrokenResourceError`` once the pipeline has stopped.
        """
        await self._chunks_send.send((chunk, ready))

    async def end_input(self) -> None:
        """No more chunks: the stages finish what they hold and every MP4, then :attr:`done` is set."""
        await self._chunks_send.aclose()

    def abort(self) -> None:
        """Stop every stage now (their cleanup still runs) and the ring, with the first recorded error."""
        self._scope.cancel()
        self._chunks_send.close()
        if self.ring is not None:
            self.ring.abort(self._failure.first)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run every stage until the chunks end (or a failure, or :meth:`abort`); never raises."""
        depth = self._options.queue_depth
        groups_send, groups_receive = anyio.create_memory_object_stream[_QuantizedGroup](depth)
        leases_send, leases_receive = anyio.create_memory_object_stream[ChunkLease](depth)
        entry_queues = [anyio.create_memory_object_stream[ChunkLease](depth) for _ in self.encoders]
        entry_sends = [send for send, _ in entry_queues]
        budget = self._options.encode_limiter
        encode = budget if budget is not None else anyio.CapacityLimiter(len(self.encoders))
        try:
            with self._scope:
                async with anyio.create_task_group() as watch:
                    if len(self._streams) > 1:
                        queues = [receive for _, receive in entry_queues]
                        watch.start_soon(watch_readers, self._streams, queues, self._stage_failed)
                    async with anyio.create_task_group() as stages:
                        stage = self._stage
                        stages.start_soon(
                            stage, self._prepare, self._chunks, groups_send, anyio.CapacityLimiter(1)
                        )
                        stages.start_soon(
                            stage, self._transfer, groups_receive, leases_send, anyio.CapacityLimiter(1)
                        )
                        stages.start_soon(stage, self._land, leases_receive, entry_sends, encode)
                        for entry, (_, receive) in enumerate(entry_queues):
                            stages.start_soon(stage, self._encode, entry, receive, encode)
                        task_status.started()
                    watch.cancel_scope.cancel()  # every stage has ended
        finally:
            self._chunks_send.close()
            if self.ring is not None:
                # Slots still copying come back once their copy lands; nothing waits for a slot again.
                self.ring.abort(self._failure.first)
            try:
                await end_workers(self.encoders)  # calls a cancel left release their containers
            finally:
                self.done.set()

    async def _stage(self, stage: Callable[..., Any], *args: Any) -> None:
        """Run one stage; its first real error is recorded and stops the pipeline."""
        try:
            await stage(*args)
        except (*STREAM_ENDED, RingAbortedError):
            # A neighbouring stage ended first, or the session is being left without an error (the ring
            # aborted without one): whatever made it end is recorded there, or is no failure at all.
            pass
        except Exception as error:
            self._stage_failed(error)

    def _stage_failed(self, error: BaseException) -> None:
        self._failure.record(error)
        self.abort()

    # -- prepare --

    async def _prepare(
        self,
        chunks: MemoryObjectReceiveStream[tuple[Tensor, Any]],
        groups_out: MemoryObjectSendStream[_QuantizedGroup],
        limiter: anyio.CapacityLimiter,
    ) -> None:
        # One quantizer and its scratch for the whole stream: no chunk-sized temporaries per chunk.
        quantizer = ChunkQuantizer(self._options.value_range, self.pixel_format)
        partial_group: _QuantizedGroup | None = None  # a group short of batch_frames frames
        index = first = 0
        with chunks, groups_out:
            async for chunk, ready in chunks:
                if self._options.nonfinite == "error":
                    self._chunk_starts.append((index, first))
                index += 1
                first += chunk.shape[2]
                with self._span("prepare"):
                    groups, partial_group = await anyio.to_thread.run_sync(
                        self._quantize_groups, quantizer, chunk, ready, partial_group, limiter=limiter
                    )
                del chunk
                for group in groups:
                    await groups_out.send(group)
            if partial_group is not None:
                last = await anyio.to_thread.run_sync(self._last_group, partial_group, limiter=limiter)
                await groups_out.send(last)

    def _quantize_groups(
        self, quantizer: ChunkQuantizer, chunk: Tensor, ready: Any, partial_group: _QuantizedGroup | None
    ) -> tuple[list[_QuantizedGroup], _QuantizedGroup | None]:
        """Worker thread: crop one chunk and quantize it straight into ``batch_frames``-frame groups.

        Returns the full groups and the group still short of frames (filled further by the next chunk).
        """
        with self._on_quantize_stream():
            if ready is not None:
                stream = torch.cuda.current_stream(chunk.device)
                stream.wait_event(ready)
                # The chunk was allocated on the producer's stream: keep its memory until this one is done.
                chunk.record_stream(stream)
            crop = self._options.crop
            if crop is not None:
                chunk = chunk[..., : crop[0], : crop[1]]
            if self._options.chunk_transform is not None:
                chunk = _transformed(self._options.chunk_transform, chunk)
            groups: list[_QuantizedGroup] = []
            start, frames = 0, chunk.shape[2]
            while start < frames:
                group = partial_group if partial_group is not None else self._new_group(quantizer, chunk)
                take = min(frames - start, self._options.batch_frames - group.filled)
                quantizer.quantize_into(
                    chunk[:, :, start : start + take],
                    group.frames[:, group.filled : group.filled + take],
                    group.nan_count,
                )
                group.filled += take
                start += take
                partial_group = group
                if group.filled == self._options.batch_frames:
                    group.ready = ready_event(group.frames.device)
                    groups.append(group)
                    partial_group = None
            return groups, partial_group

    def _new_group(self, quantizer: ChunkQuantizer, chunk: Tensor) -> _QuantizedGroup:
        # A fresh buffer per group, not a pool: the ring's copy, or (transfer_slots=0) the encoders, may
        # still read the last one.
        batch, _, _, height, width = chunk.shape
        shape = (batch, self._options.batch_frames, *quantizer.frame_shape(height, width))
        counting = self._options.nonfinite == "error"
        return _QuantizedGroup(
            torch.empty(shape, dtype=torch.uint8, device=chunk.device),
            torch.zeros((), dtype=torch.int64, device=chunk.device) if counting else None,
        )

    def _last_group(self, group: _QuantizedGroup) -> _QuantizedGroup:
        """Worker thread: the stream's last group, short of ``batch_frames`` frames, made contiguous."""
        with self._on_quantize_stream():
            group.frames = group.frames[:, : group.filled].contiguous()
            group.ready = ready_event(group.frames.device)
        return group

    def _on_quantize_stream(self) -> contextlib.AbstractContextManager[Any]:
        if self._quantize_stream is None:
            return contextlib.nullcontext()
        return torch.cuda.stream(self._quantize_stream)

    # -- transfer and land --

    async def _transfer(
        self,
        groups: MemoryObjectReceiveStream[_QuantizedGroup],
        leases: MemoryObjectSendStream[ChunkLease],
        limiter: anyio.CapacityLimiter,
    ) -> None:
        readers = len(self.encoders)
        with groups, leases:
            async for group in groups:
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
        encoder, sink = self.encoders[entry], self._sinks[entry]

        async def encode(frames: Any) -> list[MP4Piece]:
            with self._span(f"encode[{entry}]"):
                return await encoder.worker.run(encoder.encode, frames, limiter=limiter)

        try:
            with leases:
                async for lease in leases:
                    try:
                        frames = lease.numpy()[entry]
                        held: list[MP4Piece] = []
                        if self._options.output == "fragmented" and len(frames) > 1:
                            # The first frame's packet closes the previous group's fragment: hand it on
                            # before the rest, unless that would wait (never wait while holding the slot).
                            held = self._offer(entry, await encode(frames[:1]))
                            frames = frames[1:]
                        pieces = held + await encode(frames)
                        del frames
                    finally:
                        # Nothing reads the slot once encode() returned: rgb24 was converted into a
                        # frame PyAV owns, and yuv420p frames wrap the slot only for encoders that copy
                        # the picture inside encode() (x264, x265; EntryEncoder copies for others).
                        lease.release()
                    await self._hand_on(entry, pieces)
                with self._span(f"encode[{entry}]"):
                    pieces = await encoder.worker.run(encoder.finish, limiter=limiter)
                provenance, what = self._options.provenance, f"entry {entry}'s MP4"
                if provenance is not None and self._options.output == "mp4":
                    # A plain MP4 is one piece, complete: signed before it is handed on, streamed or kept.
                    (piece,) = pieces
                    with self._span(f"encode[{entry}]"):
                        data = await anyio.to_thread.run_sync(
                            partial(provenance.sign, piece.data, what=what),
                            limiter=limiter,
                            abandon_on_cancel=True,  # a hung KMS must not hold a cancelled session
                        )
                    pieces = [replace(piece, data=data)]
                await self._hand_on(entry, pieces)
                if provenance is not None and self._options.output != "mp4" and sink.stream is None:
                    # The kept fragmented MP4 is complete: signed whole (a streamed one left marked).
                    with self._span(f"encode[{entry}]"):
                        signed = await anyio.to_thread.run_sync(
                            partial(provenance.sign, sink.getvalue(), what=what),
                            limiter=limiter,
                            abandon_on_cancel=True,  # a hung KMS must not hold a cancelled session
                        )
                    sink.parts[:] = [signed]
                sink.complete()
        except Exception as error:
            # Record it before the cleanup below yields: neighbours ending meanwhile must find it.
            self._stage_failed(error)
            raise
        finally:
            sink.close()
            with anyio.CancelScope(shield=True):
                # Not on the encode budget: a signature abandoned on trio holds its token until the
                # signer returns, and close() waits for nothing.
                await anyio.to_thread.run_sync(encoder.close, limiter=anyio.CapacityLimiter(1))

    async def _hand_on(self, entry: int, pieces: list[MP4Piece]) -> None:
        """Give ``pieces`` to the entry's sink, each piece's frames recorded as out once it is taken (the
        latency numbers); waits while the entry's byte stream is full."""
        for piece in pieces:
            await self._sinks[entry].write(piece)
            self._latency.handed_on(entry, piece.frames_until)

    def _offer(self, entry: int, pieces: list[MP4Piece]) -> list[MP4Piece]:
        """Give the entry's sink what of ``pieces`` it takes without a wait; the rest, to hand on later."""
        for index, piece in enumerate(pieces):
            if not self._sinks[entry].offer(piece):
                return pieces[index:]
            self._latency.handed_on(entry, piece.frames_until)
        return []

    @contextlib.contextmanager
    def _span(self, stage: str) -> Iterator[None]:
        if self._timeline is None:
            yield
            return
        start = time.perf_counter()
        try:
            yield
        finally:
            self._timeline.append(StageSpan(stage, start, time.perf_counter()))
