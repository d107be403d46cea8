"""``video_codec="auto"``'s ladder on machines that lack encoders: h264_nvenc → libx264 → libsvtav1 →
libvpx-vp9, and Opus where there is no AAC.

Rungs are made absent where PyAV opens them (``tests/_absent_encoders``), so what PyAV can open still
decides. Every case is checked by PyAV decoding the MP4 — every frame against the frames given, the sound's
pitch and duration against the waveform's — and the codec string against what PyAV reads from the stream.
The CLI runs as a child process with the same PyAV; the server in this process under uvicorn; Chromium's
Media Source page is tests/test_browser_ladder.py's.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import sys
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import anyio
import av
import httpx
import numpy as np
import pytest
import torch

from streamvae import (
    ChunkedVideoMP4Session,
    MP4ByteStream,
    MP4Piece,
    NoEncoderError,
    SessionOptions,
    StreamVAEError,
    _codec_options,
)
from streamvae._codec_options import VIDEO_RUNGS, auto_codec_options, check_video_codec, video_rung
from streamvae._encode import EntryEncoder
from streamvae._fragments import codec_string
from streamvae.cli import main
from streamvae.server import create_app
from streamvae.testing import open_containers
from tests._absent_encoders import NO_GPL_NO_AAC, absent_encoders, child_environment
from tests._media import moving_pattern, psnr, read_mp4, to_rgb_uint8, wan_like_chunks, written_pieces
from tests._server import running_server

#: the ladder's encoders, in the order video_codec="auto" climbs them
LADDER = tuple(rung.name for rung in VIDEO_RUNGS)

FPS, SIZE, RATE = 16, 64, 44_100
#: what each machine lacks → the rung that opens there and how its codec string starts
MACHINES = {
    "av1": (NO_GPL_NO_AAC, "libsvtav1", "av01."),
    "vp9": ((*NO_GPL_NO_AAC, "libsvtav1"), "libvpx-vp9", "vp09."),
}
#: how long any one wait may take before the test fails instead of hanging (never a speed check)
HANG = 120.0


def tone(seconds: float, hertz: float = 440.0, rate: int = RATE) -> np.ndarray:
    """A stereo sine at ``rate``, float32 [2, samples]."""
    wave = 0.5 * np.sin(2 * np.pi * hertz * np.arange(int(seconds * rate)) / rate)
    return np.stack([wave, wave]).astype(np.float32)


def sound_of(data: bytes) -> tuple[str, int, np.ndarray]:
    """The audio track PyAV decodes: (codec, sample rate, samples [channels, n])."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        samples = np.concatenate([frame.to_ndarray() for frame in container.decode(stream)], axis=1)
        return stream.codec_context.name, stream.codec_context.sample_rate, samples


def pitch(samples: np.ndarray, rate: int) -> float:
    """The strongest frequency of the first channel, in Hz."""
    spectrum = np.abs(np.fft.rfft(samples[0] * np.hanning(samples.shape[1])))
    return float(np.argmax(spectrum) * rate / samples.shape[1])


def expected_codecs(data: bytes, audio: str | None) -> str:
    """The RFC 6381 string of ``data``'s tracks, built from what PyAV reads of the video stream."""
    with av.open(io.BytesIO(data)) as container:
        video = container.streams.video[0].codec_context
        name, profile, level = video.name, video.profile, video.level
    if name == "h264":
        string = f"avc1.{dict(High=0x64, Main=0x4D)[profile]:02x}00{level:02x}"
    elif name in ("libdav1d", "av1"):
        string = f"av01.{dict(Main=0, High=1)[profile]}.{level:02d}M.08"
    else:
        assert (name, profile) == ("vp9", "Profile 0")  # PyAV knows no VP9 level: vpcC's is FFmpeg's own
        string = "vp09.00."
    return string if audio is None else f"{string}, {audio}"


# -- the library --


