"""A named video encoder is refused at the door unless it can write the MP4 of the frames it would be fed."""

from __future__ import annotations

import io
from fractions import Fraction

import av
import numpy as np
import pytest

from streamvae import ChunkedVideoMP4Session, SessionOptions
from streamvae._codec_options import (
    ENCODER_PIXEL_FORMAT,
    VIDEO_RUNGS,
    check_video_codec,
    merge_codec_options,
    with_keyframe_cadence,
)
from streamvae._encode import EntryEncoder
from streamvae.testing import open_containers

FRAMES = np.random.default_rng(0).integers(0, 256, (3, 32, 48, 3), dtype=np.uint8)


def needs_encoder(codec: str) -> None:
    try:
        av.codec.Codec(codec, "w")
    except av.codec.codec.UnknownCodecError:
        pytest.skip(f"this PyAV build has no {codec} encoder")


def test_libx264rgb_is_refused_naming_the_frames_it_takes_before_any_work() -> None:
    # It passed the check once and failed to open at the first frame, once the decode had begun.
    message = (
        r"video_codec 'libx264rgb' takes bgr0, bgr24, rgb24 frames, but every encoder here is fed yuv420p "
        r"\(rgb24 frames are converted to it\); try 'libx264'"
    )
    with pytest.raises(ValueError, match=message):
        SessionOptions(value_range=(-1, 1), fps=16, video_codec="libx264rgb")
    for pixel_format in ("rgb24", "yuv420p"):
        with pytest.raises(ValueError, match=message):
            ChunkedVideoMP4Session(
                value_range=(-1, 1), fps=16, video_codec="libx264rgb", pixel_format=pixel_format
            )
    assert open_containers() == 0


@pytest.mark.parametrize(("codec", "takes"), [("png", "rgb24, rgba"), ("h264_qsv", "nv12, qsv")])
def test_an_encoder_that_takes_no_yuv420p_frames_is_refused(codec: str, takes: str) -> None:
    needs_encoder(codec)
    with pytest.raises(ValueError, match=rf"video_codec '{codec}' takes {takes}.* fed yuv420p"):
        check_video_codec(codec)


@pytest.mark.parametrize("codec", ["gif", "rawvideo", "h263", "bmp"])
def test_an_encoder_the_mp4_muxer_does_not_take_is_refused(codec: str) -> None:
    needs_encoder(codec)
    with pytest.raises(
        ValueError, match=rf"video_codec '{codec}': FFmpeg's MP4 muxer does not take its stream"
    ):
        check_video_codec(codec)


# Software encoders, so that an open fails only for what the check looks at (a hardware encoder fails to
# open without its device; the check lets it through). libx265 is left out: this build's x265 corrupts the
# heap now and then on tiny frames, whatever the check says.
@pytest.mark.parametrize(
    "codec",
    [
        "libx264",
        "h264",
        "libx264rgb",
        "mpeg4",
        "mpeg2video",
        "libvpx-vp9",
        "libsvtav1",
        "libaom-av1",
        "ffv1",
        "jpeg2000",
        "png",
        "gif",
        "rawvideo",
        "h263",
        "bmp",
    ],
)
def test_the_check_passes_exactly_the_encoders_that_write_an_mp4(codec: str) -> None:
    needs_encoder(codec)
    try:
        check_video_codec(codec)
        passed = True
    except ValueError:
        passed = False
    encoder = EntryEncoder(fps=Fraction(25), video_codec=codec)
    try:
        encoder.encode(FRAMES)
        encoder.finish()
        wrote = True
    except (av.FFmpegError, ValueError):
        encoder.close()
        wrote = False
    assert passed == wrote
    assert open_containers() == 0


def test_every_encoder_is_fed_yuv420p_frames_from_either_pixel_format() -> None:
    # What the check holds each encoder to is what it encodes, rgb24 chunks and planar yuv420p alike.
    for pixel_format, frames in (("rgb24", FRAMES), ("yuv420p", np.zeros((3, 48, 48), np.uint8))):
        encoder = EntryEncoder(
            fps=Fraction(16), pixel_format=pixel_format, video_codec_options={"threads": "1"}
        )
        encoder.encode(frames)
        with av.open(io.BytesIO(encoder.finish()[0].data)) as container:
            assert container.streams.video[0].codec_context.pix_fmt == ENCODER_PIXEL_FORMAT


# -- keyframe_interval: one cadence, in each encoder's terms --


@pytest.mark.parametrize("codec", [*(rung.name for rung in VIDEO_RUNGS), "libx265"])
def test_every_rungs_cadence_is_made_of_options_it_has(codec: str) -> None:
    needs_encoder(codec)
    for output in ("mp4", "fragmented"):
        options = with_keyframe_cadence(codec, merge_codec_options(codec, {}, output), 8)
        check_video_codec(codec, options)
        assert options["g"] == "8"


def test_the_cadence_replaces_what_would_add_keyframes_and_merges_into_parameter_lists() -> None:
    # A scene-cut threshold of the user's would bring keyframes at cuts back: the cadence replaces it.
    x264 = with_keyframe_cadence("libx264", {"sc_threshold": "40", "crf": "20"}, 8)
    assert x264 == {"sc_threshold": "0", "crf": "20", "g": "8", "keyint_min": "8"}
    # In svtav1-params and x265-params only the keys it names: the user's others (and lp, rtc) stay.
    svt = with_keyframe_cadence("libsvtav1", {"svtav1-params": "lp=2:keyint=3:tune=0"}, 8)
    assert svt["svtav1-params"] == "lp=2:keyint=8:tune=0:scd=0"
    x265 = with_keyframe_cadence("libx265", {"x265-params": "ref=1:scenecut=40"}, 8)
    assert x265["x265-params"] == "ref=1:scenecut=0:open-gop=0"
    # A g of the user's own sets the interval (0: every frame); one that is no plain number does not.
    assert with_keyframe_cadence("libvpx-vp9", {"g": "4"}, 8) == {"g": "4", "keyint_min": "4"}
    assert with_keyframe_cadence("libvpx-vp9", {"g": "0"}, 8) == {"g": "1", "keyint_min": "1"}
    assert with_keyframe_cadence("libvpx-vp9", {"g": "4x"}, 8) == {"g": "8", "keyint_min": "8"}
    # An encoder without a rung gets the GOP alone.
    assert with_keyframe_cadence("mpeg4", {"qscale": "3"}, 8) == {"qscale": "3", "g": "8"}


def test_keyframe_interval_reaches_a_named_encoder_and_an_encoder_without_a_rung() -> None:
    named = EntryEncoder(fps=Fraction(16), video_codec="libvpx-vp9", keyframe_interval=5)
    assert named.codec_options["g"] == named.codec_options["keyint_min"] == "5"
    frames = np.random.default_rng(1).integers(0, 256, (11, 32, 48, 3), dtype=np.uint8)
    for codec in ("libvpx-vp9", "mpeg4"):
        needs_encoder(codec)
        encoder = EntryEncoder(fps=Fraction(16), video_codec=codec, keyframe_interval=5)
        encoder.encode(frames)
        with av.open(io.BytesIO(encoder.finish()[0].data)) as container:
            keyframes = [i for i, frame in enumerate(container.decode(video=0)) if frame.key_frame]
        if codec == "mpeg4":  # no rung: the GOP holds, and noise is a scene cut at every frame to it
            assert {0, 5, 10} <= set(keyframes)
        else:
            assert keyframes == [0, 5, 10]
