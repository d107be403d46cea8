"""Session options: each option named, defaulted, documented and checked here, once.

:class:`SessionOptions` holds everything a :class:`streamvae.ChunkedVideoMP4Session` is configured with.
Building one checks every field and normalizes it (the fps to an exact rational, waveforms to float32
arrays, output paths to :class:`~pathlib.Path`), so a bad option is an error at the call that gave it — in
the constructor, on every rank of a distributed decode, in a CLI before any output file is touched — and
never a late failure inside a stage. It needs no event loop.

Every entry point that takes session options (the session, ``decode_to_mp4``, ``stream_mp4``,
``open_latent_stream``) takes one :class:`SessionOptions` as ``options=`` or its keywords, typed by
:class:`SessionKeywords`, and turns them into options with :func:`resolve_options`. A new option is a
field here (and its line in :class:`SessionKeywords`, which a test keeps in step): nothing else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, TypedDict

import anyio
import numpy as np
from torch import Tensor

from streamvae._checks import (
    check_bool,
    check_choice,
    check_fps,
    check_int,
    check_limiter,
    check_waveform,
    did_you_mean,
    is_int,
)
from streamvae._codec_options import OutputKind, check_video_codec, frame_size_refusal
from streamvae._output_file import check_output_files
from streamvae._provenance import Provenance, check_provenance
from streamvae._public import public
from streamvae._quantize import PixelFormat, ValueRange, check_value_range

__all__ = [
    "OPTION_NAMES",
    "ChunkTransform",
    "NonFinite",
    "SessionKeywords",
    "SessionOptions",
    "check_option_dict",
    "resolve_options",
]

NonFinite = Literal["error", "ignore"]
#: FFmpeg's int options (the keyframe interval becomes the codec's ``g``) stop at a C int.
_MAX_C_INT = 2**31 - 1
Waveform = np.ndarray[Any, np.dtype[np.float32]]
#: ``chunk_transform``: a float BCTHW chunk in, a chunk of the same shape, device and range out
ChunkTransform = Callable[[Tensor], Tensor]


@public
@dataclasses.dataclass(frozen=True, kw_only=True)
class SessionOptions:
    """Every option of a :class:`streamvae.ChunkedVideoMP4Session`, checked and normalized when built.

    Build it with the keywords the session takes; ``dataclasses.replace`` gives a checked variant.

    - ``value_range``: the (low, high) range of the chunks' values, mapped to 0–255; finite in float32. Or
      a :class:`PerChannelRange` for normalized pixels (``(x * std + mean).clamp(0, 1)`` per channel).
    - ``fps``: frames per second, a number between 1/1000 and 1000 (stored as an exact rational).
    - ``audio_waveforms``: one waveform per batch entry (``None`` for an entry without audio), finite float
      ``[samples]`` or ``[channels, samples]``, at ``audio_sample_rate``. Each track is trimmed or padded
      with silence to the video's duration.
    - ``audio_channels``: 1 (mono) or 2 (stereo) for a live audio track per entry, at ``audio_sample_rate``
      (required with it), whose samples come from :meth:`ChunkedVideoMP4Session.push_audio` as they are
      made (a real-time generator's sound); exclusive with ``audio_waveforms``. At ``finish`` a track
      within one video frame of the video's duration is padded or trimmed to it; further off is an error.
    - ``audio_sample_rate``: the rate of the sound (``audio_waveforms`` or live), from 1000 to 768000 Hz.
      A rate the audio encoder does not take (AAC takes 13, from 7350 to 96000 Hz; Opus 48000) is
      resampled to one it does, so any rate in that range makes a video.
    - ``batch_frames``: frames per host transfer; pushed chunks are regrouped to this size (the last group
      may be smaller).
    - ``crop``: ``(height, width)`` to keep from the top-left of each frame, e.g. to trim a decoder's padding.
    - ``chunk_transform``: a function applied to each chunk on its device before it is quantized, and
      whose output is what is encoded: a float BCTHW chunk in ``value_range`` in (after ``crop``), a tensor
      of the same shape, on the same device, in the same range out. It runs in the prepare stage's worker
      thread (never on the event loop), under ``torch.no_grad``, with the prepare stage's CUDA stream
      current: that stream has waited for the work that made the chunk, so work the transform queues on
      the current stream runs after it; a transform that uses CUDA streams of its own must order them
      against the current one itself. It sees every frame once, in order, chunk by chunk as they are
      pushed. It is where an imperceptible watermark (VideoSeal's ``embed``), an overlay or a colour grade
      plugs in. Its exception is the session's first cause; an output that is not a tensor is a TypeError,
      one of another shape, device or a non-float tensor a ValueError, each naming it.
    - ``transfer_slots``: depth of the host-slot ring; ``0`` selects a plain blocking copy per group.
    - ``video_codec`` / ``video_codec_options``: an FFmpeg video encoder of this PyAV build and its options
      (names it does not have are refused), merged over its defaults. Each encoder streamvae configures
      is one record of the rung table (``Rung`` in ``streamvae/_codec_options.py``: the ladder and, per
      encoder, its defaults and translation), which starts from ``crf`` 18, ``preset`` veryfast and
      ``threads`` min(4, cores) — pin ``threads`` for byte-identical output — in the encoder's own terms,
      with its low-latency mode for ``output="fragmented"`` (x264's ``tune`` zerolatency, so no frame
      waits for later ones: a ``tune`` of yours replaces it, and brings B-frames and the lookahead back
      unless it is zerolatency too). ``"h264_nvenc"`` named, and encoders without a record, get FFmpeg's
      defaults and your options. A named encoder is never replaced: one this build lacks is a ValueError
      here. ``"auto"`` climbs the table's ladder: each rung is probed by a tiny test encode (once per
      process), and a session whose open of a rung fails (NVENC session limits) takes the next, before any
      frame; none that opens is a ``streamvae.NoEncoderError`` naming every rung. Every entry of a session
      uses one codec, shown by :attr:`ChunkedVideoMP4Session.encoder_name` and the statistics. ``"auto"``
      takes only codec-neutral options (``crf`` on x264's 0–51, ``preset``: one of x264's, ``threads``,
      ``g``; anything else is a ValueError), which each rung's record translates for it. A soundtrack is
      AAC, or Opus resampled to 48 kHz where the build has no AAC encoder.
    - ``pixel_format``: ``"rgb24"`` (quantize to RGB; the host converts with swscale), ``"yuv420p"`` (convert
      on the chunk's device; half the bytes, no host conversion) or ``"auto"``: yuv420p for CUDA chunks,
      rgb24 otherwise (on a CPU the rgb24 path is the cheaper one, see docs/benchmarks.md).
    - ``output``: ``"mp4"`` (a complete MP4 with the moov first) or ``"fragmented"`` (fragmented MP4).
    - ``keyframe_interval``: frames between keyframes. With it set, every encoder of the rung table
      (x264, NVENC, SVT-AV1, VP9; x265 too) puts a keyframe (an IDR: a sync sample a player can start at)
      exactly every ``keyframe_interval`` frames and nowhere else, scene cuts included: its ``Rung``'s
      cadence options (x264 ``g`` + ``keyint_min`` + ``sc_threshold=0``; NVENC ``g`` + ``no-scenecut`` +
      ``forced-idr``; SVT-AV1 ``g`` and ``svtav1-params`` ``keyint`` + ``scd=0``; VP9 ``g`` +
      ``keyint_min``) replace the same-named codec options. A fixed cadence is what lets a player's
      segments start at keyframes (an HLS segment, a viewer joining live) and last alike; a keyframe at a
      scene cut would shift every one after it. A ``g`` in ``video_codec_options`` sets the interval
      instead. An encoder without a record gets ``g`` alone. For fragmented MP4 the default is one a
      second (where a player can join or seek), whatever the fragments; for a plain MP4, none: the
      encoder's own placement.
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
    - ``record_timeline``: keep a :class:`StageSpan` per piece of stage work in the session's
      :attr:`~ChunkedVideoMP4Session.timeline`.
    - ``nonfinite``: what a NaN in a chunk does. ``"error"`` (the default) fails the session with a
      ValueError naming the frames: NaN is a broken decode (typically a float16 overflow in the VAE) that
      would otherwise encode as black or green pixels. ``"ignore"`` encodes it anyway. ±inf is never an
      error: it is clamped to ``value_range`` like any value outside it.
    - ``encode_limiter``: an encode budget shared with other sessions (a server's): every encoder call of
      this session runs under one of its tokens, and ``threads`` defaults to 1, so the encoder threads
      running at once never exceed its tokens however many sessions run. Without it each session encodes
      its entries side by side with the codec's default threads.
    - ``provenance``: a :class:`streamvae.Provenance`: every complete output (the bytes ``finish`` returns,
      each output file) is signed with C2PA Content Credentials that say it was generated
      (``c2pa.created``, digital source type ``trainedAlgorithmicMedia``), a file before it is put in place
      (a signing failure is a :class:`streamvae.SigningError` and leaves the old file). Fragmented output
      also carries an unsigned XMP mark of the same digital source type in its init segment, which a byte
      stream's reader gets: bytes already sent cannot be signed after the fact. Checked here: a signing
      certificate outside its validity dates is a ValueError.
    """

    value_range: ValueRange
    fps: Fraction
    audio_waveforms: tuple[Waveform | None, ...] | None = None
    audio_sample_rate: int | None = None
    audio_channels: int | None = None
    batch_frames: int = 1
    crop: tuple[int, int] | None = None
    chunk_transform: ChunkTransform | None = None
    transfer_slots: int = 2
    video_codec: str = "libx264"
    video_codec_options: Mapping[str, str] = dataclasses.field(default_factory=dict)
    pixel_format: PixelFormat | Literal["auto"] = "auto"
    output: OutputKind = "mp4"
    #: frames between keyframes, exactly (none at scene cuts); for fragmented MP4 without one given, a
    #: keyframe a second
    keyframe_interval: int | None = None
    #: frames per fragment of fragmented MP4; None: one fragment per transfer group
    fragment_frames: int | None = None
    output_files: tuple[Path, ...] | None = None
    queue_depth: int = 1
    record_timeline: bool = False
    nonfinite: NonFinite = "error"
    encode_limiter: anyio.CapacityLimiter | None = None
    provenance: Provenance | None = None

    def __post_init__(self) -> None:
        fix = self._set
        fix("value_range", check_value_range(self.value_range))
        fix("fps", check_fps(self.fps))
        check_int("batch_frames", self.batch_frames, minimum=1)
        check_int("transfer_slots", self.transfer_slots, minimum=0)
        check_int("queue_depth", self.queue_depth, minimum=0)
        if self.crop is not None:
            fix("crop", _check_crop(self.crop))
        if self.chunk_transform is not None and not callable(self.chunk_transform):
            raise TypeError(
                "chunk_transform must be a function of a float BCTHW chunk returning one of the same shape "
                f"(or None), got {type(self.chunk_transform).__name__}"
            )
        check_choice("pixel_format", self.pixel_format, ("auto", "rgb24", "yuv420p"))
        check_choice("output", self.output, ("mp4", "fragmented"))
        check_choice("nonfinite", self.nonfinite, ("error", "ignore"))
        fix("video_codec_options", _check_codec_options(self.video_codec, self.video_codec_options))
        if self.keyframe_interval is not None:
            check_int("keyframe_interval", self.keyframe_interval, minimum=1, maximum=_MAX_C_INT)
        elif self.output == "fragmented":
            fix("keyframe_interval", max(1, round(self.fps)))
        if self.fragment_frames is not None:
            check_int("fragment_frames", self.fragment_frames, minimum=1)
            if self.output != "fragmented":
                raise ValueError("fragment_frames applies to output='fragmented' only (a plain MP4 has none)")
        if self.audio_channels is not None:
            _check_live_audio(self.audio_channels, self.audio_sample_rate, self.audio_waveforms)
        elif self.audio_waveforms is not None:
            fix("audio_waveforms", _check_audio(self.audio_waveforms, self.audio_sample_rate))
        elif self.audio_sample_rate is not None:
            _check_sample_rate(self.audio_sample_rate)
        if self.output_files is not None:
            signed = self.provenance is not None
            fix("output_files", tuple(check_output_files(self.output_files, signed=signed)))
        check_bool("record_timeline", self.record_timeline)
        check_limiter("encode_limiter", self.encode_limiter)
        check_provenance(self.provenance)

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

    def check_batch(self, batch: int, *, streamed: Sequence[int] = (), owner: str | None = None) -> None:
        """Raise ValueError unless a batch of ``batch`` entries fits these options: one waveform and one
        output file per entry, and every ``streamed`` entry within the batch.

        Known before any decode from a latent's shape, so entry points check it before the first step: a
        real-time generator's step is not wasted on options that cannot fit it.
        """
        where = "" if owner is None else f"{owner}: "
        if self.audio_waveforms is not None and len(self.audio_waveforms) != batch:
            raise ValueError(
                f"{where}audio_waveforms has {len(self.audio_waveforms)} entries but the batch has {batch}"
            )
        if any(entry >= batch for entry in streamed):
            raise ValueError(
                f"{where}open_stream() was called for entry {max(streamed)}, but the batch size is {batch}"
            )
        if self.output_files is not None and len(self.output_files) != batch:
            raise ValueError(
                f"{where}output_files has {len(self.output_files)} paths but the batch has {batch} entries"
            )

    def check_frame_size(self, height: int, width: int, *, owner: str | None = None) -> None:
        """Raise ValueError unless frames of ``height`` × ``width`` fit these options: a crop inside the
        frame, and an even frame size after it (the video is yuv420p) that a named ``video_codec`` takes
        (SVT-AV1: 4×4 at least; ``"auto"`` climbs past a rung that does not take it)."""
        where = "" if owner is None else f"{owner}: "
        out_height, out_width = height, width
        if self.crop is not None:
            if self.crop[0] > height or self.crop[1] > width:
                raise ValueError(f"{where}crop {self.crop} is larger than the {height}×{width} frames")
            out_height, out_width = self.crop
        if out_height % 2 or out_width % 2:
            raise ValueError(
                f"{where}yuv420p video needs an even height and width, got {out_height}×{out_width}; "
                f"pass crop=({out_height - out_height % 2}, {out_width - out_width % 2}) to trim a row/column"
            )
        refusal = frame_size_refusal(self.video_codec, out_height, out_width)
        if refusal is not None:
            raise ValueError(f"{where}video_codec={self.video_codec!r}: {refusal}")


def _check_crop(crop: object) -> tuple[int, int]:
    if (
        not isinstance(crop, (tuple, list))
        or len(crop) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in crop)
    ):
        raise ValueError(f"crop must be (height, width) with two positive ints, got {crop!r}")
    return int(crop[0]), int(crop[1])


def _check_codec_options(codec: object, options: object) -> Mapping[str, str]:
    if options is None:
        options = {}
    if not isinstance(options, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in options.items()
    ):
        raise ValueError(
            "video_codec_options must be a dict of FFmpeg option strings, e.g. "
            f"{{'crf': '18', 'preset': 'veryfast'}}, got {options!r}"
        )
    check_video_codec(codec, options)
    return MappingProxyType(dict(options))


def _check_audio(waveforms: object, sample_rate: object) -> tuple[Waveform | None, ...]:
    if isinstance(waveforms, (Tensor, np.ndarray)) or not isinstance(waveforms, Sequence):
        raise ValueError("audio_waveforms must be a sequence with one waveform (or None) per batch entry")
    if sample_rate is None:
        raise ValueError(
            f"audio_sample_rate must be an int from {_SAMPLE_RATES[0]} to {_SAMPLE_RATES[1]} Hz when "
            f"audio_waveforms is given, got None"
        )
    _check_sample_rate(sample_rate)
    return tuple(
        None if w is None else check_waveform(w, name=f"audio_waveforms[{i}]")
        for i, w in enumerate(waveforms)
    )


#: The rates of sound a session takes. A track below 1000 Hz holds nothing above 500 Hz, no soundtrack, and
#: FFmpeg's resampler (which takes a track to a rate the encoder takes) gives nothing for one of a few Hz
#: (1 Hz to AAC's 7350: no sample came out); 768 kHz is the top of audio hardware.
_SAMPLE_RATES = (1000, 768_000)


def _check_sample_rate(rate: object) -> None:
    check_int("audio_sample_rate", rate, minimum=_SAMPLE_RATES[0], maximum=_SAMPLE_RATES[1])


def _check_live_audio(channels: object, sample_rate: object, waveforms: object) -> None:
    if waveforms is not None:
        raise ValueError(
            "audio_channels and audio_waveforms exclude each other: audio_channels is a live track whose "
            "samples come from push_audio(), audio_waveforms whole waveforms given up front; pass one"
        )
    if not is_int(channels) or channels not in (1, 2):
        raise ValueError(f"audio_channels must be 1 (mono) or 2 (stereo), got {channels!r}")
    if sample_rate is None:
        raise ValueError(
            f"audio_sample_rate must be an int from {_SAMPLE_RATES[0]} to {_SAMPLE_RATES[1]} Hz when "
            f"audio_channels is given, got None"
        )
    _check_sample_rate(sample_rate)


@public
class SessionKeywords(TypedDict, total=False):
    """The keywords of :class:`SessionOptions`, as entry points take them (``**options:
    Unpack[SessionKeywords]``): the forms each option accepts, before it is normalized.

    What each one means, its default and its check are at :class:`SessionOptions`; this only types the
    keywords for type checkers, one per field (``tests/test_options.py`` fails when they drift apart).
    """

    value_range: ValueRange
    fps: float | Fraction
    audio_waveforms: Sequence[Tensor | np.ndarray[Any, Any] | None] | None
    audio_sample_rate: int | None
    audio_channels: int | None
    batch_frames: int
    crop: tuple[int, int] | None
    chunk_transform: ChunkTransform | None
    transfer_slots: int
    video_codec: str
    video_codec_options: Mapping[str, str] | None
    pixel_format: PixelFormat | Literal["auto"]
    output: OutputKind
    keyframe_interval: int | None
    fragment_frames: int | None
    output_files: Sequence[str | Path] | None
    queue_depth: int
    record_timeline: bool
    nonfinite: NonFinite
    encode_limiter: anyio.CapacityLimiter | None
    provenance: Provenance | None


#: The option names, in their order (what ``options=`` and the keywords both name).
OPTION_NAMES = tuple(field.name for field in dataclasses.fields(SessionOptions))
_REQUIRED = tuple(
    field.name
    for field in dataclasses.fields(SessionOptions)
    if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
)


def resolve_options(
    owner: str, options: object, keywords: Mapping[str, object], **defaults: object
) -> SessionOptions:
    """The :class:`SessionOptions` an entry point named ``owner`` was called with.

    ``options`` (a :class:`SessionOptions`, checked already) or ``keywords`` over ``defaults`` — never
    both. An unknown keyword is a TypeError naming the nearest option, as Python's own for a misspelt
    argument; a bad value the ValueError of its check, prefixed with ``owner``.
    """
    if options is not None:
        if not isinstance(options, SessionOptions):
            raise TypeError(
                f"{owner}: options must be a streamvae.SessionOptions, got {type(options).__name__}"
            )
        if keywords:
            raise TypeError(
                f"{owner}: pass the session options as options= or as keywords, not both "
                f"(got options= and {', '.join(sorted(keywords))})"
            )
        return options
    for name in keywords:
        if name not in OPTION_NAMES:
            hint = did_you_mean(name, OPTION_NAMES)
            raise TypeError(f"{owner}() got an unexpected keyword argument {name!r}{hint}")
    given = {**defaults, **keywords}
    missing = [name for name in _REQUIRED if name not in given]
    if missing:
        raise TypeError(
            f"{owner}() needs {' and '.join(f'{name}=' for name in missing)} "
            "(or options=streamvae.SessionOptions(...))"
        )
    try:
        return SessionOptions(**given)  # type: ignore[arg-type]  # each value is checked and normalized
    except (TypeError, ValueError) as error:
        raise type(error)(f"{owner}: {error}") from None
    except OSError as error:
        if error.errno is None:
            raise
        # An output file that could not be opened: the same OSError subclass, naming the call and option.
        raise OSError(error.errno, f"{owner}: output_files: {error.strerror}", error.filename) from None


def check_option_dict(
    value: object, *, owner: str, reserved: Sequence[str] = (), name: str = "session_options"
) -> dict[str, Any]:
    """``value`` as a dict of :class:`SessionOptions` keywords: what an entry point that takes the options
    as one dict argument (``name``) beside arguments of its own gets. None is an empty dict.

    Not a mapping: a TypeError. A key that is no option (with the nearest one) or one of ``reserved``
    (options the entry point takes as arguments of its own, such as ``fps``): a ValueError naming
    ``owner`` and ``name``. The values are checked when the options are resolved.
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(
            f"{owner}: {name} must be a dict of streamvae.SessionOptions keywords or None, "
            f"got {type(value).__name__}"
        )
    for key in value:
        if key in reserved or key == "options":
            raise ValueError(f"{owner}: pass {key} to {owner}() itself, not in {name}")
        if key not in OPTION_NAMES:
            hint = did_you_mean(key, OPTION_NAMES)
            raise ValueError(f"{owner}: {name} has {key!r}, not a SessionOptions keyword{hint}")
    return dict(value)


def resolve_option_dict(
    owner: str,
    value: object,
    *,
    reserved: Sequence[str] = (),
    given: Mapping[str, object] | None = None,
    name: str = "session_options",
    **defaults: object,
) -> SessionOptions:
    """The :class:`SessionOptions` of an entry point that takes them as one dict argument ``name`` (the
    server's ``session_options``, the pipelines'): the one door from such a dict to options.

    ``value`` is checked by :func:`check_option_dict` (``reserved`` are the entry point's own arguments);
    ``given`` (the values of those arguments) overrides it and ``defaults`` fill in under it. Every error
    names ``owner`` and ``name``: ``create_app: session_options: batch_frames must be ...``.
    """
    keywords = check_option_dict(value, owner=owner, reserved=reserved, name=name)
    return resolve_options(f"{owner}: {name}", None, {**keywords, **(given or {})}, **defaults)
