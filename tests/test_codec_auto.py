"""``video_codec="auto"``: NVENC where it opens, else libx264, one codec a session, neutral options only."""

from __future__ import annotations

from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import av
import numpy as np
import pytest

from streamvae import ChunkedVideoMP4Session, SessionOptions, _encode_options
from streamvae._encode import EntryEncoder, open_entry_encoders
from streamvae._encode_options import (
    NVENC_PRESETS,
    auto_codec_options,
    auto_video_codec,
    check_video_codec,
    merge_codec_options,
)
from streamvae.testing import open_containers
from tests._media import read_mp4, wan_like_chunks

NVENC_OPENS_HERE = _encode_options._nvenc_encodes()
needs_no_nvenc = pytest.mark.skipif(NVENC_OPENS_HERE, reason="simulates an NVENC open that fails")


@pytest.fixture(autouse=True)
def fresh_probe(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test sees the process's probe not yet run (and leaves the real cache as it was)."""
    monkeypatch.setattr(_encode_options, "_auto_codec", None)
    yield


def nvenc_found_by_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe "found" NVENC: the session's own opens (real ones, failing on this machine) follow."""
    monkeypatch.setattr(_encode_options, "_auto_codec", "h264_nvenc")


async def encode_auto(output: Any = "mp4", batch: int = 2) -> tuple[list[bytes], ChunkedVideoMP4Session]:
    chunks = wan_like_chunks(3, batch=batch, height=32, width=48)
    options = {"threads": "1", "crf": "20", "preset": "ultrafast"}
    async with ChunkedVideoMP4Session(
        value_range=(-1, 1), fps=16, video_codec="auto", video_codec_options=options, output=output
    ) as session:
        assert session.encoder_name is None  # nothing opened before the first frame
        for chunk in chunks:
            await session.push(chunk)
        videos = await session.finish()
    return videos, session


@needs_no_nvenc
@pytest.mark.anyio
async def test_auto_chooses_libx264_without_nvenc_and_writes_valid_mp4s() -> None:
    videos, session = await encode_auto()
    assert session.encoder_name == "libx264"
    assert _encode_options._auto_codec == "libx264"
    for video in videos:
        assert read_mp4(video).frames.shape == (9, 32, 48, 3)


@pytest.mark.anyio
async def test_the_probe_runs_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    probes: list[None] = []

    def probe() -> bool:
        probes.append(None)
        return False

    monkeypatch.setattr(_encode_options, "_nvenc_encodes", probe)
    await encode_auto(batch=3)
    await encode_auto(batch=1)
    assert auto_video_codec() == "libx264"
    assert len(probes) == 1


@needs_no_nvenc
@pytest.mark.anyio
@pytest.mark.parametrize("output", ["mp4", "fragmented"])
async def test_a_session_whose_nvenc_open_fails_falls_back_to_libx264(
    monkeypatch: pytest.MonkeyPatch, output: str
) -> None:
    nvenc_found_by_probe(monkeypatch)
    videos, session = await encode_auto(output)
    assert session.encoder_name == "libx264"
    for video in videos:
        assert read_mp4(video).frames.shape == (9, 32, 48, 3)
    assert open_containers() == 0  # the failed NVENC containers were closed


@needs_no_nvenc
def test_a_session_never_mixes_codecs_when_a_later_entry_cannot_open_nvenc(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A GPU's NVENC session limit: the first entry's open succeeds, the next one's fails.
    nvenc_found_by_probe(monkeypatch)
    real_open = EntryEncoder._open
    nvenc_sessions: list[EntryEncoder] = []

    def open_one_nvenc_session(self: EntryEncoder, height: int, width: int, codec: str) -> None:
        if codec == "h264_nvenc" and not nvenc_sessions:
            real_open(self, height, width, "libx264")  # stands in for the one NVENC session there is
            self.encoder_name = "h264_nvenc"
            nvenc_sessions.append(self)
            return
        real_open(self, height, width, codec)

    monkeypatch.setattr(EntryEncoder, "_open", open_one_nvenc_session)
    threads = {"threads": "1"}
    encoders = [
        EntryEncoder(fps=Fraction(16), video_codec="auto", video_codec_options=threads) for _ in "abc"
    ]
    open_entry_encoders(encoders, (32, 48, 3))
    assert nvenc_sessions and [e.encoder_name for e in encoders] == ["libx264"] * 3
    frames = np.random.default_rng(0).integers(0, 256, (4, 32, 48, 3), dtype=np.uint8)
    for encoder in encoders:
        encoder.encode(frames)
        assert read_mp4(encoder.finish()).frames.shape == (4, 32, 48, 3)
    assert open_containers() == 0


@pytest.mark.parametrize(
    "options",
    [{"tune": "zerolatency"}, {"x264-params": "asm=0"}, {"cq": "20"}, {"rc": "vbr"}, {"qp": "0"}],
)
def test_auto_refuses_options_that_are_not_codec_neutral(options: dict[str, str]) -> None:
    (name,) = options
    with pytest.raises(ValueError, match=rf"{name!r} is not codec-neutral"):
        SessionOptions(value_range=(-1, 1), fps=16, video_codec="auto", video_codec_options=options)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"preset": "p4"}, "one of x264's presets"),
        ({"crf": "60"}, "crf must be a number from 0 to 51"),
        ({"crf": "high"}, "crf must be a number from 0 to 51"),
        ({"threads": "-1"}, "threads must be a whole number"),
    ],
)
def test_auto_refuses_neutral_options_with_values_one_encoder_lacks(
    options: dict[str, str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        SessionOptions(value_range=(-1, 1), fps=16, video_codec="auto", video_codec_options=options)


def test_auto_accepts_every_codec_neutral_option() -> None:
    options = {"crf": "23.5", "preset": "medium", "threads": "2", "g": "16"}
    assert SessionOptions(value_range=(-1, 1), fps=16, video_codec="auto", video_codec_options=options)


@pytest.mark.parametrize("output", ["mp4", "fragmented"])
def test_x264_takes_the_neutral_options_as_they_are(output: Any) -> None:
    options = {"crf": "23", "preset": "medium", "threads": "1"}
    assert auto_codec_options("libx264", options, output) == merge_codec_options("libx264", options, output)


def test_nvenc_gets_crf_as_constant_quality_and_a_preset_of_comparable_speed() -> None:
    options = auto_codec_options("h264_nvenc", {"crf": "23", "preset": "veryfast", "threads": "1", "g": "8"})
    assert options == {"rc": "vbr", "cq": "23", "b": "0", "preset": "p2", "threads": "1", "g": "8"}
    defaults = auto_codec_options("h264_nvenc", {}, "fragmented")
    assert defaults["cq"] == "18" and defaults["preset"] == "p2" and defaults["zerolatency"] == "1"


@pytest.mark.parametrize("output", ["mp4", "fragmented"])
def test_every_option_nvenc_gets_is_one_it_has(output: Any) -> None:
    for preset in NVENC_PRESETS:
        check_video_codec("h264_nvenc", auto_codec_options("h264_nvenc", {"preset": preset}, output))
    encoder = EntryEncoder(fps=Fraction(16), video_codec="h264_nvenc", keyframe_interval=16, output=output)
    check_video_codec("h264_nvenc", encoder.codec_options)


def test_the_preset_table_keeps_x264s_order_of_speed() -> None:
    assert list(NVENC_PRESETS)[:3] == ["ultrafast", "superfast", "veryfast"]
    levels = [int(p.removeprefix("p")) for p in NVENC_PRESETS.values()]
    assert levels == sorted(levels) and set(levels) == set(range(1, 8))


@needs_no_nvenc
@pytest.mark.anyio
async def test_h264_nvenc_by_name_reports_its_failure_to_open() -> None:
    with pytest.raises(av.FFmpegError):
        async with ChunkedVideoMP4Session(value_range=(-1, 1), fps=16, video_codec="h264_nvenc") as session:
            for chunk in wan_like_chunks(2, batch=1, height=32, width=32):
                await session.push(chunk)
            await session.finish()
    assert open_containers() == 0
