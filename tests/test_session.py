from __future__ import annotations

import threading
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import anyio
import av
import numpy as np
import pytest
import torch

from streamvae import ChunkedVideoMP4Session, SessionClosedError
from streamvae._encode import EntryEncoder
from streamvae._pipeline import StagePipeline
from streamvae.testing import foreign_threads, open_containers
from tests._media import (
    DETERMINISTIC_X264,
    REFUSED_AT_OPEN,
    moving_pattern,
    psnr,
    read_mp4,
    to_rgb_uint8,
    wan_like_chunks,
)
from tests._spies import count_transfers

pytestmark = pytest.mark.anyio

PINNED = DETERMINISTIC_X264  # byte-identical MP4s for identical frames


async def stream_chunks(
    chunks: Sequence[torch.Tensor], **options: Any
) -> tuple[list[bytes], ChunkedVideoMP4Session]:
    options.setdefault("value_range", (-1.0, 1.0))
    options.setdefault("fps", 16)
    options.setdefault("video_codec_options", PINNED)
    async with ChunkedVideoMP4Session(**options) as session:
        for chunk in chunks:
            await session.push(chunk)
        videos = await session.finish()
    return videos, session


@pytest.mark.parametrize("pixel_format", ["rgb24", "yuv420p"])
async def test_each_entry_decodes_to_every_pushed_frame_at_high_fidelity(pixel_format: str) -> None:
    chunks = wan_like_chunks(5, batch=2, height=64, width=96)
    videos, session = await stream_chunks(chunks, pixel_format=pixel_format)
    reference = to_rgb_uint8(torch.cat(chunks, dim=2))
    assert len(videos) == 2 and session.pixel_format == pixel_format
    for entry, data in enumerate(videos):
        mp4 = read_mp4(data)
        assert mp4.frames.shape == (17, 64, 96, 3)
        assert mp4.fps == 16 and mp4.colorspace == 1  # BT.709 tag
        assert psnr(mp4.frames, reference[entry]) >= 35
        assert mp4.audio_duration is None
    assert data[4:8] == b"ftyp" and data.index(b"moov") < data.index(b"mdat")  # moov up front
    assert session.frames_pushed == 17 and session.frames_encoded == 17
    assert session.bytes_out == sum(len(v) for v in videos)


async def test_crop_keeps_the_top_left_region() -> None:
    chunks = wan_like_chunks(3, height=72, width=100)
    videos, _ = await stream_chunks(chunks, crop=(64, 96))
    mp4 = read_mp4(videos[0])
    reference = to_rgb_uint8(torch.cat(chunks, dim=2))[0, :, :64, :96]
    assert mp4.frames.shape == (9, 64, 96, 3)
    assert psnr(mp4.frames, reference) >= 35


async def test_rational_fps_is_kept_exactly() -> None:
    videos, _ = await stream_chunks(wan_like_chunks(2), fps=30000 / 1001)
    assert read_mp4(videos[0]).fps == Fraction(30000, 1001)


