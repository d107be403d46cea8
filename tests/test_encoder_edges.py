"""The encoder's edges: frame sizes an encoder hangs at or refuses, a wedged encoder and a cancelled caller,
audio rates the encoder does not take, option values FFmpeg refuses, and the encoders' own banners."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import wave
from collections.abc import AsyncIterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import anyio
import av
import numpy as np
import pytest
import torch

from streamvae import ChunkedVideoMP4Session, SessionOptions, _codec_options
from streamvae._codec_options import check_video_codec
from streamvae._encode import EntryEncoder
from streamvae.cli import main
from streamvae.demo import demo_latent
from streamvae.server import Interactions, RealtimePiece
from streamvae.testing import foreign_threads, open_containers
from tests._absent_encoders import absent_encoders, child_environment
from tests._media import count_frames, moving_pattern, read_mp4
from tests._vaes import latent, tiny_wan21
from tests._websocket import HANG, app_of, check_pieces, connect

ROOT = Path(__file__).resolve().parent.parent
#: What a build without GPL parts lacks (and NVENC, which needs an NVIDIA GPU): "auto" starts at SVT-AV1.
NO_X264 = ("h264_nvenc", "libx264", "libx265")


async def encoded(height: int, width: int, frames: int = 3, **options: Any) -> tuple[bytes, str | None]:
    """One entry's MP4 of ``frames`` frames of ``height``×``width``, and the encoder that wrote it."""
    with anyio.fail_after(HANG):  # hang guard: the encoder's worker is a wait a cancel leaves
        async with ChunkedVideoMP4Session(value_range=(-1, 1), fps=16, **options) as session:
            await session.push(moving_pattern(0, frames, height=height, width=width))
            (video,) = await session.finish()
    return video, session.encoder_name


# -- SVT-AV1 on frames of few rows (or columns) --


@pytest.mark.anyio
@pytest.mark.parametrize("size", [(16, 128), (128, 16), (24, 1920), (4, 64)])
async def test_svt_av1_encodes_frames_with_a_short_side(size: tuple[int, int]) -> None:
    # SVT-AV1 never returned from such frames at more than one thread (lp=4 here, 2 by default).
    video, encoder = await encoded(*size, video_codec="libsvtav1", video_codec_options={"threads": "4"})
    assert encoder == "libsvtav1"
    assert read_mp4(video).frames.shape == (3, *size, 3)


@pytest.mark.anyio
async def test_svt_av1_encodes_frames_with_a_short_side_whatever_lp_the_user_asked() -> None:
    options = {"svtav1-params": "lp=6:rtc=1"}
    video, _ = await encoded(
        16, 128, video_codec="libsvtav1", video_codec_options=options, output="fragmented"
    )
    assert count_frames(video) == 3


@pytest.mark.anyio
async def test_a_named_svt_av1_refuses_frames_under_4_pixels_at_the_first_chunk() -> None:
    with pytest.raises(ValueError, match=r"video_codec='libsvtav1': .*at least 4×4 pixels, got 2×64"):
        await encoded(2, 64, video_codec="libsvtav1")


@pytest.mark.anyio
async def test_auto_without_x264_encodes_short_frames_with_svt_av1(monkeypatch: pytest.MonkeyPatch) -> None:
    absent_encoders(monkeypatch, NO_X264)
    video, encoder = await encoded(16, 128, video_codec="auto")
    assert encoder == "libsvtav1"
    assert read_mp4(video).frames.shape == (3, 16, 128, 3)


@pytest.mark.anyio
async def test_auto_climbs_past_a_rung_that_cannot_take_the_size(monkeypatch: pytest.MonkeyPatch) -> None:
    absent_encoders(monkeypatch, NO_X264)
    video, encoder = await encoded(2, 64, video_codec="auto")
    assert encoder == "libvpx-vp9"  # SVT-AV1 takes no side under 4: the next rung made the video
    assert read_mp4(video).frames.shape == (3, 2, 64, 3)


