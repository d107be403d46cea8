"""What an encoder is configured with: codec defaults and checks, ``video_codec="auto"`` (its probe and
codec-neutral options), the frame rate, waveforms, fragmenting.

Everything here is decided before an encoder opens (``SessionOptions`` checks with it); ``_encode`` uses
it to open the container and the codec.
"""

from __future__ import annotations

import difflib
import functools
import io
import os
import threading
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any, Literal

import av
import numpy as np

__all__ = [
    "CODEC_NEUTRAL_OPTIONS",
    "MAX_FPS",
    "MIN_FPS",
    "NVENC_PRESETS",
    "OutputKind",
    "as_fps",
    "auto_codec_options",
    "auto_video_codec",
    "check_video_codec",
    "check_waveform",
    "container_options",
    "default_codec_options",
    "faststart_io_open",
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


def check_video_codec(codec: object, options: Mapping[str, str] | None = None) -> None:
    """Raise ValueError unless ``codec`` names a video encoder of this PyAV build and every key of
    ``options`` is an option that encoder has (FFmpeg would silently ignore an unknown one)."""
    if not isinstance(codec, str) or not codec:
        raise ValueError(f"video_codec must be an FFmpeg video encoder name such as 'libx264', got {codec!r}")
    if codec == "auto":
        _check_neutral_options(options or {})
        return
    try:
        kind = av.codec.Codec(codec, "w").type
    except av.codec.codec.UnknownCodecError:
        raise ValueError(
            f"video_codec {codec!r} is not an encoder of this PyAV build "
            f"(FFmpeg {av.ffmpeg_version_info}); try 'libx264'"
        ) from None
    if kind != "video":
        raise ValueError(f"video_codec {codec!r} is an {kind} encoder, not a video encoder; try 'libx264'")
    known = _codec_option_names(codec)
    for name in options or {}:
        if name not in known:
            nearest = difflib.get_close_matches(name, known, n=3)
            hint = f"; did you mean {' or '.join(map(repr, nearest))}?" if nearest else ""
            raise ValueError(f"video_codec_options: {codec} has no option {name!r}{hint}")


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


def _check_neutral_options(options: Mapping[str, str]) -> None:
    """Raise ValueError unless every option is codec-neutral, with a value both encoders take."""
    for name in options:
        if name not in CODEC_NEUTRAL_OPTIONS:
            raise ValueError(
                f"video_codec_options: {name!r} is not codec-neutral: video_codec='auto' may choose "
                f"h264_nvenc or libx264, and accepts only {', '.join(CODEC_NEUTRAL_OPTIONS)} "
                "(name the codec to pass its own options)"
            )
    if "preset" in options and options["preset"] not in X264_PRESETS:
        raise ValueError(
            f"video_codec_options: preset {options['preset']!r} under video_codec='auto' must be one of "
            f"x264's presets: {', '.join(X264_PRESETS)}"
        )
    if "crf" in options:
        try:
            crf = float(options["crf"])
        except ValueError:
            crf = -1.0
        if not 0 <= crf <= MAX_CRF:
            raise ValueError(
                f"video_codec_options: crf must be a number from 0 to {MAX_CRF}, got {options['crf']!r}"
            )
    for name in ("threads", "g"):
        if name in options and not options[name].isdigit():
            raise ValueError(f"video_codec_options: {name} must be a whole number, got {options[name]!r}")


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


_FRAGMENT_FLAGS = "empty_moov+default_base_moof+frag_every_frame"


def container_options(output: OutputKind, fps: Fraction, fragment_frames: int = 1) -> dict[str, str]:
    """The mov muxer's options: faststart for a plain MP4; for fragmented MP4 a fragment every
    ``fragment_frames`` frames, whatever the keyframes.

    FFmpeg's mov muxer closes a fragment only when the next packet arrives (PyAV has no call that flushes
    one on demand): ``frag_every_frame`` closes it at the very next packet, and ``min_frag_duration``
    (half a frame under ``fragment_frames`` frames) keeps it open until it holds that many. The gate is
    needed even for one frame a fragment: an audio packet that closes a fragment holding a single video
    frame leaves that frame with a duration of 0 and shifts the ones after it (FFmpeg 8.1).
    ``delay_moov``: the moov waits for the first packets, so it carries the edit list that starts every
    track at 0 (AAC's priming, or B-frames a user turned back on, would otherwise shift the timeline).
    """
    if output != "fragmented":
        return {"movflags": "+faststart"}
    microseconds = (Fraction(fragment_frames) - Fraction(1, 2)) / fps * 1_000_000
    return {"movflags": _FRAGMENT_FLAGS + "+delay_moov", "min_frag_duration": str(int(microseconds))}


def faststart_io_open(memory: io.BytesIO) -> Callable[[str, int, object], io.BytesIO]:
    """The ``io_open`` of a plain MP4 written into ``memory``.

    faststart rewrites the file to move the moov up front: FFmpeg reopens it for reading, and a snapshot of
    what was written so far is exactly what that second pass reads. A closure over the buffer alone: a bound
    method of the encoder would make encoder → stream → container → encoder a cycle that only the garbage
    collector frees: a server then grew by the x264 state of every MP4 it had written.
    """

    def io_open(url: str, flags: int, options: object) -> io.BytesIO:
        if flags & 2:  # AVIO_FLAG_WRITE
            return memory
        return io.BytesIO(memory.getvalue())

    return io_open


#: The frame rates a session accepts. Outside them the MP4 time base is not representable (1e-4 fps rounds
#: to 0 with denominators up to 1001) or FFmpeg's muxer writes a file its own demuxer reads wrongly.
MIN_FPS, MAX_FPS = Fraction(1, 1000), Fraction(1000)


def as_fps(fps: object) -> Fraction:
    """``fps`` as an exact rational (23.976 → 2997/125, 30000/1001 stays), or ValueError unless it is a
    number between 1/1000 and 1000."""
    if isinstance(fps, bool) or not isinstance(fps, (int, float, Fraction)):
        raise ValueError(f"fps must be a number of frames per second, got {fps!r}")
    if fps != fps or not MIN_FPS <= fps <= MAX_FPS:
        raise ValueError(f"fps must be a number between 1/1000 and 1000 frames per second, got {fps!r}")
    return Fraction(fps).limit_denominator(1001)


def check_waveform(waveform: object, *, name: str) -> np.ndarray[Any, np.dtype[np.float32]]:
    """A waveform as float32 ``[channels, samples]`` (1 or 2 channels), or a ValueError naming ``name``."""
    if hasattr(waveform, "detach"):  # a torch tensor
        waveform = waveform.detach().cpu().float().numpy()  # type: ignore[attr-defined]
    if not isinstance(waveform, np.ndarray) or not np.issubdtype(waveform.dtype, np.floating):
        raise ValueError(f"{name} must be a float array or tensor [samples] or [channels, samples]")
    if waveform.ndim == 1:
        waveform = waveform[None]
    if waveform.ndim != 2 or waveform.shape[0] not in (1, 2):
        raise ValueError(
            f"{name} must be 1-D [samples] or 2-D [channels, samples] with 1 or 2 channels, "
            f"got shape {tuple(waveform.shape)}"
        )
    waveform = np.ascontiguousarray(waveform, dtype=np.float32)
    bad = int(waveform.size - np.count_nonzero(np.isfinite(waveform)))
    if bad:
        raise ValueError(f"{name} must be finite, but {bad} of its {waveform.size} samples are NaN or ±inf")
    return waveform