async def test_audio_tracks_per_entry_match_the_video_duration() -> None:
    rate = 16000
    short = np.sin(np.linspace(0, 200, rate // 2)).astype(np.float32)  # 0.5 s: padded
    long = torch.rand(2, rate * 5) * 0.2 - 0.1  # 5 s stereo: trimmed
    chunks = wan_like_chunks(5, batch=3)
    videos, _ = await stream_chunks(chunks, audio_waveforms=[short, None, long], audio_sample_rate=rate)
    duration = 17 / 16
    first, second, third = (read_mp4(v) for v in videos)
    assert first.audio_channels == 1 and third.audio_channels == 2 and second.audio_duration is None
    for mp4 in (first, third):
        assert mp4.audio_start == pytest.approx(0, abs=1 / 16) and mp4.video_start == 0
        assert mp4.audio_duration == pytest.approx(duration, abs=0.07)
        assert mp4.frames.shape[0] == 17


@pytest.mark.parametrize(("batch_frames", "sizes"), [(1, [1] * 13), (4, [4, 4, 4, 1]), (6, [6, 6, 1])])
async def test_batch_frames_regroups_chunks_into_transfers_of_that_size(
    batch_frames: int, sizes: list[int]
) -> None:
    chunks = wan_like_chunks(4)  # 1 + 4 + 4 + 4 frames
    async with ChunkedVideoMP4Session(
        value_range=(-1, 1), fps=16, batch_frames=batch_frames, video_codec_options=PINNED
    ) as session:
        for chunk in chunks:
            await session.push(chunk)
        assert session.ring is not None
        seen = count_transfers(session.ring)
        videos = await session.finish()
    stats = session.transfer_stats()
    assert stats is not None and stats.transfers == len(sizes)
    # Transfers that ran before the spy was in place were full groups; the rest are as expected.
    assert seen == sizes[len(sizes) - len(seen) :]
    assert stats.bytes_transferred == 13 * 64 * 96 * 3
    assert read_mp4(videos[0]).frames.shape[0] == 13


async def test_plain_blocking_path_without_a_ring_gives_the_same_video() -> None:
    chunks = wan_like_chunks(3)
    ringed, _ = await stream_chunks(chunks)
    plain, session = await stream_chunks(chunks, transfer_slots=0)
    assert session.ring is None and session.transfer_stats() is None
    assert plain == ringed


async def test_output_bytes_are_identical_across_runs_with_pinned_threads() -> None:
    chunks = wan_like_chunks(4, batch=2)
    first, _ = await stream_chunks(
        chunks, audio_waveforms=[np.zeros(8000, np.float32), None], audio_sample_rate=8000
    )
    second, _ = await stream_chunks(
        chunks, audio_waveforms=[np.zeros(8000, np.float32), None], audio_sample_rate=8000
    )
    assert first == second


async def test_fragmented_output_is_a_playable_fragmented_mp4() -> None:
    chunks = wan_like_chunks(9)
    videos, _ = await stream_chunks(chunks, output="fragmented", keyframe_interval=8)
    assert b"moof" in videos[0] and videos[0].index(b"moov") < videos[0].index(b"moof")
    assert read_mp4(videos[0]).frames.shape[0] == 33


async def test_output_files_receive_the_same_bytes(tmp_path: Any) -> None:
    paths = [tmp_path / "a.mp4", tmp_path / "b.mp4"]
    videos, _ = await stream_chunks(wan_like_chunks(3, batch=2), output_files=paths)
    assert [p.read_bytes() for p in paths] == videos


async def test_encoder_failure_surfaces_as_itself_and_releases_everything() -> None:
    baseline = foreign_threads()
    bad = ChunkedVideoMP4Session(value_range=(-1, 1), fps=16, video_codec_options=REFUSED_AT_OPEN)
    with pytest.raises(ValueError) as caught:
        async with bad as session:
            for chunk in wan_like_chunks(30):
                await session.push(chunk)
            await session.finish()
    assert not isinstance(caught.value, BaseExceptionGroup)
    assert "libx264 refuses x264-params='crop-rect=0,0,0,4096'" in str(caught.value)
    assert isinstance(caught.value.__cause__, av.error.FFmpegError)
    assert session.ring is not None and session.ring.slots_in_use == 0
    assert open_containers() == 0
    assert foreign_threads() <= baseline


async def test_encoder_failure_surfaces_at_finish_when_nothing_else_is_pushed() -> None:
    async with ChunkedVideoMP4Session(
        value_range=(-1, 1), fps=16, video_codec_options=REFUSED_AT_OPEN
    ) as session:
        await session.push(moving_pattern(0, 1))
        with pytest.raises(ValueError, match="libx264 refuses x264-params"):
            await session.finish()
    assert open_containers() == 0


async def test_identical_failures_of_every_entry_are_reported_once() -> None:
    with pytest.raises(ValueError) as caught:
        await stream_chunks(wan_like_chunks(3, batch=2), video_codec_options=REFUSED_AT_OPEN)
    assert not isinstance(caught.value, BaseExceptionGroup)


async def test_cancelling_mid_stream_leaves_no_thread_slot_or_container() -> None:
    await stream_chunks(wan_like_chunks(2))  # warm the worker pools so the baseline holds them
    baseline = foreign_threads()
    pushed = 0
    with anyio.move_on_after(30) as scope:
        async with ChunkedVideoMP4Session(value_range=(-1, 1), fps=16) as session:
            for chunk in wan_like_chunks(40, height=128, width=192):
                await session.push(chunk)
                pushed += 1
                if pushed == 6:
                    scope.cancel()
            await session.finish()
    assert scope.cancelled_caught and pushed == 6
    assert session.ring is not None and session.ring.slots_in_use == 0
    assert open_containers() == 0
    assert foreign_threads() <= baseline
    with pytest.raises(SessionClosedError):
        await session.push(moving_pattern(0, 1))


async def test_an_error_in_the_body_aborts_and_propagates_unchanged() -> None:
    class ProducerError(Exception):
        pass

    with pytest.raises(ProducerError):
        async with ChunkedVideoMP4Session(value_range=(-1, 1), fps=16) as session:
            await session.push(moving_pattern(0, 4))
            raise ProducerError("the producer failed")
    assert session.ring is not None and session.ring.slots_in_use == 0
    assert open_containers() == 0


async def test_sixteen_concurrent_sessions_in_one_event_loop_all_complete() -> None:
    results: dict[int, list[bytes]] = {}

    async def one(index: int) -> None:
        chunks = [moving_pattern(index * 10, n, height=32, width=48) for n in (1, 4, 4)]
        results[index], _ = await stream_chunks(chunks)

    async with anyio.create_task_group() as tg:
        for index in range(16):
            tg.start_soon(one, index)
    assert sorted(results) == list(range(16))
    assert all(read_mp4(v[0]).frames.shape[0] == 9 for v in results.values())


async def test_push_from_a_worker_thread_with_backpressure() -> None:
    chunks = wan_like_chunks(6)
    async with ChunkedVideoMP4Session(value_range=(-1, 1), fps=16, video_codec_options=PINNED) as session:

        def produce() -> None:
            for chunk in chunks:
                session.push_from_thread(chunk)

        await anyio.to_thread.run_sync(produce)
        videos = await session.finish()
    assert read_mp4(videos[0]).frames.shape[0] == 21
    assert videos == (await stream_chunks(chunks))[0]


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"fps": 0}, "fps"),
        ({"fps": -3}, "fps"),
        ({"batch_frames": 0}, "batch_frames"),
        ({"crop": (10,)}, "crop"),
        ({"crop": (0, 4)}, "crop"),
        ({"transfer_slots": -1}, "transfer_slots"),
        ({"value_range": (1, 0)}, "value_range"),
        ({"pixel_format": "nv12"}, "pixel_format"),
        ({"output": "webm"}, "output"),
        ({"output": "fragmented", "fragment_frames": 0}, "fragment_frames"),
        ({"output": "fragmented", "fragment_frames": 2.0}, "fragment_frames"),
        ({"fragment_frames": 4}, "fragment_frames applies to output='fragmented'"),
        ({"video_codec_options": {"crf": 18}}, "video_codec_options"),
        ({"audio_waveforms": [np.zeros(10, np.float32)]}, "audio_sample_rate"),
        (
            {"audio_waveforms": [np.zeros((3, 10), np.float32)], "audio_sample_rate": 8000},
            r"audio_waveforms\[0\]",
        ),
        ({"audio_waveforms": [np.zeros(10, np.int16)], "audio_sample_rate": 8000}, r"audio_waveforms\[0\]"),
    ],
)
def test_constructor_rejects_bad_options_naming_them(options: dict[str, Any], match: str) -> None:
    options = {"value_range": (-1, 1), "fps": 16, **options}
    with pytest.raises(ValueError, match=match):
        ChunkedVideoMP4Session(**options)


