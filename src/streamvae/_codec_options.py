"""What a video encoder is configured with: codec defaults and checks, and ``video_codec="auto"`` (its
probe, and the codec-neutral options it takes).

Everything here is decided before an encoder opens (``SessionOptions`` checks with it); ``_encode`` opens
the container and the codec with it.
"""

from __future__ import annotations

import functools
import io
import os
import re
import threading
from collections.abc import Mapping
from fractions import Fraction
from typing import Any, Literal

import av

from streamvae._checks import did_you_mean

__all__ = [
    "CODEC_NEUTRAL_OPTIONS",
    "ENCODER_PIXEL_FORMAT",
    "MAX_CRF",
    "NVENC_PRESETS",
    "X264_PRESETS",
    "OutputKind",
    "auto_codec_options",
    "auto_video_codec",
    "check_video_codec",
    "default_codec_options",
    "merge_codec_options",
]

#: ``"mp4"``: one complete MP4 with the moov at the front, available at the end.
#: ``"fragmented"``: fragmented MP4 (moov first, then a fragment every few frames), available as written.
OutputKind = Literal["mp4", "fragmented"]

#: Encoders that look ahead and reorder frames unless told not to (their ``tune`` takes "zerolatency").
_LOOKAHEAD_ENCODERS = frozenset({"libx264", "libx265"})


def default_codec_options(codec: str, output: OutputKind = "mp4") -> dict[str, str]:
    """Options that keep an x264/x265 encode up with a GPU decode: crf 18, veryfast, a bounded thread count;
    for fragmented output also ``tune=zerolatency``.

    The thread count is ``min(4, cores)``; pin ``threads`` yourself for byte-identical output across machines.
    zerolatency turns off frame reordering (B-frames) and the lookahead, so the first packet comes out with
    frame 0 instead of ~11 frames later: a streamed frame is only worth something once it has left.
    """
    if codec not in _LOOKAHEAD_ENCODERS:
        return {}
    options = {"crf": "18", "preset": "veryfast", "threads": str(min(4, os.cpu_count() or 1))}
    if output == "fragmented":
        options["tune"] = "zerolatency"
    return options


@functools.cache
def _codec_option_names(codec: str) -> frozenset[str]:
    options = av.codec.CodecContext.create(codec, "w").supported_options
    return frozenset(option.name for option in (*options.generic, *options.private))


#: The pixel format every video encoder is fed: rgb24 frames are converted to it (BT.709) on the way.
ENCODER_PIXEL_FORMAT = "yuv420p"


def check_video_codec(codec: object, options: Mapping[str, str] | None = None) -> None:
    """Raise ValueError unless ``codec`` names a video encoder of this PyAV build that can write this
    library's video, and every key of ``options`` is an option that encoder has (FFmpeg would silently
    ignore an unknown one).

    It can when the MP4 muxer takes its stream and it takes :data:`ENCODER_PIXEL_FORMAT` frames, which
    every encoder is opened for: one that takes only RGB (``libx264rgb``, ``png``) would refuse to open
    at the first frame, once the decode had begun. An encoder that names no pixel formats (hardware and
    wrapper encoders) is let through; its open says.
    """
    if not isinstance(codec, str) or not codec:
        raise ValueError(f"video_codec must be an FFmpeg video encoder name such as 'libx264', got {codec!r}")
    if codec == "auto":
        _check_neutral_options(options or {})
        return
    try:
        encoder = av.codec.Codec(codec, "w")
    except av.codec.codec.UnknownCodecError:
        raise ValueError(
            f"video_codec {codec!r} is not an encoder of this PyAV build "
            f"(FFmpeg {av.ffmpeg_version_info}); try 'libx264'"
        ) from None
    if encoder.type != "video":
        raise ValueError(
            f"video_codec {codec!r} is an {encoder.type} encoder, not a video encoder; try 'libx264'"
        )
    if encoder.name not in _mp4_codecs():
        raise ValueError(f"video_codec {codec!r}: FFmpeg's MP4 muxer does not take its stream; try 'libx264'")
    formats = encoder.video_formats
    if formats is not None and ENCODER_PIXEL_FORMAT not in {f.name for f in formats}:
        taken = ", ".join(f.name for f in formats[:6]) + (", …" if len(formats) > 6 else "")
        raise ValueError(
            f"video_codec {codec!r} takes {taken} frames, but every encoder here is fed "
            f"{ENCODER_PIXEL_FORMAT} (rgb24 frames are converted to it); try 'libx264'"
        )
    known = _codec_option_names(codec)
    for name in options or {}:
        if name not in known:
            hint = did_you_mean(name, sorted(known), most=3)
            raise ValueError(f"video_codec_options: {codec} has no option {name!r}{hint}")


