"""``video_codec="auto"``: NVENC where it opens, else libx264 (the ladder's first rungs; the rest are
tests/test_encoder_ladder.py's), one codec a session, neutral options only."""

from __future__ import annotations

from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import av
import numpy as np
import pytest

from streamvae import ChunkedVideoMP4Session, SessionOptions, _codec_options
from streamvae._codec_options import (
    NVENC_PRESETS,
    auto_codec_options,
    auto_video_codec,
    check_video_codec,
    merge_codec_options,
    with_keyframe_cadence,
)
from streamvae._encode import EntryEncoder, open_entry_encoders
from streamvae.testing import open_containers
from tests._media import read_mp4, wan_like_chunks

NVENC_OPENS_HERE = _codec_options.encode_failure("h264_nvenc") is None
needs_no_nvenc = pytest.mark.skipif(NVENC_OPENS_HERE, reason="simulates an NVENC open that fails")


@pytest.fixture(autouse=True)
def fresh_probe(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test sees the process's probes not yet run (and leaves the real cache as it was)."""
    monkeypatch.setattr(_codec_options, "_probed", {})
    yield


def nvenc_found_by_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe "found" NVENC: the session's own opens (real ones, failing on this machine) follow."""
    monkeypatch.setitem(_codec_options._probed, "h264_nvenc", None)


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
    assert session.encoder_name == session.statistics().encoder_name == "libx264"
    assert auto_video_codec() == "libx264"
    for video in videos:
        assert read_mp4(video).frames.shape == (9, 32, 48, 3)


@pytest.mark.anyio
async def test_each_rung_is_probed_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    probes: list[str] = []
    real_probe = _codec_options._probe

    def probe(codec: str) -> str | None:
        probes.append(codec)
        return "no NVENC here" if codec == "h264_nvenc" else real_probe(codec)

    monkeypatch.setattr(_codec_options, "_probe", probe)
    await encode_auto(batch=3)
    await encode_auto(batch=1)
    assert auto_video_codec() == "libx264"
    assert probes == ["h264_nvenc", "libx264"]  # the rungs below the first that works are never probed


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
        assert read_mp4(encoder.finish()[0].data).frames.shape == (4, 32, 48, 3)
    assert open_containers() == 0


@pytest.mark.parametrize(
    "options",
    [{"tune": "zerolatency"}, {"x264-params": "asm=0"}, {"cq": "20"}, {"rc": "vbr"}, {"qp": "0"}],
)
def test_auto_refuses_options_that_are_not_codec_neutral(options: dict[str, str]) -> None:
    (name,) = options
    with pytest.raises(ValueError, match=rf"{name!r} is not codec-neutral"):
        SessionOptions(value_range=(-1, 1), fps=16, video_codec="auto", video_codec_options=options)


# Values float(), int() or str.isdigit() take and no encoder does (or not both): other scripts' digits,
# superscripts, spaces, underscores, exponents, signs, inf and nan, numbers beyond a C int.
NOT_PLAIN = ["", " 18", "18 ", "18\n", "١٢", "²", "18_0", "1e1", "+18", "-1", "inf", "nan", "0x10", "18,5"]


@pytest.mark.parametrize(
    ("name", "value", "form"),
    [
        *[("crf", value, "a plain decimal from 0 to 51") for value in NOT_PLAIN],
        *[("crf", value, "a plain decimal from 0 to 51") for value in ["52", "51.5", "18.", ".5", "high"]],
        ("crf", "9" * 5000, "a plain decimal from 0 to 51"),
        *[("threads", value, "ASCII digits from 0 to 2147483647") for value in NOT_PLAIN],
        *[("threads", value, "ASCII digits from 0 to 2147483647") for value in ["1.0", "auto"]],
        ("threads", "2147483648", "ASCII digits from 0 to 2147483647"),  # one beyond a C int
        ("threads", "99999999999", "ASCII digits from 0 to 2147483647"),
        ("threads", "9" * 5000, "ASCII digits from 0 to 2147483647"),
        *[("g", value, "ASCII digits from 0 to 2147483647") for value in NOT_PLAIN],
        ("g", "2147483648", "ASCII digits from 0 to 2147483647"),
        ("g", "16.0", "ASCII digits from 0 to 2147483647"),
        *[("preset", value, "one of x264's presets") for value in ["p4", "VeryFast", " fast", "fast ", ""]],
    ],
)
def test_auto_refuses_neutral_option_values_an_encoder_would_not_take_before_any_work(
    name: str, value: str, form: str
) -> None:
    # Each passed the check once and failed every session at its first frame (a server: every request).
    match = rf"video_codec_options: {name} under video_codec='auto' must be {form}"
    with pytest.raises(ValueError, match=match):
        SessionOptions(value_range=(-1, 1), fps=16, video_codec="auto", video_codec_options={name: value})
    with pytest.raises(ValueError, match=match):
        ChunkedVideoMP4Session(
            value_range=(-1, 1), fps=16, video_codec="auto", video_codec_options={name: value}
        )
    assert open_containers() == 0


def test_a_refused_value_is_shown_cut_short() -> None:
    with pytest.raises(ValueError, match=r"got '9{24}'…$"):
        check_video_codec("auto", {"threads": "9" * 5000})


@pytest.mark.parametrize(
    "options",
    [
        {"crf": "0"},
        {"crf": "51"},
        {"crf": "51.0"},
        {"crf": "23.5"},
        {"crf": "018"},
        {"threads": "0"},  # the encoder's choice
        {"threads": "0001"},
        {"threads": "2147483647"},  # the C int's maximum: libx264 caps the threads it starts
        {"g": "0"},  # every frame a keyframe
        {"g": "2147483647"},
        {"preset": "ultrafast"},
        {"preset": "placebo"},
    ],
)
def test_every_neutral_value_auto_accepts_encodes(options: dict[str, str]) -> None:
    check_video_codec("auto", options)
    encoder = EntryEncoder(fps=Fraction(16), video_codec="auto", video_codec_options=options)
    frames = np.random.default_rng(0).integers(0, 256, (3, 32, 48, 3), dtype=np.uint8)
    encoder.encode(frames)
    assert read_mp4(encoder.finish()[0].data).frames.shape == (3, 32, 48, 3)


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


@pytest.mark.parametrize("output", ["mp4", "fragmented"])
def test_nvenc_holds_keyframe_interval_with_an_idr_every_n_frames_and_none_at_a_scene_cut(
    output: Any,
) -> None:
    # No NVENC here: what is checked is the translation, and that every option is one h264_nvenc has.
    cadence = {"g": "8", "no-scenecut": "1", "forced-idr": "1"}
    named = EntryEncoder(fps=Fraction(16), video_codec="h264_nvenc", keyframe_interval=8, output=output)
    assert named.codec_options.items() >= cadence.items()
    check_video_codec("h264_nvenc", named.codec_options)
    auto = with_keyframe_cadence("h264_nvenc", auto_codec_options("h264_nvenc", {"g": "8"}, output), 8)
    assert auto == auto_codec_options("h264_nvenc", {}, output) | cadence
    check_video_codec("h264_nvenc", auto)


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