@pytest.mark.parametrize(
    ("chunk", "match"),
    [
        (torch.zeros(3, 4, 8, 8), "5-D"),
        (torch.zeros(1, 3, 1, 8, 8, dtype=torch.uint8), "floating point"),
        (torch.zeros(1, 4, 1, 8, 8), "3 \\(RGB\\) channels"),
        (torch.zeros(1, 3, 1, 7, 8), "even height and width.*crop=\\(6, 8\\)"),
        (torch.zeros(1, 3, 0, 8, 8), "at least one frame"),
    ],
)
async def test_push_rejects_bad_chunks_before_any_work(chunk: torch.Tensor, match: str) -> None:
    async with ChunkedVideoMP4Session(value_range=(-1, 1), fps=16) as session:
        with pytest.raises(ValueError, match=match):
            await session.push(chunk)
        assert session.ring is None  # nothing started


async def test_push_rejects_a_chunk_whose_shape_changes_mid_stream_and_a_crop_too_large() -> None:
    async with ChunkedVideoMP4Session(value_range=(-1, 1), fps=16) as session:
        await session.push(moving_pattern(0, 1, height=32, width=48))
        with pytest.raises(ValueError, match="changed mid-stream"):
            await session.push(moving_pattern(1, 4, height=32, width=64))
        with pytest.raises(ValueError, match="changed mid-stream"):
            await session.push(moving_pattern(1, 4, batch=2, height=32, width=48))
        videos = await session.finish()
    assert read_mp4(videos[0]).frames.shape[0] == 1
    async with ChunkedVideoMP4Session(value_range=(-1, 1), fps=16, crop=(64, 64)) as session:
        with pytest.raises(ValueError, match="crop"):
            await session.push(moving_pattern(0, 1, height=32, width=48))