#: Run in a child process: each size through an entry's encoder (3 frames, then finish), one JSON line a
#: size as it starts and one as it ends, so a hang names its size.
_SCAN = """
import json, sys
from fractions import Fraction
import numpy as np
from streamvae._encode import EntryEncoder

codec, sizes = sys.argv[1], json.loads(sys.argv[2])
for height, width in sizes:
    print(json.dumps(["start", height, width]), flush=True)
    encoder = EntryEncoder(fps=Fraction(16), video_codec=codec, video_codec_options={"threads": "4"})
    frames = np.random.default_rng(height * 1000 + width).integers(0, 256, (3, height, width, 3), np.uint8)
    try:
        encoder.encode(frames)
        pieces = encoder.finish()
        outcome = ["encoded", len(pieces[0].data)]
    except ValueError as error:
        outcome = ["refused", str(error)]
    finally:
        encoder.close()
    print(json.dumps([*outcome, height, width]), flush=True)
"""

#: Even sizes (the video is yuv420p): short sides from 2 to 40 against long ones up to 130, both ways.
_SCAN_SIZES = sorted(
    {
        size
        for short in (2, 4, 6, 8, 10, 12, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34, 40)
        for long in (2, 4, 8, 16, 24, 32, 34, 62, 64, 66, 96, 128, 130)
        for size in ((short, long), (long, short))
    }
)


