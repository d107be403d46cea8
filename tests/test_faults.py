"""The fault matrix: every bad input is a clear error before work, and no misuse hangs silently.

Each case is what a careful user could get wrong — an fps the MP4 time base cannot hold, a value range that
float32 cannot scale, a codec or option name with a typo, NaN audio or latents, a blocking call on the
event loop's thread, reading a batch's entries one after another — and the error it must get instead of a
late failure, a silent black video or a hang.
"""

from __future__ import annotations

import threading
from typing import Any

import anyio
import numpy as np
import pytest
import torch

from streamvae import (
    ChunkedVideoMP4Session,
    MP4ByteStream,
    UnreadStreamError,
    _decode_worker,
    decode_to_mp4,
    publish_chunks,
    read_entries,
    stream_mp4,
)
from streamvae.testing import open_containers
from tests._media import DETERMINISTIC_X264, moving_pattern, read_mp4
from tests._vaes import latent, tiny_wan21

PINNED = DETERMINISTIC_X264  # byte-identical MP4s for identical frames


def session(**options: Any) -> ChunkedVideoMP4Session:
    return ChunkedVideoMP4Session(**{"value_range": (-1.0, 1.0), "fps": 16, **options})


# -- bad inputs: ValueError from the constructor, before any work --


@pytest.mark.parametrize("fps", [1e-4, 0.0009, 1000.5, 1e9, float("nan"), float("inf"), 0, -16])
def test_an_fps_the_time_base_cannot_hold_is_refused(fps: float) -> None:
    with pytest.raises(ValueError, match="fps must be a number between 1/1000 and 1000"):
        session(fps=fps)


@pytest.mark.anyio
@pytest.mark.parametrize("fps", [0.001, 1000])
async def test_the_ends_of_the_fps_range_round_trip(fps: float) -> None:
    async with session(fps=fps, video_codec_options=PINNED) as s:
        await s.push(moving_pattern(0, 3, height=32, width=32))
        (video,) = await s.finish()
    assert read_mp4(video).frames.shape[0] == 3


