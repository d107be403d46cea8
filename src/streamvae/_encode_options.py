"""What an encoder is configured with: codec defaults and checks, the frame rate, waveforms, fragmenting.

Everything here is decided before an encoder opens (``SessionOptions`` checks with it); ``_encode`` uses
it to open the container and the codec.
"""

from __future__ import annotations

import difflib
import functools
import os
from collections.abc import Mapping
from fractions import Fraction
from typing import Any, Literal

import av
import numpy as np

__all__ = [
    "MAX_FPS",
    "MIN_FPS",
    "OutputKind",
    "as_fps",
    "check_video_codec",
    "check_waveform",
    "container_options",
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


def check_video_codec(codec: object, options: Mapping[str, str] | None = None) -> None:
    """Raise ValueError unless ``codec`` names a video encoder of this PyAV build and every key of
    ``options`` is an option that encoder has (FFmpeg would silently ignore an unknown one)."""
    if not isinstance(codec, str) or not codec:
        raise ValueError(f"video_codec must be an FFmpeg video encoder name such as 'libx264', got {codec!r}")
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
