"""The stage pipeline driven directly, the way a session drives it: built from its first chunk, run in a task
group, fed with ``send``, ended with ``end_input`` or stopped with ``abort``."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

import anyio
import av
import numpy as np
import pytest
import torch

import streamvae
from streamvae import SessionClosedError
from streamvae._failure import FailureRecord
from streamvae._pipeline import StagePipeline, StageSpan
from streamvae._sinks import Arrivals, MP4ByteStream
from streamvae._statistics import LatencyRecorder
from streamvae.testing import open_containers
from tests._media import DETERMINISTIC_X264, REFUSED_AT_OPEN, moving_pattern, psnr, read_mp4, to_rgb_uint8
from tests._spies import count_transfers

pytestmark = pytest.mark.anyio

#: what a stopped pipeline's ``send`` raises
STOPPED = (anyio.ClosedResourceError, anyio.BrokenResourceError)


def pipeline_options(**overrides: Any) -> streamvae.SessionOptions:
    keywords: dict[str, Any] = {"value_range": (-1, 1), "fps": 8, "video_codec_options": DETERMINISTIC_X264}
    return streamvae.SessionOptions(**{**keywords, **overrides})


def clip(sizes: Sequence[int], *, batch: int = 1, height: int = 32, width: int = 48) -> list[torch.Tensor]:
    """Consecutive chunks of one moving pattern, ``sizes[i]`` frames in chunk ``i``."""
    chunks, start = [], 0
    for size in sizes:
        chunks.append(moving_pattern(start, size, batch=batch, height=height, width=width))
        start += size
    return chunks


def build(
    first: torch.Tensor,
    options: streamvae.SessionOptions,
    *,
    failure: FailureRecord | None = None,
    streams: dict[int, MP4ByteStream] | None = None,
    timeline: list[StageSpan] | None = None,
) -> tuple[StagePipeline, FailureRecord]:
    """A pipeline with what a session hands it; ``failure`` is the record its streams were opened with."""
    failure = FailureRecord() if failure is None else failure
    pipeline = StagePipeline(
        options, first, streams=streams or {}, failure=failure, latency=LatencyRecorder(), timeline=timeline
    )
    return pipeline, failure


def streamed_pipeline(first: torch.Tensor) -> tuple[StagePipeline, FailureRecord, MP4ByteStream]:
    """A fragmented pipeline whose one entry goes to a byte stream holding one piece."""
    failure = FailureRecord()
    stream = MP4ByteStream(0, 1, failure, Arrivals())
    pipeline, _ = build(first, pipeline_options(output="fragmented"), failure=failure, streams={0: stream})
    return pipeline, failure, stream


async def run_to_end(pipeline: StagePipeline, chunks: Sequence[torch.Tensor]) -> list[bytes]:
    """Every chunk through the pipeline and every MP4 finished, as a session's pushes and ``finish`` do."""
    with anyio.fail_after(60):  # hang guard
        async with anyio.create_task_group() as tg:
            await tg.start(pipeline.run)
            for chunk in chunks:
                await pipeline.send(chunk, None)
            await pipeline.end_input()
            await pipeline.done.wait()
    return pipeline.videos()


async def send_until_stopped(pipeline: StagePipeline, chunks: Sequence[torch.Tensor]) -> int:
    """Send chunks until the pipeline refuses one; the number it took."""
    for taken, chunk in enumerate(chunks):
        try:
            await pipeline.send(chunk, None)
        except STOPPED:
            return taken
    return len(chunks)


async def read_all(stream: MP4ByteStream, received: list[bytes]) -> None:
    """Read the stream to its end (or its error) and close it, as its reader does."""
    try:
        async for data in stream:
            received.append(data)
    finally:
        await stream.aclose()


class StallWatch:
    """Waits until a pipeline whose only byte stream nobody reads has stopped for good: the entry's encoder
    waits on the stream's full buffer and the stages before it hold every slot of the ring.

    Install it before the pipeline runs: it wraps the ring's ``transfer`` to be woken after each one, since
    the last change before the stall is always a transfer taking the slot the encoder gave back.
    """

    def __init__(self, pipeline: StagePipeline, stream: MP4ByteStream) -> None:
        assert pipeline.ring is not None
        self._ring, self._stream = pipeline.ring, stream
        self._transferred = anyio.Event()
        transfer = self._ring.transfer

        async def signalling_transfer(frames: torch.Tensor, **kwargs: Any) -> Any:
            lease = await transfer(frames, **kwargs)
            transferred, self._transferred = self._transferred, anyio.Event()
            transferred.set()
            return lease

        self._ring.transfer = signalling_transfer  # type: ignore[method-assign]

    def stalled(self) -> bool:
        statistics = self._stream.statistics()
        return (
            statistics.current_buffer_used == statistics.max_buffer_size
            and statistics.tasks_waiting_send > 0
            and self._ring.slots_in_use == self._ring.depth
        )

    async def wait(self) -> None:
        while True:
            transferred = self._transferred  # taken before looking, so no wake-up falls in between
            await anyio.wait_all_tasks_blocked()  # the encoder has reached its wait, if it is at one
            if self.stalled():
                return
            await transferred.wait()