async def test_audio_waveform_count_must_match_the_batch() -> None:
    async with ChunkedVideoMP4Session(
        value_range=(-1, 1), fps=16, audio_waveforms=[None], audio_sample_rate=8000
    ) as session:
        with pytest.raises(ValueError, match="audio_waveforms has 1 entries but the batch has 2"):
            await session.push(moving_pattern(0, 1, batch=2))


async def test_push_after_finish_and_finish_twice_are_errors() -> None:
    async with ChunkedVideoMP4Session(value_range=(-1, 1), fps=16) as session:
        with pytest.raises(SessionClosedError, match="before any chunk"):
            await session.finish()
        await session.push(moving_pattern(0, 1))
        await session.finish()
        with pytest.raises(SessionClosedError, match="push"):
            await session.push(moving_pattern(1, 1))
        with pytest.raises(SessionClosedError, match="finish"):
            await session.finish()
    with pytest.raises(SessionClosedError, match="entered"):
        await ChunkedVideoMP4Session(value_range=(-1, 1), fps=16).push(moving_pattern(0, 1))


def chunks_with_nan(frame: int, count: int = 5, **kwargs: int) -> list[torch.Tensor]:
    """Four Wan-like chunks (frames 0, 1–4, 5–8, 9–12) with ``count`` NaN values in ``frame``."""
    chunks = wan_like_chunks(4, **kwargs)
    index = 0 if frame == 0 else (frame - 1) // 4 + 1
    start = 0 if index == 0 else 4 * index - 3
    chunks[index][0, 1, frame - start, 3, :count] = float("nan")
    return chunks


@pytest.mark.parametrize("transfer_slots", [0, 2])
@pytest.mark.parametrize("batch_frames", [1, 3])
@pytest.mark.parametrize("pixel_format", ["rgb24", "yuv420p"])
async def test_nan_in_a_chunk_fails_the_session_naming_its_frames_and_the_count(
    pixel_format: str, batch_frames: int, transfer_slots: int
) -> None:
    frames = "frame 6 holds" if batch_frames == 1 else "frames 6–8 hold"
    session = ChunkedVideoMP4Session(
        value_range=(-1, 1),
        fps=16,
        pixel_format=pixel_format,  # type: ignore[arg-type]
        batch_frames=batch_frames,
        transfer_slots=transfer_slots,
        video_codec_options=PINNED,
    )
    with pytest.raises(ValueError, match=rf"^{frames} 5 NaN values \(pushed chunk 2, .*float16"):
        async with session:
            for chunk in chunks_with_nan(6, batch=2):
                await session.push(chunk)  # raises here once the error is recorded ...
            await session.finish()  # ... or here
    assert session.ring is None or session.ring.slots_in_use == 0
    assert open_containers() == 0


async def test_nan_in_a_group_that_spans_two_chunks_names_both() -> None:
    with pytest.raises(ValueError, match=r"^frames 3–5 hold 1 NaN value \(pushed chunks 1–2, "):
        await stream_chunks(chunks_with_nan(5, count=1), batch_frames=3)


async def test_infinities_are_clamped_to_the_value_range_not_errors() -> None:
    chunks = wan_like_chunks(3)
    chunks[1][:, :, 1] = float("inf")
    chunks[1][:, :, 2] = float("-inf")
    videos, _ = await stream_chunks(chunks)
    frames = read_mp4(videos[0]).frames
    assert frames.shape[0] == 9
    assert frames[2].min() >= 250 and frames[3].max() <= 5  # white and black


@pytest.mark.parametrize("pixel_format", ["rgb24", "yuv420p"])
async def test_nonfinite_ignore_encodes_frames_with_nan_anyway(pixel_format: str) -> None:
    videos, _ = await stream_chunks(chunks_with_nan(6), nonfinite="ignore", pixel_format=pixel_format)
    assert read_mp4(videos[0]).frames.shape[0] == 13