async def encode(
    output: Any, *, batch: int = 1, audio: bool = False
) -> tuple[list[bytes], ChunkedVideoMP4Session, list[MP4Piece]]:
    """A ``video_codec="auto"`` session of 9 frames (with a 44.1 kHz tone): its MP4s, the session, and
    entry 0's pieces as its stream handed them on (fragmented output; none for a plain MP4)."""
    chunks = wan_like_chunks(3, batch=batch, height=SIZE, width=SIZE)
    sound = {"audio_waveforms": [tone(9 / FPS)] * batch, "audio_sample_rate": RATE} if audio else {}
    pieces: list[list[MP4Piece]] = [[] for _ in range(batch)]

    async def read(stream: MP4ByteStream) -> None:
        async for piece in stream.pieces():
            pieces[stream.entry].append(piece)

    async with (
        ChunkedVideoMP4Session(
            value_range=(-1, 1), fps=FPS, video_codec="auto", output=output, **sound
        ) as session,
        anyio.create_task_group() as readers,
    ):
        if output == "fragmented":
            for entry in range(batch):
                readers.start_soon(read, session.open_stream(entry))
        for chunk in chunks:
            await session.push(chunk)
        videos = await session.finish()
    if output == "fragmented":
        videos = [b"".join(piece.data for piece in entry) for entry in pieces]
    return videos, session, pieces[0]


@pytest.mark.anyio
@pytest.mark.parametrize("output", ["fragmented", "mp4"])
@pytest.mark.parametrize("machine", sorted(MACHINES))
async def test_auto_opens_the_next_rung_and_the_sound_is_opus_at_48_khz(
    monkeypatch: pytest.MonkeyPatch, machine: str, output: str
) -> None:
    absent, rung, prefix = MACHINES[machine]
    absent_encoders(monkeypatch, absent)
    videos, session, pieces = await encode(output, audio=True)
    assert session.encoder_name == session.statistics().encoder_name == rung
    (video,) = videos
    decoded = read_mp4(video)
    reference = to_rgb_uint8(torch.cat(wan_like_chunks(3, height=SIZE, width=SIZE), dim=2))[0]
    assert decoded.frames.shape == (9, SIZE, SIZE, 3) and psnr(decoded.frames, reference) > 30
    # The sound: Opus at 48 kHz, resampled from 44.1 kHz (same pitch), starting with the video and as long.
    codec, rate, samples = sound_of(video)
    assert (codec, rate) == ("opus", 48_000)
    assert pitch(samples, rate) == pytest.approx(440, abs=15)
    assert decoded.audio_start == pytest.approx(0, abs=1 / FPS)
    assert decoded.audio_duration == pytest.approx(decoded.video_duration, abs=1 / FPS)
    # The codec string the init segment carries, as the piece that holds it hands it on.
    codecs = pieces[0].codecs if output == "fragmented" else codec_string(video)
    assert codecs.startswith(prefix) and codecs.startswith(expected_codecs(video, None))
    assert codecs.endswith(", opus") and codec_string(video) == codecs
    assert open_containers() == 0


@pytest.mark.anyio
async def test_a_rung_whose_open_fails_after_its_probe_gives_way_for_every_entry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # SVT-AV1's probe passed, then the session's own open of it fails: every entry opens VP9 instead.
    absent_encoders(monkeypatch, ("libx264", "libsvtav1"))
    monkeypatch.setitem(_codec_options._probed, "libsvtav1", None)
    videos, session, pieces = await encode("fragmented", batch=2)
    assert session.encoder_name == "libvpx-vp9" and pieces[0].codecs.startswith("vp09.00.")
    for video in videos:
        assert read_mp4(video).frames.shape == (9, SIZE, SIZE, 3)
    assert open_containers() == 0


@pytest.mark.anyio
async def test_a_live_track_is_opus_too_and_ends_with_the_video(monkeypatch: pytest.MonkeyPatch) -> None:
    absent_encoders(monkeypatch, NO_GPL_NO_AAC)
    sound = tone(9 / FPS)[:1]
    per_frame = RATE / FPS
    async with ChunkedVideoMP4Session(
        value_range=(-1, 1),
        fps=FPS,
        video_codec="auto",
        output="fragmented",
        audio_channels=1,
        audio_sample_rate=RATE,
    ) as session:
        received: list[bytes] = []

        async def read(stream: MP4ByteStream) -> None:
            received.extend([data async for data in stream])

        async with anyio.create_task_group() as readers:
            readers.start_soon(read, session.open_stream(0))
            start = 0
            for chunk in wan_like_chunks(3, height=SIZE, width=SIZE):
                end = start + chunk.shape[2]
                session.push_audio(sound[:, round(start * per_frame) : round(end * per_frame)])
                await session.push(chunk)
                start = end
            await session.finish()
    video = b"".join(received)
    decoded = read_mp4(video)
    codec, rate, samples = sound_of(video)
    assert (codec, rate, decoded.audio_channels) == ("opus", 48_000, 1)
    assert pitch(samples, rate) == pytest.approx(440, abs=15)
    assert decoded.audio_duration == pytest.approx(decoded.video_duration, abs=1 / FPS)