@pytest.mark.parametrize(
    ("value_range", "message"),
    [
        ((float("-inf"), float("inf")), "finite numbers within float32's range"),
        ((-1e308, 1e308), "finite numbers within float32's range"),
        ((float("nan"), 1.0), "finite numbers within float32's range"),
        ((-3e38, 3e38), "span high - low must be finite in float32"),
        ((0.0, 1e-45), "span high - low must be finite in float32"),
        ((1.0, 1.0 + 1e-12), "increasing in float32"),
        ((1.0, -1.0), "increasing in float32"),
    ],
)
def test_a_value_range_float32_cannot_scale_is_refused(
    value_range: tuple[float, float], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        session(value_range=value_range)


@pytest.mark.parametrize(
    ("codec", "message"),
    [
        ("nope", "video_codec 'nope' is not an encoder of this PyAV build"),
        ("aac", "video_codec 'aac' is an audio encoder, not a video encoder"),
        ("", "video_codec must be an FFmpeg video encoder name"),
    ],
)
def test_a_codec_that_is_no_video_encoder_is_refused_before_the_first_push(codec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        session(video_codec=codec)


def test_an_unknown_codec_option_is_refused_with_the_nearest_names() -> None:
    with pytest.raises(ValueError, match=r"libx264 has no option 'presett'; did you mean 'preset'"):
        session(video_codec_options={"presett": "veryslow"})
    with pytest.raises(ValueError, match=r"mpeg4 has no option 'crf'"):
        session(video_codec="mpeg4", video_codec_options={"crf": "18"})
    # Generic codec options (g, threads) and private ones (crf, x264-params) are all known.
    session(video_codec_options={"g": "8", "threads": "1", "crf": "20", "x264-params": "ref=1"})


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_audio_is_refused(bad: float) -> None:
    wave = np.zeros(16000, dtype=np.float32)
    wave[100] = bad
    with pytest.raises(ValueError, match=r"audio_waveforms\[1\] must be finite, but 1 of its 16000"):
        session(audio_waveforms=[np.zeros(16000, np.float32), wave], audio_sample_rate=16000)


@pytest.mark.anyio
@pytest.mark.parametrize("shape", [(1, 3, 1, 0, 32), (1, 3, 1, 32, 0)])
async def test_a_chunk_without_pixels_is_refused_at_push(shape: tuple[int, ...]) -> None:
    async with session() as s:
        with pytest.raises(ValueError, match="at least 1×1 pixels"):
            await s.push(torch.zeros(shape))
        assert s.frames_pushed == 0


# -- non-finite latents: refused in the decode worker, before the first decoder step --


class _CountingDecoder:
    """A chunked decoder that records whether it was asked to decode (and publishes flat frames)."""

    chunk_value_range = (-1.0, 1.0)

    def __init__(self) -> None:
        self.decodes = 0

    def decode_with_chunks(self, z: torch.Tensor, *, on_chunk: Any) -> None:
        self.decodes += 1
        for _ in range(z.shape[2]):
            on_chunk(torch.zeros(z.shape[0], 3, 1, 16, 16))


@pytest.mark.anyio
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
async def test_non_finite_latents_are_refused_before_the_first_step(
    bad: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[int] = []
    check = _decode_worker.check_finite_latents

    def recording_check(z: torch.Tensor, *, owner: str) -> None:
        threads.append(threading.get_ident())
        check(z, owner=owner)

    monkeypatch.setattr(_decode_worker, "check_finite_latents", recording_check)
    z = torch.randn(1, 16, 3, 4, 4)
    z[0, 2, 1, 1, 1] = bad
    decoder = _CountingDecoder()
    with pytest.raises(ValueError, match=r"decode_to_mp4: z must be finite, but .* of its 768 values"):
        await decode_to_mp4(decoder, z, fps=16)
    with pytest.raises(ValueError, match=r"stream_mp4: z must be finite"):
        async with stream_mp4(decoder, z, fps=16) as (video,):
            async for _ in video:
                pass
    assert decoder.decodes == 0
    # A CUDA latent's check is a host synchronization: it runs in the decode worker, not on the loop.
    assert threads and threading.get_ident() not in threads


@pytest.mark.anyio
async def test_non_finite_latents_are_refused_for_a_diffusers_vae() -> None:
    vae = tiny_wan21()
    z = latent(vae, frames=3)
    z[0, 0, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="1 of its 3072 values are NaN and 0 are ±inf"):
        await decode_to_mp4(vae, z, fps=16)
    assert open_containers() == 0


# -- no silent hang --


@pytest.mark.anyio
async def test_push_from_thread_on_the_event_loop_thread_raises() -> None:
    async with session() as s:
        with pytest.raises(RuntimeError, match="on the event loop's thread"):
            s.push_from_thread(moving_pattern(0, 1))
        await s.push(moving_pattern(0, 1))  # the session is still usable
        (video,) = await s.finish()
    assert read_mp4(video).frames.shape[0] == 1


@pytest.fixture(scope="module")
def wan() -> Any:
    return tiny_wan21()


def batch_of_two(vae: Any) -> torch.Tensor:
    return latent(vae, batch=2, frames=9, h=2, w=2)  # 33 frames of 16×16 per entry


@pytest.mark.anyio
async def test_reading_entries_one_after_another_raises_naming_both(wan: Any) -> None:
    with anyio.fail_after(120):  # a hang guard: the point is that it does not hang
        with pytest.raises(UnreadStreamError, match="entry 0's reader .* entry 1's stream is full") as caught:
            async with stream_mp4(
                wan, batch_of_two(wan), fps=16, keyframe_interval=1, video_codec_options=PINNED
            ) as (first, second):
                async for _ in first:
                    pass
                async for _ in second:
                    pass
    assert (caught.value.waiting, caught.value.unread) == (0, 1)
    assert open_containers() == 0


@pytest.mark.anyio
async def test_read_entries_gives_every_entry_complete_in_arrival_order(wan: Any) -> None:
    z = batch_of_two(wan)
    parts: dict[int, list[bytes]] = {0: [], 1: []}
    order: list[int] = []
    with anyio.fail_after(120):  # hang guard
        async with stream_mp4(wan, z, fps=16, keyframe_interval=1, video_codec_options=PINNED) as streams:
            async for entry, data in read_entries(streams):
                parts[entry].append(data)
                order.append(entry)
    expected = await decode_to_mp4(
        wan, z, fps=16, output="fragmented", keyframe_interval=1, video_codec_options=PINNED
    )
    assert [b"".join(parts[0]), b"".join(parts[1])] == expected  # byte-identical, pieces in order
    assert set(order[:4]) == {0, 1}  # interleaved as written, not one entry after the other
    assert read_mp4(expected[1]).frames.shape[0] == 33


@pytest.mark.anyio
async def test_a_slow_concurrent_reader_is_not_mistaken_for_an_unread_entry(wan: Any) -> None:
    sizes = [0, 0]

    async def read(stream: MP4ByteStream, slow: bool) -> None:
        async for data in stream:
            sizes[stream.entry] += len(data)
            if slow:
                await anyio.sleep(0.2)  # a client on a slow link: busy, not gone

    with anyio.fail_after(120):  # hang guard
        async with (
            stream_mp4(
                wan,
                batch_of_two(wan),
                fps=16,
                keyframe_interval=1,
                max_buffered=1,
                video_codec_options=PINNED,
            ) as (first, second),
            anyio.create_task_group() as readers,
        ):
            readers.start_soon(read, first, False)
            readers.start_soon(read, second, True)
    assert all(sizes)


@pytest.mark.anyio
async def test_a_short_batch_read_one_entry_after_another_still_completes(wan: Any) -> None:
    # Two latent frames (5 frames): every piece of entry 1 fits its buffer, so nothing ever waits on it.
    z = latent(wan, batch=2, frames=2, h=2, w=2)
    videos = []
    async with stream_mp4(wan, z, fps=16, max_buffered=8, video_codec_options=PINNED) as (first, second):
        for stream in (first, second):
            videos.append(b"".join([data async for data in stream]))
    assert [read_mp4(v).frames.shape[0] for v in videos] == [5, 5]


@pytest.mark.anyio
async def test_a_second_concurrent_reader_of_one_stream_is_refused(wan: Any) -> None:
    got: list[bytes] = []
    refused = anyio.Event()

    async def first_reader(stream: MP4ByteStream) -> None:
        async for data in stream:
            got.append(data)

    async def second_reader(stream: MP4ByteStream) -> None:
        with pytest.raises(anyio.BusyResourceError):
            await stream.__anext__()
        with pytest.raises(anyio.BusyResourceError):
            async for _ in read_entries([stream]):
                pass
        refused.set()

    async with (
        session(output="fragmented", keyframe_interval=1, video_codec_options=PINNED) as s,
        anyio.create_task_group() as readers,
    ):
        stream = s.open_stream(0)
        readers.start_soon(first_reader, stream)
        await anyio.wait_all_tasks_blocked()  # the first reader is waiting inside the stream
        readers.start_soon(second_reader, stream)
        with anyio.fail_after(60):  # hang guard
            await refused.wait()
        for start in range(0, 9, 3):
            await s.push(moving_pattern(start, 3))
        await s.finish()
    assert read_mp4(b"".join(got)).frames.shape[0] == 9


@pytest.mark.anyio
async def test_read_entries_checks_its_argument() -> None:
    with pytest.raises(TypeError, match="non-empty sequence of MP4ByteStream"):
        async for _ in read_entries([]):
            pass
    async with session(output="fragmented") as a, session(output="fragmented") as b:
        with pytest.raises(ValueError, match="streams of one session"):
            async for _ in read_entries([a.open_stream(0), b.open_stream(0)]):
                pass


def test_the_failure_rule_never_closes_a_suspended_coroutine_or_generator_in_the_errors_traceback() -> None:
    # A session's error is raised on the event loop (to a reader) and in the decode thread (to the
    # producer): its traceback then holds the reader's suspended frames, and clearing a suspended frame
    # closes its coroutine. The failure rule clears only plain function frames.
    def holder() -> Any:
        try:
            raise ValueError("the session failed")
        except ValueError as error:
            caught = error
        yield caught  # suspended here, with this frame in the error's traceback
        yield "still running"

    suspended = holder()
    shared = next(suspended)

    def on_chunk(chunk: torch.Tensor) -> None:
        raise shared

    with pytest.raises(ValueError, match="the session failed"):
        publish_chunks(iter([torch.zeros(1, 3, 1, 2, 2)]), on_chunk)
    assert next(suspended) == "still running"