def assert_frames_match(decoded: np.ndarray, reference: np.ndarray) -> None:
    """Every frame comes out, in order, close to the quantized input: each decoded frame is near its own
    reference frame, and nearer to it than to the frames either side."""
    assert decoded.shape == reference.shape
    assert psnr(decoded, reference) >= 35

    def distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:  # mean levels of 255, frame by frame
        return np.asarray(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean(axis=(1, 2, 3)))

    own = distance(decoded, reference)
    assert own.max() <= 5  # neighbouring frames of the pattern differ by ~9
    assert (own[1:] < distance(decoded[1:], reference[:-1])).all()
    assert (own[:-1] < distance(decoded[:-1], reference[1:])).all()


# -- frames in, frames out --


@pytest.mark.parametrize(
    ("batch_frames", "groups"), [(1, [1] * 15), (4, [4, 4, 4, 3]), (6, [6, 6, 3]), (20, [15])]
)
async def test_uneven_chunks_are_regrouped_into_transfer_groups_and_every_frame_comes_out_in_order(
    batch_frames: int, groups: list[int]
) -> None:
    chunks = clip([1, 4, 2, 5, 3], batch=2)
    pipeline, failure = build(chunks[0], pipeline_options(batch_frames=batch_frames))
    assert pipeline.ring is not None
    transferred = count_transfers(pipeline.ring)
    videos = await run_to_end(pipeline, chunks)
    assert not failure.failed
    assert transferred == groups
    reference = to_rgb_uint8(torch.cat(chunks, dim=2))
    assert len(videos) == 2
    for entry, data in enumerate(videos):
        assert_frames_match(read_mp4(data).frames, reference[entry])


async def test_auto_pixel_format_settles_to_rgb24_for_cpu_chunks() -> None:
    chunks = clip([2, 3])
    pipeline, _ = build(chunks[0], pipeline_options(pixel_format="auto"))
    assert pipeline.pixel_format == "rgb24"
    (video,) = await run_to_end(pipeline, chunks)
    assert_frames_match(read_mp4(video).frames, to_rgb_uint8(torch.cat(chunks, dim=2))[0])


@pytest.mark.parametrize("pixel_format", ["rgb24", "yuv420p"])
async def test_a_ring_and_the_plain_copy_give_the_same_frames_in_either_pixel_format(
    pixel_format: str,
) -> None:
    chunks = clip([3, 1, 4], batch=2)
    videos: dict[int, list[bytes]] = {}
    for slots in (0, 2):
        pipeline, failure = build(
            chunks[0], pipeline_options(pixel_format=pixel_format, transfer_slots=slots)
        )
        assert pipeline.pixel_format == pixel_format
        assert (pipeline.ring is None) == (slots == 0)
        videos[slots] = await run_to_end(pipeline, chunks)
        assert not failure.failed
    assert videos[0] == videos[2]
    reference = to_rgb_uint8(torch.cat(chunks, dim=2))
    for entry, data in enumerate(videos[2]):
        assert_frames_match(read_mp4(data).frames, reference[entry])


async def test_crop_keeps_the_top_left_region() -> None:
    chunks = clip([2, 3], height=40, width=56)
    pipeline, _ = build(chunks[0], pipeline_options(crop=(32, 48)))
    (video,) = await run_to_end(pipeline, chunks)
    reference = to_rgb_uint8(torch.cat(chunks, dim=2))[0]
    frames = read_mp4(video).frames
    assert frames.shape == (5, 32, 48, 3)
    assert_frames_match(frames, reference[:, :32, :48])
    assert psnr(frames, reference[:, -32:, -48:]) < 25  # not another region of the same size


# -- NaN --


def clip_with_nan() -> list[torch.Tensor]:
    """Chunks of 2, 3 and 2 frames (frames 0–1, 2–4, 5–6), two NaN values in entry 1's frame 3."""
    chunks = clip([2, 3, 2], batch=2, height=16, width=16)
    chunks[1][1, 0, 1, 5, 2:4] = float("nan")
    return chunks