@pytest.mark.slow  # a child process per codec
@pytest.mark.parametrize("codec", ["libsvtav1", "libvpx-vp9"])
def test_a_scan_of_small_and_odd_sizes_encodes_or_refuses_every_size_and_none_hangs(codec: str) -> None:
    try:
        run = subprocess.run(
            [sys.executable, "-c", _SCAN, codec, json.dumps(_SCAN_SIZES)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=600,  # hang guard: the whole scan takes seconds
        )
    except subprocess.TimeoutExpired as expired:
        started = [json.loads(line) for line in (expired.stdout or b"").decode().splitlines()]
        pytest.fail(f"{codec} hung at {started[-1][1:] if started else 'its first size'}")
    assert run.returncode == 0, run.stderr[-2000:]
    ended = [line for line in map(json.loads, run.stdout.splitlines()) if line[0] != "start"]
    outcomes = {(height, width): (kind, detail) for kind, detail, height, width in ended}
    assert sorted(outcomes) == _SCAN_SIZES
    for (height, width), (kind, detail) in outcomes.items():
        if codec == "libsvtav1" and min(height, width) < 4:
            assert kind == "refused" and f"at least 4×4 pixels, got {height}×{width}" in detail
        else:
            assert kind == "encoded" and detail > 0, (height, width, detail)


# -- a wedged encoder and a cancelled caller --


@pytest.mark.anyio
async def test_a_cancelled_caller_gets_out_while_the_encoders_worker_is_wedged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entered, release = threading.Event(), threading.Event()
    wedged: list[threading.Thread] = []
    containers = open_containers()

    def never_returning_finish(self: EntryEncoder) -> Any:
        # What SVT-AV1 did on short frames: a call into C that does not return, and no cancel reaches.
        wedged.append(threading.current_thread())
        entered.set()
        release.wait()
        raise RuntimeError("released by the test")

    monkeypatch.setattr(EntryEncoder, "_finish", never_returning_finish)
    try:
        with anyio.fail_after(HANG):  # hang guard: before the change, nothing got out
            with anyio.CancelScope() as caller:
                async with ChunkedVideoMP4Session(value_range=(-1, 1), fps=16) as session:
                    await session.push(moving_pattern(0, 3, height=32, width=32))
                    async with anyio.create_task_group() as group:

                        async def cancel_once_wedged() -> None:
                            await anyio.to_thread.run_sync(entered.wait)
                            caller.cancel()

                        group.start_soon(cancel_once_wedged)
                        await session.finish()
            # Out (after the grace the session gives a call in flight): the caller's cancel, and nothing else.
            assert caller.cancelled_caught
        assert wedged, "the encode never reached the wedged call"
        assert wedged[0].is_alive()  # the call is still in the encoder's worker
        assert open_containers() == containers + 1  # held by the call: nothing freed under it
    finally:
        release.set()
    if wedged:
        await anyio.to_thread.run_sync(wedged[0].join)
    assert open_containers() == containers  # the call released it when it returned


@pytest.mark.anyio
async def test_a_cancelled_session_waits_for_the_encode_in_flight_and_leaves_nothing_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entered, release = threading.Event(), threading.Event()
    encode = EntryEncoder._encode

    def slow_encode(self: EntryEncoder, frames: Any) -> Any:
        entered.set()
        release.wait()  # released once the caller is cancelled: an encode a moment from returning
        return encode(self, frames)

    monkeypatch.setattr(EntryEncoder, "_encode", slow_encode)
    containers, threads = open_containers(), foreign_threads()
    with anyio.fail_after(HANG):  # hang guard
        with anyio.CancelScope() as caller:
            async with ChunkedVideoMP4Session(value_range=(-1, 1), fps=16) as session:
                await session.push(moving_pattern(0, 3, height=32, width=32))
                await anyio.to_thread.run_sync(entered.wait)
                caller.cancel()
                release.set()
                await session.finish()
    assert caller.cancelled_caught
    assert open_containers() == containers
    assert foreign_threads() <= threads


# -- audio rates the encoder does not take --


def tone(seconds: float, rate: int, channels: int = 1) -> np.ndarray:
    t = np.arange(round(seconds * rate)) / rate
    return np.stack([0.3 * np.sin(2 * np.pi * 440 * t)] * channels).astype(np.float32)


def audio_rate(video: bytes) -> int:
    with av.open(io.BytesIO(video)) as container:
        return int(container.streams.audio[0].rate)


@pytest.mark.anyio
@pytest.mark.parametrize(("rate", "encoded_at"), [(192_000, 96_000), (44_000, 44_100), (1000, 7350)])
async def test_live_audio_at_a_rate_aac_does_not_take_is_resampled(rate: int, encoded_at: int) -> None:
    with anyio.fail_after(HANG):
        async with ChunkedVideoMP4Session(
            value_range=(-1, 1), fps=16, audio_channels=1, audio_sample_rate=rate
        ) as session:
            session.push_audio(tone(9 / 16, rate))
            await session.push(moving_pattern(0, 9, height=32, width=32))
            (video,) = await session.finish()
    decoded = read_mp4(video)
    assert decoded.frames.shape[0] == 9
    assert audio_rate(video) == encoded_at
    assert decoded.audio_duration == pytest.approx(9 / 16, abs=1 / 16)


@pytest.mark.anyio
async def test_a_whole_waveform_at_192_khz_is_resampled() -> None:
    video, _ = await encoded(
        32, 32, frames=9, audio_waveforms=[tone(9 / 16, 192_000, channels=2)], audio_sample_rate=192_000
    )
    assert audio_rate(video) == 96_000
    assert read_mp4(video).audio_duration == pytest.approx(9 / 16, abs=1 / 16)


@pytest.mark.parametrize("rate", [1, 999, 768_001])
def test_an_audio_rate_no_encoder_can_be_fed_is_refused_at_the_door(rate: int) -> None:
    with pytest.raises(
        ValueError, match=rf"audio_sample_rate must be an int from 1000 to 768000, got {rate}"
    ):
        SessionOptions(value_range=(-1, 1), fps=16, audio_channels=1, audio_sample_rate=rate)
    with pytest.raises(ValueError, match=rf"audio_sample_rate .* got {rate}"):
        SessionOptions(value_range=(-1, 1), fps=16, audio_waveforms=[tone(0.1, 8000)], audio_sample_rate=rate)


@pytest.mark.anyio
async def test_a_websocket_generators_sound_at_44_khz_reaches_the_video(vae: Any, no_leaks: None) -> None:
    rate, latent = 44_000, demo_latent(9, 16, 0)

    async def sound_at_44_khz(start: dict[str, Any], interactions: Interactions) -> AsyncIterator[Any]:
        for step, frames in enumerate((1, 4, 4)):
            sound = torch.from_numpy(tone(frames / 16, rate))
            yield RealtimePiece(latent[:, :, step : step + 1], sound, rate)

    async with connect(app_of(vae, generator=sound_at_44_khz)) as client:
        await client.send_json({"type": "session.start"})
        started = await client.receive_json()
        assert started["type"] == "video.start", started
        pieces, done = await client.receive_until_done()
    video = check_pieces(pieces, started["request_id"], 9)
    assert done["type"] == "session.done"
    assert audio_rate(video) == 44_100
    assert read_mp4(video).audio_duration == pytest.approx(9 / 16, abs=1 / 16)


def test_the_cli_decodes_with_a_192_khz_wav(tmp_path: Path) -> None:
    vae = tiny_wan21()
    vae_dir = tmp_path / "vae"
    vae.save_pretrained(vae_dir)
    latents = tmp_path / "latents.pt"
    torch.save(latent(vae, frames=2), latents)
    audio = tmp_path / "tone.wav"
    with wave.open(str(audio), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(192_000)
        wav.writeframes((tone(0.5, 192_000)[0] * 32767).astype("<i2").tobytes())
    output = tmp_path / "out.mp4"
    args = ["decode", str(latents), "-o", str(output), "--vae", str(vae_dir), "--audio", str(audio)]
    assert main([*args, "--fps", "16", "--device", "cpu", "--quiet"]) == 0
    video = output.read_bytes()
    assert audio_rate(video) == 96_000
    assert read_mp4(video).audio_duration == pytest.approx(5 / 16, abs=1 / 16)


# -- option values FFmpeg refuses --


@pytest.mark.parametrize(
    ("codec", "options", "named"),
    [
        ("libx264", {"crf": "banana"}, "crf='banana'"),
        ("libx264", {"preset": "sideways", "g": "16"}, "preset='sideways'"),
        ("libsvtav1", {"crf": "x"}, "crf='x'"),
        ("libvpx-vp9", {"deadline": "soon"}, "deadline='soon'"),
        ("libvpx-vp9", {"lossless": "1"}, "lossless='1' with streamvae's crf='22', b='0'"),  # only together
    ],
)
def test_an_option_value_ffmpeg_refuses_is_a_value_error_at_the_door(
    codec: str, options: dict[str, str], named: str
) -> None:
    with pytest.raises(ValueError, match=f"video_codec_options: {codec} refuses {named}"):
        SessionOptions(value_range=(-1, 1), fps=16, video_codec=codec, video_codec_options=options)


def test_a_refusal_at_the_door_is_not_remembered_and_a_pass_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hardware encoder's test open fails while its GPU is busy: the next session's check opens again."""
    busy = ["video_codec_options: libx264 refuses preset='veryfast' (FFmpeg: the device is busy)"]
    calls = []

    def refused_option(codec: str, given: dict[str, str], others: dict[str, str]) -> str | None:
        calls.append(codec)
        return busy.pop() if busy else None

    monkeypatch.setattr(_codec_options, "refused_option", refused_option)
    options = {"preset": "veryfast", "threads": "3"}  # a set no other test checks (the cache is per process)
    with pytest.raises(ValueError, match="the device is busy"):
        check_video_codec("libx264", options)
    check_video_codec("libx264", options)  # opened again: the GPU is free now
    check_video_codec("libx264", options)  # the pass is remembered
    assert calls == ["libx264", "libx264"]


def test_the_encoders_own_refusal_at_open_names_the_option_its_value_and_the_encoder() -> None:
    # Past the door (an encoder built directly): the open's refusal is FFmpeg's, named.
    encoder = EntryEncoder(fps=Fraction(16), video_codec="libx264", video_codec_options={"crf": "banana"})
    try:
        with pytest.raises(
            ValueError, match=r"video_codec_options: libx264 refuses crf='banana' \(FFmpeg: "
        ) as error:
            encoder.encode(np.zeros((1, 32, 32, 3), np.uint8))
    finally:
        encoder.close()
    assert isinstance(error.value.__cause__, av.FFmpegError)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("codec", "options"),
    [
        (
            "libx264",
            {"g": "8", "sc_threshold": "0", "keyint_min": "8", "crf": "18+1", "x264-params": "ref=2"},
        ),
        ("libx265", {"x265-params": "scenecut=0", "crf": "30"}),
        ("libsvtav1", {"svtav1-params": "lp=2:tune=0", "preset": "12", "g": "8"}),
        ("libvpx-vp9", {"deadline": "realtime", "cpu-used": "8", "row-mt": "1", "lag-in-frames": "0"}),
    ],
)
async def test_every_option_ffmpeg_takes_still_passes(codec: str, options: dict[str, str]) -> None:
    video, encoder = await encoded(32, 64, video_codec=codec, video_codec_options=options)
    assert encoder == codec
    assert count_frames(video) == 3


# -- the encoders' banners --

#: Run in a child process: a session with ``codec``; its stderr (fd 2, where the encoders' C code writes) is
#: captured, and it prints the encoder that opened.
_ENCODE = """
import sys, anyio
from streamvae import ChunkedVideoMP4Session
from tests._media import moving_pattern

async def main():
    options = dict(arg.split("=", 1) for arg in sys.argv[2:])
    async with ChunkedVideoMP4Session(
        value_range=(-1, 1), fps=16, video_codec=sys.argv[1], video_codec_options=options
    ) as session:
        await session.push(moving_pattern(0, 3, height=64, width=64))
        await session.finish()
    print(session.encoder_name)

anyio.run(main)
"""


def encoded_in_a_child(
    codec: str, *options: str, absent: tuple[str, ...] = (), environment: dict[str, str] | None = None
) -> tuple[str, str]:
    """The encoder a child process's session with ``codec`` opened (PyAV there lacking ``absent``), and
    what it wrote to fd 2."""
    env = child_environment(absent)
    env.pop("SVT_LOG", None)  # this process's setting (streamvae's, once it opened SVT-AV1), gone
    run = subprocess.run(
        [sys.executable, "-c", _ENCODE, codec, *options],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**env, **(environment or {})},
        timeout=300,  # hang guard
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.strip(), run.stderr


def test_svt_log_is_set_once_per_process_where_the_user_set_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_codec_options, "_environment_set", set())  # as in a fresh process
    monkeypatch.delenv("SVT_LOG", raising=False)
    _codec_options.quiet_encoder_logs("libx264")  # a rung without a log variable
    assert "SVT_LOG" not in os.environ
    _codec_options.quiet_encoder_logs("libsvtav1")
    assert os.environ["SVT_LOG"] == "1"
    monkeypatch.delenv("SVT_LOG")  # later opens leave the environment alone: set once per process
    _codec_options.quiet_encoder_logs("libsvtav1")
    assert "SVT_LOG" not in os.environ


@pytest.mark.slow  # a fresh interpreter per case
@pytest.mark.parametrize(
    ("codec", "absent", "opened"),
    [("libx265", (), "libx265"), ("libsvtav1", (), "libsvtav1"), ("auto", NO_X264, "libsvtav1")],
)
def test_an_encoders_banner_stays_off_stderr(codec: str, absent: tuple[str, ...], opened: str) -> None:
    assert encoded_in_a_child(codec, absent=absent) == (opened, "")  # "auto": SVT-AV1's probe, then its open


@pytest.mark.slow  # a fresh interpreter
def test_an_encoders_banner_comes_back_when_asked() -> None:
    _, x265 = encoded_in_a_child("libx265", "x265-params=log-level=info")
    assert "x265 [info]: HEVC encoder version" in x265
    _, svt = encoded_in_a_child("libsvtav1", environment={"SVT_LOG": "3"})
    assert "Svt[info]: SVT [version]" in svt