@functools.cache
def _mp4_codecs() -> frozenset[str]:
    """The codecs FFmpeg's MP4 muxer takes a stream of (``avformat_query_codec``, as ``add_stream`` asks)."""
    container = av.open(io.BytesIO(), mode="w", format="mp4")
    try:
        return frozenset(container.supported_codecs)
    finally:
        container.close()


# Options that choose another rate control than the default crf (x264 would let crf win over them).
_RATE_CONTROL_OPTIONS = {"qp", "b", "bitrate", "cqp"}


def merge_codec_options(
    codec: str, options: Mapping[str, str] | None, output: OutputKind = "mp4"
) -> dict[str, str]:
    """The user's codec options over :func:`default_codec_options`; the default crf is left out when the
    user picked another rate control (``qp``, ``b``), which x264 would otherwise ignore in favour of crf.
    A user's ``tune`` replaces the default zerolatency (and so may bring the lookahead back)."""
    merged = default_codec_options(codec, output)
    options = dict(options or {})
    if _RATE_CONTROL_OPTIONS & options.keys():
        merged.pop("crf", None)
    return {**merged, **options}


#: The options ``video_codec="auto"`` accepts: each means the same whichever encoder it chooses.
CODEC_NEUTRAL_OPTIONS = ("crf", "preset", "threads", "g")

#: x264's presets → NVENC's (p1 fastest … p7 slowest), by comparable speed.
NVENC_PRESETS = {
    "ultrafast": "p1",
    "superfast": "p1",
    "veryfast": "p2",
    "faster": "p3",
    "fast": "p3",
    "medium": "p4",
    "slow": "p5",
    "slower": "p6",
    "veryslow": "p7",
    "placebo": "p7",
}
#: x264's presets, fastest first.
X264_PRESETS = tuple(NVENC_PRESETS)
#: The largest crf x264 takes (0 is lossless).
MAX_CRF = 51


#: The largest ``threads`` and ``g`` both libx264 and h264_nvenc open with: FFmpeg keeps each in a C int
#: (one more is "out of range" at open). libx264 caps the threads it starts (67 at 1080p, from 1000 up).
_MAX_C_INT = 2**31 - 1
#: ASCII digits, with an optional fraction: ``float()`` also takes " 18", "1e1", "18_0", "inf", "nan" and
#: other scripts' digits, some of which FFmpeg refuses
_PLAIN_DECIMAL = re.compile(r"[0-9]+(\.[0-9]+)?")
#: ASCII digits alone: ``str.isdigit()`` also takes "²" and "١٢", which FFmpeg does not
_PLAIN_DIGITS = re.compile(r"[0-9]+")