@pytest.mark.parametrize("transfer_slots", [0, 2])
@pytest.mark.parametrize(
    ("batch_frames", "message"),
    [
        (1, r"^frame 3 holds 2 NaN values \(pushed chunk 1, counting from 0\)"),
        (3, r"^frames 3–5 hold 2 NaN values \(pushed chunks 1–2, counting from 0\)"),
    ],
)
async def test_a_nan_records_a_value_error_naming_its_frames_and_chunks_and_stops_the_pipeline(
    batch_frames: int, message: str, transfer_slots: int
) -> None:
    containers = open_containers()
    chunks = clip_with_nan()
    pipeline, failure = build(
        chunks[0], pipeline_options(batch_frames=batch_frames, transfer_slots=transfer_slots)
    )
    with anyio.fail_after(60):  # hang guard: no end_input, the pipeline must stop by itself
        async with anyio.create_task_group() as tg:
            await tg.start(pipeline.run)
            await send_until_stopped(pipeline, chunks)
            await pipeline.done.wait()
    (error,) = failure.errors
    assert isinstance(error, ValueError)
    assert re.search(message, str(error)) and "nonfinite='ignore'" in str(error)
    with pytest.raises(STOPPED):
        await pipeline.send(chunks[0], None)
    assert pipeline.ring is None or pipeline.ring.slots_in_use == 0
    assert open_containers() == containers
    assert pipeline.videos() == [b"", b""]  # a plain MP4 is only written at its end


async def test_nonfinite_ignore_encodes_frames_holding_nan() -> None:
    chunks = clip_with_nan()
    pipeline, failure = build(chunks[0], pipeline_options(nonfinite="ignore"))
    videos = await run_to_end(pipeline, chunks)
    assert not failure.failed
    assert [read_mp4(data).frames.shape[0] for data in videos] == [7, 7]


# -- a stage's error --


async def test_an_encoder_that_fails_to_open_is_recorded_and_the_pipeline_stops_itself() -> None:
    containers = open_containers()
    chunks = clip([2, 3], batch=2, height=16, width=16)
    options = pipeline_options(video_codec_options={"threads": "1", **REFUSED_AT_OPEN})
    pipeline, failure = build(chunks[0], options)
    with anyio.fail_after(60):  # hang guard: no end_input, the pipeline must stop by itself
        async with anyio.create_task_group() as tg:
            await tg.start(pipeline.run)  # run returns without raising: this block raises nothing
            await send_until_stopped(pipeline, chunks)
            await pipeline.done.wait()
    (error,) = failure.errors  # every entry's encoder shares the open: recorded once
    assert isinstance(error, ValueError) and isinstance(error.__cause__, av.error.FFmpegError)
    with pytest.raises(STOPPED):
        await pipeline.send(chunks[0], None)
    assert pipeline.encoder_name is None and pipeline.frames_encoded == 0
    assert pipeline.ring is not None and pipeline.ring.slots_in_use == 0
    assert open_containers() == containers


async def test_a_sink_whose_reader_closed_its_stream_is_recorded_and_the_pipeline_stops_itself() -> None:
    containers = open_containers()
    chunks = clip([1] * 40, height=16, width=16)
    failure = FailureRecord()
    stream = MP4ByteStream(0, 1, failure, Arrivals())
    await stream.aclose()  # the reader left before the first bytes
    pipeline, _ = build(
        chunks[0], pipeline_options(output="fragmented"), failure=failure, streams={0: stream}
    )
    with anyio.fail_after(60):  # hang guard: no end_input, the pipeline must stop by itself
        async with anyio.create_task_group() as tg:
            await tg.start(pipeline.run)
            taken = await send_until_stopped(pipeline, chunks)
            await pipeline.done.wait()
    assert taken < len(chunks)
    (error,) = failure.errors
    assert isinstance(error, SessionClosedError)
    assert "the reader of entry 0's stream closed it before the MP4 was complete" in str(error)
    assert pipeline.ring is not None and pipeline.ring.slots_in_use == 0
    assert open_containers() == containers


# -- abort --


async def test_abort_before_run_stops_every_stage_at_once() -> None:
    containers = open_containers()
    chunks = clip([2, 2], height=16, width=16)
    pipeline, failure, stream = streamed_pipeline(chunks[0])
    pipeline.abort()
    with anyio.fail_after(60):  # hang guard
        async with anyio.create_task_group() as tg:
            await tg.start(pipeline.run)
            await pipeline.done.wait()
        with pytest.raises(SessionClosedError, match="aborted before entry 0's MP4 was complete"):
            await read_all(stream, [])  # the reader is told, instead of waiting forever
    with pytest.raises(STOPPED):
        await pipeline.send(chunks[0], None)
    assert not failure.failed  # an abort is no failure
    assert pipeline.encoder_name is None and pipeline.videos() == [b""]
    assert pipeline.ring is not None and pipeline.ring.slots_in_use == 0
    assert open_containers() == containers


