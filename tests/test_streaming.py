"""Progressive output: fragmented MP4 bytes leave while chunks are still being pushed."""

from __future__ import annotations

import io
from pathlib import Path

import anyio
import av
import numpy as np
import pytest

from streamvae import ChunkedVideoMP4Session, MP4ByteStream, SessionClosedError
from streamvae.testing import open_containers
from tests._media import DETERMINISTIC_X264, moving_pattern, read_mp4, wan_like_chunks

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
        await session.push(moving_pattern(0, 1, batch=4))
        with pytest.raises(SessionClosedError, match="before the first push"):
            session.open_stream(0)
        session.fail(None)
