"""Progressive output: fragmented MP4 bytes leave while chunks are still being pushed."""

from __future__ import annotations

import dataclasses
import io
import math
from pathlib import Path
from typing import Any

import anyio
import av
import numpy as np
import pytest
import torch
from anyio.streams.memory import MemoryObjectSendStream

from streamvae import ChunkedVideoMP4Session, MP4ByteStream, SessionClosedError, UnreadStreamError
from streamvae._encode import EntryEncoder
from streamvae._statistics import SessionStatistics
from streamvae.testing import open_containers
from tests._media import DETERMINISTIC_X264, count_frames, moving_pattern, read_mp4, wan_like_chunks

pytestmark = pytest.mark.anyio

PINNED = DETERMINISTIC_X264  # byte-identical MP4s for identical frames


async def read_all(stream: MP4ByteStream, into: list[bytes]) -> None:
    async for data in stream:
        into.append(data)


async def test_a_fragment_arrives_before_the_last_chunk_is_pushed() -> None:
    chunks = wan_like_chunks(13)  # 49 frames, one keyframe (and fragment) a second at 16 fps
    received: list[bytes] = []
    fragment_seen = anyio.Event()

    async def read_until_the_end(stream: MP4ByteStream) -> None:
        async for data in stream:
            received.append(data)
            if b"moof" in b"".join(received):
                fragment_seen.set()

    async with (
        ChunkedVideoMP4Session(
            value_range=(-1, 1), fps=16, output="fragmented", video_codec_options=PINNED
        ) as session,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(read_until_the_end, session.open_stream(0))
        for chunk in chunks[:-1]:
            await session.push(chunk)
        # 45 frames are in: the first fragments must leave without the last chunk (the test fails, not
        # hangs, if they do not).
        with anyio.fail_after(60):
            await fragment_seen.wait()
        await session.push(chunks[-1])
        assert await session.finish() == [b""]  # the bytes went to the stream
    data = b"".join(received)
    assert data.index(b"moov") < data.index(b"moof")
    assert read_mp4(data).frames.shape == (49, 64, 96, 3)


async def test_fragmented_audio_and_video_start_at_zero_and_stay_interleaved() -> None:
    rate, fps = 16000, 16
    wave = (0.2 * np.sin(np.arange(rate * 4) / rate * 2 * np.pi * 220)).astype(np.float32)
    received: list[bytes] = []
    async with (
        ChunkedVideoMP4Session(
            value_range=(-1, 1),
            fps=fps,
            output="fragmented",
            audio_waveforms=[wave],
            audio_sample_rate=rate,
            video_codec_options=PINNED,
        ) as session,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(read_all, session.open_stream(0), received)
        for chunk in wan_like_chunks(13):
            await session.push(chunk)
        await session.finish()
    data = b"".join(received)
    mp4 = read_mp4(data)
    assert mp4.video_start == 0 and mp4.audio_start == pytest.approx(0, abs=1 / fps)
    assert mp4.frames.shape[0] == 49 and mp4.audio_duration == pytest.approx(49 / fps, abs=0.1)
    # Walk the packets in file order: audio and video times never drift more than a second apart.
    latest = {"audio": 0.0, "video": 0.0}
    drift = 0.0
    with av.open(io.BytesIO(data)) as container:
        for packet in container.demux():
            if packet.dts is None or packet.time_base is None:
                continue
            latest[packet.stream.type] = float(packet.dts * packet.time_base)
            drift = max(drift, abs(latest["audio"] - latest["video"]))
    assert drift <= 1.0


async def test_a_slow_reader_backs_pressure_up_to_push_without_growing_buffers() -> None:
    max_buffered, slots = 2, 2
    async with ChunkedVideoMP4Session(
        value_range=(-1, 1),
        fps=16,
        output="fragmented",
        keyframe_interval=1,  # a fragment per frame: the stream fills fast
        transfer_slots=slots,
        video_codec_options={**PINNED, "tune": "zerolatency"},
    ) as session:
        stream = session.open_stream(0, max_buffered=max_buffered)
        pushed = 0
        with anyio.move_on_after(5) as blocked:
            for chunk in wan_like_chunks(200):  # nobody reads yet: push must stall well before the end
                await session.push(chunk)
                pushed += 1
        assert blocked.cancelled_caught and pushed < 200
        statistics = stream.statistics()
        assert statistics.current_buffer_used == statistics.max_buffer_size == max_buffered
        assert session.ring is not None and session.ring.slots_in_use <= slots
        assert session.frames_pushed - session.frames_encoded <= 4 * 8  # a few chunks in flight, not 200
        received: list[bytes] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(read_all, stream, received)
            await session.finish()
    assert read_mp4(b"".join(received)).frames.shape[0] == session.frames_pushed


async def test_fragmented_file_output_is_written_progressively_and_plays(tmp_path: Path) -> None:
    path = tmp_path / "out.mp4"
    async with ChunkedVideoMP4Session(
        value_range=(-1, 1), fps=16, output="fragmented", output_files=[path], video_codec_options=PINNED
    ) as session:
        sizes = []
        partial = path.with_name("out.mp4.part")  # the final name appears only once the MP4 is complete
        for chunk in wan_like_chunks(13):
            await session.push(chunk)
            assert not path.exists()
            sizes.append(partial.stat().st_size if partial.exists() else 0)
        (video,) = await session.finish()
    assert path.read_bytes() == video and not partial.exists()
    assert read_mp4(video).frames.shape[0] == 49
    assert 0 < max(sizes[:-1]) < len(video)  # bytes reached the disk before the end


async def test_an_aborted_session_leaves_no_partial_file(tmp_path: Path) -> None:
    path = tmp_path / "out.mp4"
    with anyio.CancelScope() as scope:
        async with ChunkedVideoMP4Session(
            value_range=(-1, 1), fps=16, output="fragmented", keyframe_interval=4, output_files=[path]
        ) as session:
            for chunk in wan_like_chunks(12):
                await session.push(chunk)
            scope.cancel()
            await session.finish()
    assert scope.cancelled_caught
    assert not path.exists()
    assert open_containers() == 0


async def test_a_reader_that_leaves_early_aborts_the_session() -> None:
    with pytest.raises(SessionClosedError, match="entry 0's stream"):
        async with ChunkedVideoMP4Session(
            value_range=(-1, 1), fps=16, output="fragmented", keyframe_interval=2, video_codec_options=PINNED
        ) as session:
            stream = session.open_stream(0, max_buffered=1)
            await stream.aclose()
            for chunk in wan_like_chunks(40):
                await session.push(chunk)
    assert open_containers() == 0


async def test_the_stream_raises_when_the_session_is_aborted() -> None:
    received: list[bytes] = []
    with pytest.RaisesGroup(pytest.RaisesExc(SessionClosedError, match="aborted before entry 0's MP4")):
        async with (
            anyio.create_task_group() as tg,
            ChunkedVideoMP4Session(value_range=(-1, 1), fps=16, output="fragmented") as session,
        ):
            tg.start_soon(read_all, session.open_stream(0), received)
            await session.push(moving_pattern(0, 4))
            # leaving without finish() aborts: the reader must not mistake the cut for the end


async def test_open_stream_is_checked() -> None:
    async with ChunkedVideoMP4Session(value_range=(-1, 1), fps=16) as session:
        session.open_stream(3)
        with pytest.raises(ValueError, match="already has a stream"):
            session.open_stream(3)
        with pytest.raises(ValueError, match="entry 3"):
            await session.push(moving_pattern(0, 1))
        # Entry 3's reader would wait for bytes this batch cannot have: the session failed with that error.
        with pytest.raises(ValueError, match="entry 3"):
            await session.push(moving_pattern(0, 1, batch=4))
    async with ChunkedVideoMP4Session(value_range=(-1, 1), fps=16) as session:
        session.open_stream(3)
        await session.push(moving_pattern(0, 1, batch=4))
        with pytest.raises(SessionClosedError, match="before the first push"):
            session.open_stream(0)
        session.abort()


# -- a fragment per chunk: when a chunk's frames leave --


async def send_frame_counts(stream: MP4ByteStream, totals: MemoryObjectSendStream[int]) -> None:
    """After each read of ``stream``, send the frames its bytes so far decode to."""
    received = b""
    async with totals:
        async for data in stream:
            received += data
            await totals.send(count_frames(received))


@pytest.mark.parametrize(
    ("batch_frames", "chunks"),
    [
        (1, wan_like_chunks(7)),  # 1 + 6 × 4 frames, a transfer (and a fragment) a frame
        (4, [moving_pattern(4 * i, 4) for i in range(6)]),  # a transfer of 4 frames a chunk
    ],
)
async def test_a_chunks_frames_leave_no_later_than_the_next_chunks_first_frame(
    batch_frames: int, chunks: list[torch.Tensor]
) -> None:
    totals_send, totals = anyio.create_memory_object_stream[int](math.inf)
    async with (
        ChunkedVideoMP4Session(
            value_range=(-1, 1),
            fps=16,
            output="fragmented",
            batch_frames=batch_frames,
            video_codec_options=PINNED,
        ) as session,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(send_frame_counts, session.open_stream(0), totals_send)
        out = pushed = 0
        for chunk in chunks:
            await session.push(chunk)
            # Nothing more is pushed until every frame before this chunk has arrived (the test fails,
            # not hangs, if the session held one back for a later chunk).
            with anyio.fail_after(60):
                while out < pushed:
                    out = await totals.receive()
            pushed += chunk.shape[2]
        await session.finish()
    assert session.statistics().chunks_out == len(chunks)


async def test_statistics_give_the_time_to_the_first_fragment_and_each_chunks_latency() -> None:
    chunks = wan_like_chunks(7)
    received: list[bytes] = []
    async with (
        ChunkedVideoMP4Session(
            value_range=(-1, 1), fps=16, output="fragmented", video_codec_options=PINNED
        ) as session,
        anyio.create_task_group() as tg,
    ):
        before = session.statistics()
        tg.start_soon(read_all, session.open_stream(0), received)
        for chunk in chunks:
            await session.push(chunk)
        await session.finish()
    stats = session.statistics()
    assert before == SessionStatistics(
        time_to_first_push=None,
        time_to_first_fragment=None,
        chunks_pushed=0,
        chunks_out=0,
        chunk_latency_median=None,
        chunk_latency_max=None,
        frames_pushed=0,
        frames_encoded=0,
        bytes_out=0,
    )
    assert stats.time_to_first_push is not None and stats.time_to_first_fragment is not None
    assert 0 <= stats.time_to_first_push < stats.time_to_first_fragment
    assert stats.chunks_pushed == stats.chunks_out == 7
    assert stats.chunk_latency_median is not None and stats.chunk_latency_max is not None
    assert 0 < stats.chunk_latency_median <= stats.chunk_latency_max
    assert stats.frames_pushed == stats.frames_encoded == 25
    assert stats.bytes_out == len(b"".join(received))
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.chunks_out = 0  # type: ignore[misc]
    assert session.statistics() == stats  # a snapshot: the session is done, nothing changes


async def test_a_plain_mp4s_chunks_leave_at_finish() -> None:
    async with ChunkedVideoMP4Session(value_range=(-1, 1), fps=16, video_codec_options=PINNED) as session:
        for chunk in wan_like_chunks(4):
            await session.push(chunk)
        assert session.statistics().chunks_out == 0  # a plain MP4 is only complete at the end
        assert session.statistics().time_to_first_fragment is None
        await session.finish()
    stats = session.statistics()
    assert stats.chunks_out == stats.chunks_pushed == 4 and stats.time_to_first_fragment is not None


async def test_a_transfer_groups_first_frame_is_encoded_alone_so_the_group_before_leaves_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[int, int]] = []  # (frames given, frames out before the call)
    encode = EntryEncoder.encode

    def spy(self: EntryEncoder, frames: Any) -> bytes:
        calls.append((len(frames), self.frames_out))
        return encode(self, frames)

    monkeypatch.setattr(EntryEncoder, "encode", spy)
    async with ChunkedVideoMP4Session(
        value_range=(-1, 1), fps=16, output="fragmented", batch_frames=4, video_codec_options=PINNED
    ) as session:
        for start in range(0, 12, 4):
            await session.push(moving_pattern(start, 4))
        (video,) = await session.finish()
    # The first frame of a group closes the fragment of the group before, whose bytes are handed on
    # before the rest of the group is encoded.
    assert calls == [(1, 0), (3, 0), (1, 0), (3, 4), (1, 4), (3, 8)]
    assert read_mp4(video).frames.shape[0] == 12


async def test_an_unread_entry_is_reported_when_groups_are_handed_on_early() -> None:
    # A group's first frame is handed on before the rest only if its stream has room: waiting there
    # would hold the group's slot, and an unread entry would then stop the ring instead of being named.
    with anyio.fail_after(120), pytest.raises(UnreadStreamError, match="entry 1's stream is full"):
        async with ChunkedVideoMP4Session(
            value_range=(-1, 1), fps=16, output="fragmented", batch_frames=4, video_codec_options=PINNED
        ) as session:
            first, second = session.open_stream(0), session.open_stream(1)

            async def produce() -> None:
                for start in range(0, 120, 4):
                    await session.push(moving_pattern(start, 4, batch=2, height=16, width=16))
                await session.finish()

            session.start_producer(produce)
            async for _ in first:
                pass
            async for _ in second:
                pass
    assert open_containers() == 0