@pytest.mark.parametrize("value", ["raise", None, True])
def test_nonfinite_must_be_error_or_ignore(value: object) -> None:
    with pytest.raises(ValueError, match=r"nonfinite must be 'error' or 'ignore', got"):
        ChunkedVideoMP4Session(value_range=(-1, 1), fps=16, nonfinite=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("pixel_format", ["rgb24", "yuv420p"])
async def test_prepare_allocates_no_float_temporary_the_size_of_a_chunk(
    pixel_format: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    largest: list[int] = []
    quantize_groups = StagePipeline._quantize_groups

    def profiled(self: StagePipeline, *args: Any) -> Any:
        # In the prepare stage's worker thread: what does quantizing one chunk allocate?
        with torch.autograd.profiler.profile(profile_memory=True, use_kineto=False) as profiler:
            result = quantize_groups(self, *args)
        largest.append(max(e.cpu_memory_usage for e in profiler.function_events))
        return result

    monkeypatch.setattr(StagePipeline, "_quantize_groups", profiled)
    chunks = wan_like_chunks(5, height=128, width=192)
    await stream_chunks(chunks, pixel_format=pixel_format)
    group = (128 * 192 * 3) if pixel_format == "rgb24" else (128 * 192 * 3 // 2)  # one frame of uint8
    # The first chunk allocates the scratch the session keeps (at most a frame of float32); after it,
    # only each group's uint8 frames: no chunk-sized float32 temporary, no regrouping copies.
    assert largest[0] < chunks[1].numel() * 4
    assert max(largest[1:]) <= group


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.cuda
@pytest.mark.parametrize("transfer_slots", [0, 2])
async def test_cuda_nan_is_counted_on_the_device_and_fails_the_session(transfer_slots: int) -> None:
    chunks = [c.cuda() for c in chunks_with_nan(6, batch=2)]
    with pytest.raises(ValueError, match=r"^frame 6 holds 5 NaN values \(pushed chunk 2, "):
        await stream_chunks(chunks, transfer_slots=transfer_slots)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.cuda
async def test_cuda_chunks_take_the_device_yuv_path_through_pinned_slots() -> None:
    producer = torch.cuda.Stream()
    chunks = [c.cuda() for c in wan_like_chunks(5, batch=2)]
    async with ChunkedVideoMP4Session(value_range=(-1, 1), fps=16, video_codec_options=PINNED) as session:
        for chunk in chunks:
            # Produced and pushed on the producer's own stream, as a decode would: push records the
            # chunk's ready event on the pushing thread's current stream.
            with torch.cuda.stream(producer):
                await session.push(chunk * 1.0)
        videos = await session.finish()
    assert session.pixel_format == "yuv420p"
    assert session.ring is not None and session.ring.device.type == "cuda"
    stats = session.transfer_stats()
    assert stats is not None and stats.transfers == 17 and session.ring.slots_in_use == 0
    reference = to_rgb_uint8(torch.cat([c.cpu() for c in chunks], dim=2))
    for entry, data in enumerate(videos):
        mp4 = read_mp4(data)
        assert mp4.frames.shape == (17, 64, 96, 3)
        assert psnr(mp4.frames, reference[entry]) >= 35


async def test_sessions_sharing_an_encode_budget_never_encode_more_at_once_than_its_tokens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    budget = anyio.CapacityLimiter(1)
    lock = threading.Lock()
    running = peak = 0
    threads: list[str] = []

    def counted(method: Any) -> Any:
        def call(self: EntryEncoder, *args: Any) -> Any:
            nonlocal running, peak
            with lock:
                running += 1
                peak = max(peak, running)
                threads.append(self.codec_options["threads"])
            try:
                assert budget.borrowed_tokens == 1  # this call holds the shared token
                return method(self, *args)
            finally:
                with lock:
                    running -= 1

        return call

    # close() frees a container and encodes nothing: it runs off the budget, so that a call abandoned in
    # the encoder's worker (a hung KMS signing) cannot hold the token its close would wait for.
    for name in ("encode", "finish"):
        monkeypatch.setattr(EntryEncoder, name, counted(getattr(EntryEncoder, name)))
    results: dict[str, list[bytes]] = {}

    async def run(name: str, codec_options: dict[str, str]) -> None:
        chunks = wan_like_chunks(4, batch=2, height=32, width=32)
        results[name], _ = await stream_chunks(
            chunks, encode_limiter=budget, video_codec_options=codec_options
        )

    async with anyio.create_task_group() as group:
        group.start_soon(run, "default threads", {})
        group.start_soon(run, "pinned threads", {"threads": "2"})
    # Two sessions of two entries each: four encoders, and never two of their calls at once.
    assert peak == 1
    assert set(threads) == {"1", "2"}  # threads defaults to 1 under a budget; a pinned value stays
    assert all(read_mp4(v).frames.shape[0] == 13 for videos in results.values() for v in videos)


def test_encode_limiter_must_be_a_capacity_limiter() -> None:
    with pytest.raises(TypeError, match="encode_limiter"):
        ChunkedVideoMP4Session(value_range=(-1, 1), fps=16, encode_limiter=2)  # type: ignore[arg-type]
