"""Session options: one frozen value, checked in one place, before any work.

:class:`SessionOptions` holds everything a :class:`streamvae.ChunkedVideoMP4Session` is configured with.
Building one checks every field and normalizes it (the fps to an exact rational, waveforms to float32
arrays, output paths to :class:`~pathlib.Path`), so a bad option is an error at the call that gave it — in
the constructor, on every rank of a distributed decode, in a CLI before any output file is touched — and
never a late failure inside a stage. It needs no event loop; ``decode_to_mp4``, ``stream_mp4``, the server
and the CLI pass one along (or the same keywords).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import anyio
import numpy as np
from torch import Tensor

from streamvae._encode import PixelFormat
from streamvae._encode_options import OutputKind, as_fps, check_video_codec, check_waveform
from streamvae._errors import ArgumentTypeError, check_int
from streamvae._output_file import check_output_files
from streamvae._quantize import check_value_range

__all__ = ["NonFinite", "SessionOptions"]

NonFinite = Literal["error", "ignore"]
Waveform = np.ndarray[Any, np.dtype[np.float32]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class SessionOptions:
    """Every option of a :class:`streamvae.ChunkedVideoMP4Session`, checked and normalized when built.

    Build it with the keywords the session takes; ``dataclasses.replace`` gives a checked variant.

    - ``value_range``: the (low, high) range of the chunks' values, mapped to 0–255; finite in float32.
    - ``fps``: frames per second, a number between 1/1000 and 1000 (stored as an exact rational).
    - ``audio_waveforms``: one waveform per batch entry (``None`` for an entry without audio), finite float
      ``[samples]`` or ``[channels, samples]``, resampled by nobody: give ``audio_sample_rate``. Each track
      is trimmed or padded with silence to the video's duration.
    - ``batch_frames``: frames per host transfer; pushed chunks are regrouped to this size (the last group
      may be smaller).
    - ``crop``: ``(height, width)`` to keep from the top-left of each frame, e.g. to trim a decoder's padding.
    - ``transfer_slots``: depth of the host-slot ring; ``0`` selects a plain blocking copy per group.
    - ``video_codec`` / ``video_codec_options``: an FFmpeg video encoder of this PyAV build and its options
      (names it does not have are refused), merged over the defaults (libx264 and libx265: ``crf`` 18,
      ``preset`` veryfast, ``threads`` min(4, cores) — pin ``threads`` for byte-identical output; with
      ``output="fragmented"`` also ``tune`` zerolatency, so no frame waits for later ones: a ``tune`` of
      yours replaces it, and brings B-frames and the lookahead back unless it is zerolatency too).
      ``"h264_nvenc"`` gets FFmpeg's defaults and your options. ``"auto"``: h264_nvenc where a tiny test
      encode works (probed once per process), else libx264 — also when the session's own NVENC open
      fails (NVENC session limits), before any frame; every entry of a session uses one codec, shown by
      :attr:`ChunkedVideoMP4Session.encoder_name`. ``"auto"`` takes only codec-neutral options (``crf``,
      ``preset``: one of x264's, ``threads``, ``g``; anything else is a ValueError), translated for NVENC
      (``crf`` → ``rc=vbr`` + ``cq`` + ``b=0``, ``preset`` via ``NVENC_PRESETS``: veryfast → p2).
    - ``pixel_format``: ``"rgb24"`` (quantize to RGB; the host converts with swscale), ``"yuv420p"`` (convert
      on the chunk's device; half the bytes, no host conversion) or ``"auto"``: yuv420p for CUDA chunks,
      rgb24 otherwise (on a CPU the rgb24 path is the cheaper one, see docs/benchmarks.md).
    - ``output``: ``"mp4"`` (a complete MP4 with the moov first) or ``"fragmented"`` (fragmented MP4).
    - ``keyframe_interval``: frames between keyframes (codec option ``g``); for fragmented MP4 the default
      is one a second (where a player can join or seek), whatever the fragments.
    - ``fragment_frames`` (fragmented MP4 only): frames per fragment. ``None`` (the default): one fragment
      per transfer group (``batch_frames`` frames: per frame by default), so a chunk's frames leave no
      later than the next chunk's first frame is encoded (or at ``finish``) — FFmpeg's muxer closes a
      fragment only when the next frame arrives. ``N``: a fragment every N frames (fewer bytes of
      fragment headers, ~100 a fragment; a frame then waits for its fragment's N frames). Fragments need
      not start on a keyframe; the first one does.
    - ``output_files``: one path per batch entry to also write each MP4 to. A regular file is written to a
      temporary ``<name>.part`` beside it and replaced only when complete (a failure removes only the
      temporary file); a device or FIFO is written directly. Unwritable paths raise here, before any work.
    - ``queue_depth``: items each inter-stage stream holds before its sender waits.
    - ``record_timeline``: keep a :class:`StageSpan` per piece of stage work in :attr:`timeline`.
    - ``nonfinite``: what a NaN in a chunk does. ``"error"`` (the default) fails the session with a
      ValueError naming the frames: NaN is a broken decode (typically a float16 overflow in the VAE) that
      would otherwise encode as black or green pixels. ``"ignore"`` encodes it anyway. ±inf is never an
      error: it is clamped to ``value_range`` like any value outside it.
    - ``encode_limiter``: an encode budget shared with other sessions (a server's): every encoder call of
      this session runs under one of its tokens, and ``threads`` defaults to 1, so the encoder threads
      running at once never exceed its tokens however many sessions run. Without it each session encodes
      its entries side by side with the codec's default threads.
    """

    value_range: tuple[float, float]
    fps: Fraction
    audio_waveforms: tuple[Waveform | None, ...] | None = None
    audio_sample_rate: int | None = None
    batch_frames: int = 1
    crop: tuple[int, int] | None = None
    transfer_slots: int = 2
    video_codec: str = "libx264"
    video_codec_options: Mapping[str, str] = dataclasses.field(default_factory=dict)
    pixel_format: PixelFormat | Literal["auto"] = "auto"
    output: OutputKind = "mp4"
    #: frames between keyframes; for fragmented MP4 without one given, a keyframe a second
    keyframe_interval: int | None = None
    #: frames per fragment of fragmented MP4; None: one fragment per transfer group
    fragment_frames: int | None = None
    output_files: tuple[Path, ...] | None = None
    queue_depth: int = 1
    record_timeline: bool = False
    nonfinite: NonFinite = "error"
    encode_limiter: anyio.CapacityLimiter | None = None

    def __post_init__(self) -> None:
        fix = self._set
        fix("value_range", check_value_range(self.value_range))
        fix("fps", as_fps(self.fps))
        check_int("batch_frames", self.batch_frames, minimum=1)
        check_int("transfer_slots", self.transfer_slots, minimum=0)
        check_int("queue_depth", self.queue_depth, minimum=0)
        if self.crop is not None:
            fix("crop", _check_crop(self.crop))
        _check_choice("pixel_format", self.pixel_format, ("auto", "rgb24", "yuv420p"))
        _check_choice("output", self.output, ("mp4", "fragmented"))
        _check_choice("nonfinite", self.nonfinite, ("error", "ignore"))
        options = self.video_codec_options
        if options is None:
            options = {}
        if not isinstance(options, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in options.items()
        ):
            raise ArgumentTypeError(
                "video_codec_options must be a dict of FFmpeg option strings, e.g. "
                f"{{'crf': '18', 'preset': 'veryfast'}}, got {options!r}"
            )
        check_video_codec(self.video_codec, options)
        fix("video_codec_options", MappingProxyType(dict(options)))
        if self.keyframe_interval is not None:
            check_int("keyframe_interval", self.keyframe_interval, minimum=1)
        elif self.output == "fragmented":
            fix("keyframe_interval", max(1, round(self.fps)))
        if self.fragment_frames is not None:
            check_int("fragment_frames", self.fragment_frames, minimum=1)
            if self.output != "fragmented":
                raise ValueError("fragment_frames applies to output='fragmented' only (a plain MP4 has none)")
        if self.audio_waveforms is not None:
            fix("audio_waveforms", _check_audio(self.audio_waveforms, self.audio_sample_rate))
        if self.output_files is not None:
            fix("output_files", tuple(check_output_files(self.output_files)))
        if not isinstance(self.record_timeline, bool):
            raise ArgumentTypeError(f"record_timeline must be a bool, got {self.record_timeline!r}")
        if self.encode_limiter is not None and not isinstance(self.encode_limiter, anyio.CapacityLimiter):
            raise ArgumentTypeError(
                f"encode_limiter must be an anyio.CapacityLimiter, got {self.encode_limiter!r}"
            )

    def _set(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)  # normalizing a frozen value while it is built

    def encoder_codec_options(self) -> dict[str, str]:
        """The codec options each entry's encoder gets (the defaults are merged by the encoder)."""
        options = dict(self.video_codec_options)
        if self.encode_limiter is not None:
            # A shared budget counts encoder calls: one thread each keeps the threads at work within it.
            options.setdefault("threads", "1")
        return options

    def frames_per_fragment(self) -> int:
        """Frames per fragment of fragmented output: ``fragment_frames``, or a transfer group's."""
        return self.fragment_frames if self.fragment_frames is not None else self.batch_frames

    def check_first_chunk(self, batch: int, height: int, width: int, *, streamed: Sequence[int] = ()) -> None:
        """Raise ValueError unless the first chunk's shape fits these options: one waveform and file per
        entry, ``streamed`` entries within the batch, a crop inside the frame, and an even frame size (the
        video is yuv420p)."""
        if self.audio_waveforms is not None and len(self.audio_waveforms) != batch:
            raise ValueError(
                f"audio_waveforms has {len(self.audio_waveforms)} entries "
                f"but the chunks have batch size {batch}"
            )
        if any(entry >= batch for entry in streamed):
            raise ValueError(
                f"open_stream() was called for entry {max(streamed)}, but the batch size is {batch}"
            )
        if self.output_files is not None and len(self.output_files) != batch:
            raise ValueError(
                f"output_files has {len(self.output_files)} paths but the chunks have batch size {batch}"
            )
        out_height, out_width = height, width
        if self.crop is not None:
            if self.crop[0] > height or self.crop[1] > width:
                raise ValueError(f"crop {self.crop} is larger than the {height}×{width} frames")
            out_height, out_width = self.crop
        if out_height % 2 or out_width % 2:
            raise ValueError(
                f"yuv420p video needs an even height and width, got {out_height}×{out_width}; "
                f"pass crop=({out_height - out_height % 2}, {out_width - out_width % 2}) to trim a row/column"
            )


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        listed = ", ".join(map(repr, choices[:-1])) + f" or {choices[-1]!r}"
        raise ValueError(f"{name} must be {listed}, got {value!r}")


def _check_crop(crop: object) -> tuple[int, int]:
    message = f"crop must be (height, width) with two positive ints, got {crop!r}"
    if not isinstance(crop, (tuple, list)) or len(crop) != 2:
        raise ArgumentTypeError(message)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in crop):
        raise ArgumentTypeError(message)
    if not all(v > 0 for v in crop):
        raise ValueError(message)
    return int(crop[0]), int(crop[1])


def _check_audio(waveforms: object, sample_rate: object) -> tuple[Waveform | None, ...]:
    if isinstance(waveforms, (Tensor, np.ndarray)) or not isinstance(waveforms, Sequence):
        raise ArgumentTypeError(
            "audio_waveforms must be a sequence with one waveform (or None) per batch entry"
        )
    if sample_rate is None:
        raise ValueError("audio_sample_rate must be a positive int when audio_waveforms is given, got None")
    check_int("audio_sample_rate", sample_rate, minimum=1)
    return tuple(
        None if w is None else check_waveform(w, name=f"audio_waveforms[{i}]")
        for i, w in enumerate(waveforms)
    )