def test_where_aac_exists_the_track_stays_aac_at_the_waveforms_own_rate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    absent_encoders(monkeypatch, ("libx264",))
    encoder = EntryEncoder(fps=Fraction(FPS), video_codec="auto", audio=tone(0.25), audio_sample_rate=RATE)
    encoder.encode(np.zeros((4, 32, 32, 3), np.uint8))
    (piece,) = encoder.finish()
    assert (encoder.encoder_name, encoder.audio_codec) == ("libsvtav1", "aac")
    assert sound_of(piece.data)[:2] == ("aac", RATE)
    assert piece.codecs == codec_string(piece.data) == f"{expected_codecs(piece.data, None)}, mp4a.40.2"


@pytest.mark.anyio
async def test_a_named_encoder_that_is_missing_is_refused_before_any_work(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    absent_encoders(monkeypatch, NO_GPL_NO_AAC)
    message = (
        r"video_codec 'libx264' is not an encoder of this PyAV build \(FFmpeg .*\); try 'auto' "
        r"\(the first of h264_nvenc, libx264, libsvtav1, libvpx-vp9 that works here\)$"
    )
    with pytest.raises(ValueError, match=message):
        SessionOptions(value_range=(-1, 1), fps=FPS, video_codec="libx264")
    with pytest.raises(ValueError, match=message):
        ChunkedVideoMP4Session(
            value_range=(-1, 1), fps=FPS, video_codec="libx264", output_files=[tmp_path / "x.mp4"]
        )
    assert list(tmp_path.iterdir()) == [] and open_containers() == 0
    SessionOptions(value_range=(-1, 1), fps=FPS, video_codec="libsvtav1")  # a rung that is there, by name


@pytest.mark.anyio
async def test_without_any_encoder_one_error_names_every_rung_tried(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    absent_encoders(monkeypatch, LADDER)
    output = tmp_path / "x.mp4"
    with pytest.raises(NoEncoderError) as raised:
        async with ChunkedVideoMP4Session(
            value_range=(-1, 1), fps=FPS, video_codec="auto", output_files=[output]
        ) as session:
            await session.push(wan_like_chunks(1, height=32, width=32)[0])
            await session.finish()
    error = raised.value
    assert isinstance(error, StreamVAEError) and isinstance(error, RuntimeError)
    assert [codec for codec, _ in error.tried] == list(LADDER)  # NVENC included, in order
    assert str(error).startswith("no video encoder works in this PyAV build (FFmpeg ")
    assert "; ".join(f"{codec}: not an encoder of this PyAV build" for codec in LADDER) in str(error)
    assert str(pickle.loads(pickle.dumps(error))) == str(error)  # it crosses to another rank whole
    assert list(tmp_path.iterdir()) == [] and open_containers() == 0


def test_without_an_audio_encoder_the_error_names_aac_and_opus(monkeypatch: pytest.MonkeyPatch) -> None:
    absent_encoders(monkeypatch, ("aac", "libopus"))
    encoder = EntryEncoder(fps=Fraction(FPS), video_codec="auto", audio=tone(0.1), audio_sample_rate=RATE)
    with pytest.raises(
        NoEncoderError, match=r"no audio encoder works .*: tried aac: .*; libopus: "
    ) as raised:
        encoder.encode(np.zeros((2, 32, 32, 3), np.uint8))
    assert raised.value.kind == "audio" and open_containers() == 0


# -- each rung's settings --


@pytest.mark.parametrize("rung", ["libx264", "libsvtav1", "libvpx-vp9"])
def test_every_rung_sends_each_frame_with_the_next_one_in_fragmented_output(rung: str) -> None:
    # Low delay: no frame is held back for later ones (x264 zerolatency, SVT-AV1 rtc, VP9 no lag).
    encoder = EntryEncoder(fps=Fraction(FPS), video_codec="auto", output="fragmented", keyframe_interval=16)
    frames = np.ascontiguousarray(to_rgb_uint8(moving_pattern(0, 6, height=32, width=48))[0])
    encoder.open(32, 48, rung)
    pieces = []
    for index in range(len(frames)):
        pieces += encoder.encode(frames[index : index + 1])
        assert encoder.frames_out == index  # every frame before this one has left
    data = b"".join(piece.data for piece in [*pieces, *encoder.finish()])
    assert encoder.frames_out == 6 and encoder.encoder_name == rung
    assert psnr(read_mp4(data).frames, frames) > 25
    record = video_rung(rung)
    assert record is not None and pieces[0].codecs is not None
    assert pieces[0].codecs.startswith(f"{record.codecs}.")  # the codec string the rung table gives


NEUTRAL_VALUES = [
    {"crf": "0"},
    {"crf": "51"},
    {"crf": "23.5"},
    {"threads": "0"},
    {"threads": "2147483647"},
    {"g": "2147483647"},
    {"preset": "ultrafast"},
    {"preset": "placebo"},
]


@pytest.mark.parametrize("output", ["mp4", "fragmented"])
@pytest.mark.parametrize("rung", ["libsvtav1", "libvpx-vp9"])
def test_every_neutral_value_encodes_on_each_rung_with_options_it_has(rung: str, output: Any) -> None:
    frames = np.random.default_rng(0).integers(0, 256, (2, 32, 48, 3), dtype=np.uint8)
    for options in NEUTRAL_VALUES:
        check_video_codec("auto", options)
        check_video_codec(rung, auto_codec_options(rung, options, output))  # options this encoder has
        encoder = EntryEncoder(
            fps=Fraction(FPS), video_codec="auto", video_codec_options=options, output=output
        )
        encoder.open(32, 48, rung)
        pieces = encoder.encode(frames)
        data = b"".join(piece.data for piece in [*pieces, *encoder.finish()])
        assert read_mp4(data).frames.shape == (2, 32, 48, 3), options


def sizes_and_keyframes(rung: str, options: dict[str, str]) -> tuple[int, list[bool]]:
    encoder = EntryEncoder(fps=Fraction(FPS), video_codec="auto", video_codec_options=options)
    encoder.open(64, 64, rung)
    rgb = to_rgb_uint8(torch.cat(wan_like_chunks(2, height=64, width=64), dim=2))[0]
    encoder.encode(np.ascontiguousarray(rgb))
    (piece,) = encoder.finish()
    with av.open(io.BytesIO(piece.data)) as container:
        keyframes = [p.is_keyframe for p in container.demux(video=0) if p.size]
    return len(piece.data), keyframes


@pytest.mark.parametrize("rung", ["libsvtav1", "libvpx-vp9"])
def test_the_neutral_options_mean_on_each_rung_what_they_mean_on_x264(rung: str) -> None:
    assert sizes_and_keyframes(rung, {"g": "0"})[1] == [True] * 5  # every frame (SVT-AV1 takes it as g 1)
    assert sizes_and_keyframes(rung, {"g": "16"})[1] == [True, False, False, False, False]
    finer, coarser = sizes_and_keyframes(rung, {"crf": "10"})[0], sizes_and_keyframes(rung, {"crf": "40"})[0]
    assert finer > coarser  # a lower crf is finer, as on x264


#: keyframe_interval's cadence: a clip of 33 frames with a hard cut to another picture at frame 13, which
#: is no multiple of the interval 8 (an encoder left to itself puts a keyframe there)
INTERVAL, CLIP, CUT = 8, 33, 13


def scene_cut_clip() -> torch.Tensor:
    """``CLIP`` frames [1, 3, T, SIZE, SIZE] in [-1, 1]: a moving pattern, then from ``CUT`` still bars."""
    before = moving_pattern(0, CUT, height=SIZE, width=SIZE)
    bars = torch.where(torch.arange(SIZE) // 8 % 2 == 0, 0.9, -0.9) * torch.tensor([1, -1, 0.3])[:, None]
    after = bars[None, :, None, None, :].expand(1, 3, CLIP - CUT, SIZE, SIZE)
    return torch.cat([before, after], dim=2).contiguous()


def decoded_keyframes(data: bytes) -> list[int]:
    """The indices of the frames PyAV decodes as keyframes."""
    with av.open(io.BytesIO(data)) as container:
        return [index for index, frame in enumerate(container.decode(video=0)) if frame.key_frame]


def test_left_to_itself_x264_puts_a_keyframe_at_the_cut() -> None:
    # What the cadence must overcome: the clip's cut is one x264 sees (a GOP of 8 alone restarts there), so
    # a cadence that holds below is not the clip's doing.
    encoder = EntryEncoder(fps=Fraction(FPS), video_codec_options={"g": str(INTERVAL)})
    encoder.encode(np.ascontiguousarray(to_rgb_uint8(scene_cut_clip())[0]))
    (piece,) = encoder.finish()
    assert CUT in decoded_keyframes(piece.data)


@pytest.mark.anyio
@pytest.mark.parametrize("rung", ["libx264", "libsvtav1", "libvpx-vp9"])
async def test_keyframe_interval_puts_a_keyframe_exactly_every_n_frames_scene_cuts_included(
    rung: str,
) -> None:
    clip = scene_cut_clip()
    groups = [clip[:, :, start : start + 4] for start in range(0, CLIP, 4)]
    pieces = await written_pieces(
        groups,
        value_range=(-1, 1),
        fps=FPS,
        video_codec=rung,
        output="fragmented",
        keyframe_interval=INTERVAL,
        fragment_frames=4,
    )
    keyframes = decoded_keyframes(b"".join(piece.data for piece in pieces))
    assert keyframes == list(range(0, CLIP, INTERVAL))  # 0, 8, 16, 24, 32: none at the cut
    # Each piece says whether its first frame is one (what a playlist marks INDEPENDENT).
    video = [piece for piece in pieces if piece.frames]
    starts = [piece.frames_until - piece.frames for piece in video]
    assert [piece.keyframe for piece in video] == [start in keyframes for start in starts]
    assert sum(piece.keyframe for piece in video) == len(keyframes) and not pieces[-1].keyframe  # the mfra


def test_a_named_rung_takes_its_own_options_over_its_low_latency_defaults() -> None:
    encoder = EntryEncoder(
        fps=Fraction(FPS), video_codec="libsvtav1", video_codec_options={"preset": "12"}, output="fragmented"
    )
    assert encoder.codec_options["preset"] == "12" and encoder.codec_options["svtav1-params"].endswith(
        "rtc=1"
    )
    with pytest.raises(ValueError, match="video_codec_options: libvpx-vp9 has no option 'tune-x'"):
        SessionOptions(
            value_range=(-1, 1), fps=FPS, video_codec="libvpx-vp9", video_codec_options={"tune-x": "1"}
        )


def test_the_codec_string_is_read_whole_or_not_at_all() -> None:
    sound = {"audio": tone(0.25), "audio_sample_rate": RATE}
    encoder = EntryEncoder(fps=Fraction(FPS), output="fragmented", video_codec="libx264", **sound)
    frames = np.ascontiguousarray(to_rgb_uint8(moving_pattern(0, 4, height=32, width=32))[0])
    first, *rest = [*encoder.encode(frames), *encoder.finish()]
    whole = f"{expected_codecs(first.data, None)}, mp4a.40.2"
    assert first.codecs == codec_string(first.data) == whole and all(piece.codecs is None for piece in rest)
    # Any cut of the init segment: the whole string once the moov is all there, else none (never a part).
    for cut in range(0, len(first.data), 5):
        assert codec_string(first.data[:cut]) in (None, whole)
    assert codec_string(b"") is None and codec_string(rest[0].data) is None  # no moov


@pytest.mark.anyio
async def test_a_content_type_the_route_gives_is_sent_as_given() -> None:
    from starlette.applications import Starlette
    from starlette.routing import Route

    from streamvae import stream_mp4
    from streamvae.demo import demo_latent, demo_vae
    from streamvae.server import MP4Response

    def video(request: object) -> MP4Response:
        streams = stream_mp4(demo_vae(), demo_latent(5, 16, 0), fps=FPS, output="fragmented")
        return MP4Response(streams, headers={"Content-Type": "video/mp4; profile=mine"})

    app = Starlette(routes=[Route("/video.mp4", video)])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client:
        with anyio.fail_after(HANG):
            response = await client.get("/video.mp4")
    assert response.headers["content-type"] == "video/mp4; profile=mine"
    assert read_mp4(response.content).frames.shape[0] == 5


# -- the command line and the server --


def run_child(args: Sequence[str], absent: Sequence[str]) -> subprocess.CompletedProcess[str]:
    command = Path(sys.executable).with_name("streamvae")  # the console script `make demo` runs
    argv = [str(command)] if command.exists() else [sys.executable, "-m", "streamvae"]
    env = child_environment(absent)
    return subprocess.run([*argv, *args], capture_output=True, text=True, env=env, timeout=HANG)


def test_the_demo_command_writes_av1_where_x264_and_aac_are_absent(tmp_path: Path) -> None:
    output = tmp_path / "demo.mp4"
    result = run_child(["demo", "-o", str(output), "--frames", "9", "--size", "32", "--quiet"], NO_GPL_NO_AAC)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith(" (libsvtav1)")  # the summary names the encoder
    assert "Svt[info]" not in result.stderr  # the command keeps SVT-AV1's banner quiet
    assert read_mp4(output.read_bytes()).frames.shape == (9, 32, 32, 3)
    assert codec_string(output.read_bytes()).startswith("av01.0.")


def test_the_command_without_any_encoder_says_so_in_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    absent_encoders(monkeypatch, LADDER)
    output = tmp_path / "demo.mp4"
    assert main(["demo", "-o", str(output), "--frames", "5", "--size", "32", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert (
        err.startswith("streamvae: error: no video encoder works in this PyAV build") and err.count("\n") == 1
    )
    assert all(f"{codec}: not an encoder" in err for codec in LADDER)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_the_server_streams_the_rung_over_http_and_the_websocket_with_sound(
    monkeypatch: pytest.MonkeyPatch, machine: str
) -> None:
    from websockets.sync import client as sync_client

    absent, _, prefix = MACHINES[machine]
    absent_encoders(monkeypatch, absent)
    with running_server(create_app(session_options={"video_codec": "auto"})) as url:
        response = httpx.get(f"{url}/video.mp4?frames=9&size=32&seed=0", timeout=HANG)
        with sync_client.connect(url.replace("http", "ws") + "/v1/realtime/video") as websocket:
            start = {"type": "session.start", "num_frames": 9, "width": 32, "height": 32, "audio": True}
            websocket.send(json.dumps({**start, "step_seconds": 0}))
            started = json.loads(websocket.recv(timeout=HANG))
            pieces = []
            while (message := json.loads(websocket.recv(timeout=HANG)))["type"] == "video.chunk_metadata":
                pieces.append(websocket.recv(timeout=HANG))
    # HTTP: the Content-Type names what was encoded; the body decodes to every frame.
    assert response.status_code == 200
    assert response.headers["content-type"] == f'video/mp4; codecs="{codec_string(response.content)}"'
    assert codec_string(response.content).startswith(prefix)
    assert read_mp4(response.content).frames.shape == (9, 32, 32, 3)
    # The WebSocket: video.start's config carries the init segment's codec string, with Opus beside it.
    video = b"".join(pieces)
    assert message["type"] == "session.done" and started["type"] == "video.start"
    assert started["config"]["codecs"] == codec_string(video) and started["config"]["codecs"].startswith(
        prefix
    )
    assert started["config"]["codecs"].endswith(", opus")
    decoded = read_mp4(video)
    assert decoded.frames.shape == (9, 32, 32, 3)
    assert decoded.audio_duration == pytest.approx(decoded.video_duration, abs=1 / FPS)
    assert sound_of(video)[:2] == ("opus", 48_000)


def test_the_environment_variable_reaches_a_child_before_streamvae_does() -> None:
    # The patch a child's sitecustomize applies is the one these tests use in-process.
    code = "import streamvae._codec_options as c; print(c.encode_failure('libx264'), c.auto_video_codec())"
    env = child_environment(["libx264"])
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=HANG
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[0] == "not an encoder of this PyAV build libsvtav1"
    assert os.environ.get("STREAMVAE_TEST_ABSENT_ENCODERS") is None  # this process keeps every encoder