def _check_neutral_options(options: Mapping[str, str]) -> None:
    """Raise ValueError unless every option is codec-neutral, with a value both encoders take.

    Each value has one plain form: a value either encoder refuses would pass the check and fail every
    session at its first frame (a server: every request a 500).
    """
    for name, value in options.items():
        if name not in CODEC_NEUTRAL_OPTIONS:
            raise ValueError(
                f"video_codec_options: {name!r} is not codec-neutral: video_codec='auto' may choose "
                f"h264_nvenc or libx264, and accepts only {', '.join(CODEC_NEUTRAL_OPTIONS)} "
                "(name the codec to pass its own options)"
            )
        if name == "preset" and value not in X264_PRESETS:
            raise ValueError(
                f"video_codec_options: preset under video_codec='auto' must be one of x264's presets: "
                f"{', '.join(X264_PRESETS)}; got {_shown(value)}"
            )
        if name == "crf" and not (_PLAIN_DECIMAL.fullmatch(value) and float(value) <= MAX_CRF):
            raise ValueError(
                f"video_codec_options: crf under video_codec='auto' must be a plain decimal from 0 to "
                f"{MAX_CRF}, such as '18' or '23.5', got {_shown(value)}"
            )
        if name in ("threads", "g") and not _is_c_int_digits(value):
            meaning = "0: the encoder's choice" if name == "threads" else "0: every frame a keyframe"
            raise ValueError(
                f"video_codec_options: {name} under video_codec='auto' must be ASCII digits from 0 to "
                f"{_MAX_C_INT} ({meaning}), got {_shown(value)}"
            )


def _is_c_int_digits(value: str) -> bool:
    # More digits than a C int has is out of range whatever they are (and int() of thousands is refused).
    digits = value.lstrip("0")
    return bool(_PLAIN_DIGITS.fullmatch(value)) and len(digits) <= 10 and int(digits or "0") <= _MAX_C_INT


def _shown(value: str) -> str:
    """``value`` as an error shows it: no megabyte of it."""
    return repr(value) if len(value) <= 24 else repr(value[:24]) + "…"


def auto_codec_options(
    codec: str, options: Mapping[str, str] | None, output: OutputKind = "mp4"
) -> dict[str, str]:
    """The options ``codec`` gets under ``video_codec="auto"``: the codec-neutral ``options`` over x264's
    defaults (crf 18, veryfast), translated for NVENC.

    libx264 takes them as they are. h264_nvenc: ``crf`` N → ``rc=vbr``, ``cq`` N, ``b=0`` (constant
    quality on NVENC's own, roughly comparable, scale), ``preset`` through :data:`NVENC_PRESETS`, and for
    fragmented output ``zerolatency`` (no reordering delay), as x264 gets ``tune=zerolatency``.
    """
    if codec != "h264_nvenc":
        return merge_codec_options(codec, options, output)
    merged = {**default_codec_options("libx264"), **(options or {})}
    translated = {name: value for name, value in merged.items() if name not in ("crf", "preset")}
    translated.update(rc="vbr", cq=merged["crf"], b="0", preset=NVENC_PRESETS[merged["preset"]])
    if output == "fragmented":
        translated["zerolatency"] = "1"
    return translated


_auto_lock = threading.Lock()
_auto_codec: str | None = None


def auto_video_codec() -> str:
    """What ``video_codec="auto"`` chooses on this machine: ``"h264_nvenc"`` if a tiny encode with it works
    (probed once per process, then cached), else ``"libx264"``.

    Without an NVENC block (no NVIDIA GPU, or a data-centre one: H100, H200, A100) the open fails in about
    a millisecond.
    """
    global _auto_codec
    with _auto_lock:
        if _auto_codec is None:
            _auto_codec = "h264_nvenc" if _nvenc_encodes() else "libx264"
        return _auto_codec


def _nvenc_encodes() -> bool:
    """Encode two 64×64 frames with h264_nvenc: whether it works here."""
    try:
        context: Any = av.codec.CodecContext.create("h264_nvenc", "w")
        context.width = context.height = 64
        context.pix_fmt = "yuv420p"
        context.time_base = Fraction(1, 16)
        context.open()
        for pts in range(2):
            frame = av.VideoFrame(64, 64, "yuv420p")
            frame.pts = pts
            context.encode(frame)
        context.encode(None)
    except (av.FFmpegError, av.codec.codec.UnknownCodecError):
        return False
    return True