async def test_abort_while_running_releases_every_slot_and_container() -> None:
    containers = open_containers()
    chunks = clip([1] * 200, height=16, width=16)
    pipeline, failure, stream = streamed_pipeline(chunks[0])
    stall = StallWatch(pipeline, stream)
    refused: list[BaseException] = []

    async def produce() -> None:
        try:
            for chunk in chunks:
                await pipeline.send(chunk, None)
        except STOPPED as error:
            refused.append(error)

    with anyio.fail_after(60):  # hang guard
        async with anyio.create_task_group() as tg:
            await tg.start(pipeline.run)
            tg.start_soon(produce)
            await stall.wait()  # mid-stream: an encoder open, every slot held
            assert open_containers() == containers + 1
            pipeline.abort()
            await pipeline.done.wait()
        with pytest.raises(SessionClosedError, match="aborted before entry 0's MP4 was complete"):
            await read_all(stream, [])  # what was buffered, then why the MP4 is not complete
    assert len(refused) == 1  # the producer's send was refused, not left waiting
    with pytest.raises(STOPPED):
        await pipeline.send(chunks[0], None)
    assert not failure.failed
    assert pipeline.ring is not None and pipeline.ring.slots_in_use == 0
    assert open_containers() == containers


# -- backpressure --


async def test_an_unread_byte_stream_blocks_send_until_it_is_read() -> None:
    chunks = clip([1] * 100)
    pipeline, failure, stream = streamed_pipeline(chunks[0])  # queue_depth 1 between the stages
    stall = StallWatch(pipeline, stream)
    sent = 0
    all_sent = anyio.Event()

    async def produce() -> None:
        nonlocal sent
        for chunk in chunks:
            await pipeline.send(chunk, None)
            sent += 1
        all_sent.set()

    received: list[bytes] = []
    with anyio.fail_after(60):  # hang guard
        async with anyio.create_task_group() as tg:
            await tg.start(pipeline.run)
            tg.start_soon(produce)
            await stall.wait()
            # Proving a negative needs a bound: with the encoder already stopped, what is still in flight
            # fills a handful of queue places and slots in milliseconds; a second is ample.
            with anyio.move_on_after(1):
                await all_sent.wait()
            assert not all_sent.is_set()
            assert 0 < sent <= 20  # the queues and slots between send and the stream, not 100 chunks
            assert pipeline.frames_encoded < len(chunks)
            tg.start_soon(read_all, stream, received)
            await all_sent.wait()
            await pipeline.end_input()
            await pipeline.done.wait()
    assert not failure.failed
    assert sent == len(chunks)
    assert_frames_match(read_mp4(b"".join(received)).frames, to_rgb_uint8(torch.cat(chunks, dim=2))[0])


# -- what the pipeline exposes --


async def test_the_timeline_records_a_span_for_each_piece_of_stage_work() -> None:
    chunks = clip([2, 3], batch=2, height=16, width=16)
    timeline: list[StageSpan] = []
    pipeline, _ = build(chunks[0], pipeline_options(batch_frames=1), timeline=timeline)
    await run_to_end(pipeline, chunks)
    counts = Counter(span.stage for span in timeline)
    assert set(counts) == {"prepare", "transfer", "land", "encode[0]", "encode[1]"}
    assert counts["prepare"] == 2  # one a chunk
    assert counts["transfer"] == counts["land"] == 5  # one a transfer group
    assert counts["encode[0]"] >= 5 and counts["encode[1]"] >= 5  # each group, then the finish
    assert all(span.start <= span.end for span in timeline)


async def test_counters_and_the_encoder_name_after_the_run() -> None:
    chunks = clip([2, 3], batch=2, height=16, width=16)
    pipeline, _ = build(chunks[0], pipeline_options())
    assert pipeline.encoder_name is None and pipeline.frames_encoded == 0 and pipeline.bytes_out == 0
    videos = await run_to_end(pipeline, chunks)
    assert pipeline.encoder_name == "libx264"
    assert pipeline.frames_encoded == 5
    assert pipeline.bytes_out == sum(len(data) for data in videos) > 0


async def test_videos_gives_empty_bytes_for_an_entry_read_through_its_stream() -> None:
    chunks = clip([2, 3], batch=2)
    pipeline, _, stream = streamed_pipeline(chunks[0])
    received: list[bytes] = []
    with anyio.fail_after(60):  # hang guard
        async with anyio.create_task_group() as tg:
            tg.start_soon(read_all, stream, received)
            await run_to_end(pipeline, chunks)
    streamed, kept = b"".join(received), pipeline.videos()
    assert kept[0] == b"" and stream.completed
    assert pipeline.bytes_out == len(streamed) + len(kept[1])
    reference = to_rgb_uint8(torch.cat(chunks, dim=2))
    for entry, data in enumerate((streamed, kept[1])):
        assert_frames_match(read_mp4(data).frames, reference[entry])
