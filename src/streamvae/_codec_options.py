"""What an encoder is configured with: the rung table, codec defaults and checks, and
``video_codec="auto"``'s ladder (its probes, and the codec-neutral options it translates for each rung).

Each video encoder streamvae knows more of than FFmpeg's defaults is one :class:`Rung` record: its name,
how the codec-neutral options (``crf`` on x264's 0–51, an x264 ``preset``, ``threads``, ``g``) read in its
own terms, how it is held to a keyframe cadence (``keyframe_interval``: a keyframe exactly every N frames,
none at scene cuts), whether it looks ahead, the codec string its MP4 carries, the frame sizes it takes (and
the options a size needs: SVT-AV1 never returns from short frames at more than one thread) and how its own
log is kept to errors (x265's and SVT-AV1's banners). :data:`VIDEO_RUNGS` is the ladder, in the order
``"auto"`` climbs it; a new rung is one record there, and every default, translation, error message and
probe follows from it. Everything here is decided before an encoder opens
(``SessionOptions`` checks with it); ``_encode`` opens the container and the codec with it, and climbs the
ladder when an open fails.

The ladder exists because FFmpeg builds differ: one without GPL parts (a licence-conscious image,
conda-forge's LGPL build) has no libx264 or libx265, some runtime images removed software H.264, H.265 and
AAC, and data-centre GPUs (H100, H200) have no NVENC. What is usually left is SVT-AV1, libvpx-vp9 and
libopus, which browsers play in fragmented MP4 too. Which rung works is what PyAV can open: each is probed
by a tiny encode, once per process.
"""

from __future__ import annotations

import functools
import io
import os
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

import av
import numpy as np

from streamvae._checks import did_you_mean
from streamvae._errors import NoEncoderError

__all__ = [
    "AUDIO_LADDER",
    "CODEC_NEUTRAL_OPTIONS",
    "ENCODER_PIXEL_FORMAT",
    "MAX_CRF",
    "NVENC_PRESETS",
    "OPEN_FAILURES",
    "OPUS_SAMPLE_RATE",
    "SVT_AV1_PRESETS",
    "VIDEO_RUNGS",
    "VP9_SPEEDS",
    "X264_PRESETS",
    "OutputKind",
    "Rung",
    "audio_encoder",
    "audio_encoder_rate",
    "auto_codec_options",
    "auto_video_codec",
    "check_video_codec",
    "default_codec_options",
    "encode_failure",
    "for_frame_size",
    "frame_size_refusal",
    "merge_codec_options",
    "quiet_encoder_logs",
    "refused_option",
    "video_rung",
    "with_keyframe_cadence",
]

#: ``"mp4"``: one complete MP4 with the moov at the front, available at the end.
#: ``"fragmented"``: fragmented MP4 (moov first, then a fragment every few frames), available as written.
OutputKind = Literal["mp4", "fragmented"]

# -- the probes --

#: The audio encoders, in order: AAC, then Opus (in MP4 since FFmpeg 4.3; every browser plays it).
AUDIO_LADDER = ("aac", "libopus")
#: The one rate Opus takes here: a track at another rate is resampled to it (Opus has no 44.1 kHz).
OPUS_SAMPLE_RATE = 48_000


def audio_encoder_rate(codec: str, sample_rate: int) -> int:
    """The rate audio encoder ``codec`` is opened at for a track of ``sample_rate`` Hz (a track at another
    rate is resampled to it): Opus always :data:`OPUS_SAMPLE_RATE`; AAC the track's own rate where it takes
    it, else the lowest of its rates above it (none of the track's sound is lost), else its highest. FFmpeg's
    AAC encoder takes 13 rates from 7350 to 96000 Hz, and refuses to open at any other (44000, 192000).
    """
    if codec != "aac":
        return OPUS_SAMPLE_RATE
    rates = sorted(av.codec.Codec(codec, "w").audio_rates or (sample_rate,))
    if sample_rate in rates:
        return sample_rate
    return next((rate for rate in rates if rate > sample_rate), rates[-1])


#: What a failed open of an encoder raises: FFmpeg's refusal, or a name this PyAV build has no encoder for.
OPEN_FAILURES = (av.FFmpegError, av.codec.codec.UnknownCodecError)


_probe_lock = threading.Lock()
_probed: dict[str, str | None] = {}  # encoder → why it cannot encode here (None: it can)


def encode_failure(codec: str) -> str | None:
    """Why ``codec`` cannot encode on this machine, or None if it can: a tiny encode through PyAV, run once
    per process and encoder (then cached), so that what PyAV can open is what counts.

    Without an NVENC block (no NVIDIA GPU, or a data-centre one: H100, H200, A100) NVENC's open fails in
    about a millisecond; a software encoder's probe takes a few.
    """
    with _probe_lock:
        if codec not in _probed:
            _probed[codec] = _probe(codec)
        return _probed[codec]


def _probe(codec: str) -> str | None:
    """Encode two 64×64 frames (a video encoder) or 20 ms of silence (an audio one) with ``codec``."""
    quiet_encoder_logs(codec)
    try:
        context: Any = av.codec.CodecContext.create(codec, "w")
        if context.type == "audio":
            rate = OPUS_SAMPLE_RATE
            context.sample_rate, context.layout = rate, "mono"
            context.format = context.codec.audio_formats[0].name
            context.time_base = Fraction(1, rate)
            context.open()
            silence = av.AudioFrame.from_ndarray(
                np.zeros((1, rate // 50), np.float32), format="fltp", layout="mono"
            )
            silence.sample_rate, silence.pts = rate, 0
            resampler = av.AudioResampler(format=context.format.name, layout="mono", rate=rate)
            for piece in resampler.resample(silence):
                context.encode(piece)
        else:
            context.width = context.height = 64
            context.pix_fmt = ENCODER_PIXEL_FORMAT
            context.time_base = Fraction(1, 16)
            context.open()
            for pts in range(2):
                frame = av.VideoFrame(64, 64, ENCODER_PIXEL_FORMAT)
                frame.pts = pts
                context.encode(frame)
        context.encode(None)
    except av.codec.codec.UnknownCodecError:
        return "not an encoder of this PyAV build"
    except av.FFmpegError as error:
        return f"a test encode failed ({error})"
    return None


def auto_video_codec() -> str:
    """What ``video_codec="auto"`` chooses first on this machine: the first rung of :data:`VIDEO_RUNGS`
    whose probe encodes (:func:`encode_failure`); :class:`NoEncoderError` naming every rung if none does.

    A session whose open of it fails (NVENC's session limit) goes on to the rungs after it.
    """
    return _first_that_encodes("video", tuple(rung.name for rung in VIDEO_RUNGS))


def audio_encoder() -> str:
    """The audio encoder every soundtrack is written with here: ``"aac"`` where it encodes, else
    ``"libopus"`` (at :data:`OPUS_SAMPLE_RATE`); :class:`NoEncoderError` naming both if neither does."""
    return _first_that_encodes("audio", AUDIO_LADDER)


def _first_that_encodes(kind: Literal["video", "audio"], ladder: tuple[str, ...]) -> str:
    """The first rung of ``ladder`` whose probe encodes; :class:`NoEncoderError` naming every rung and
    why it failed if none does."""
    tried = []
    for codec in ladder:
        failure = encode_failure(codec)
        if failure is None:
            return codec
        tried.append((codec, failure))
    raise NoEncoderError(kind, tried)


def quiet_encoder_logs(codec: str) -> None:
    """Keep ``codec``'s own log off the process's stderr unless the user asked for it: set its rung's
    :attr:`Rung.log_environment` where the environment has no value of the user's.

    SVT-AV1 prints a 20-line banner at every open, which floods a server's log (x265 does too, and is
    quieted through its options, :attr:`Rung.quiet`). SVT-AV1 takes no option for it: it reads ``SVT_LOG``
    once per process, at its first message, so this runs before every open and probe of it; a user who
    wants its banner sets ``SVT_LOG=3`` (before the first AV1 encoder opens).

    A process setting, made once: the first call for the rung sets it, under a lock, and later ones
    (from any encoder's worker thread) leave the environment alone — changing it while another thread's
    encoder reads it (``getenv``) is a data race in C.
    """
    rung = video_rung(codec)
    if rung is None or rung.log_environment is None:
        return
    name, value = rung.log_environment
    with _environment_lock:
        if name not in _environment_set:
            _environment_set.add(name)
            os.environ.setdefault(name, value)


_environment_lock = threading.Lock()
_environment_set: set[str] = set()  # the variables quiet_encoder_logs has set (or found the user's)


def refused_option(
    codec: str, given: Mapping[str, str], others: Mapping[str, str], height: int = 64, width: int = 64
) -> str | None:
    """Why ``codec`` refuses the user's options ``given`` over streamvae's ``others`` (its defaults and
    translations), in words that name the option, its value and the encoder; None when it opens with them
    at ``height``×``width``, or when it does not open even with FFmpeg's defaults (then no option is at
    fault, and the open's own error says why).

    FFmpeg reads an option's value only when the encoder opens (``avcodec_open2``), and its error names
    no option: test opens of the codec alone (no container, no frame), with each option alone, find the
    one (the user's first); options that are refused only together are named together.
    """
    options = {**others, **given}
    failure = _open_failure(codec, options, height, width)
    if failure is None or _open_failure(codec, {}, height, width) is not None:
        return None
    for name, value in {**given, **options}.items():
        alone = _open_failure(codec, {name: value}, height, width)
        if alone is not None:
            return f"video_codec_options: {codec} refuses {name}={_shown(value)} (FFmpeg: {alone})"
    theirs = [f"{name}={_shown(value)}" for name, value in given.items()]
    ours = [f"{name}={_shown(value)}" for name, value in options.items() if name not in given]
    named = ", ".join(theirs) + (f" with streamvae's {', '.join(ours)}" if ours else "")
    return f"video_codec_options: {codec} refuses {named} (FFmpeg: {failure})"


def _open_failure(codec: str, options: Mapping[str, str], height: int, width: int) -> str | None:
    """FFmpeg's words if ``codec`` does not open for ``height``×``width`` frames with ``options`` (and
    its log kept quiet, as every open is)."""
    quiet_encoder_logs(codec)
    context: Any = av.codec.CodecContext.create(codec, "w")
    context.width, context.height = width, height
    context.pix_fmt = ENCODER_PIXEL_FORMAT
    context.time_base = Fraction(1, 16)
    context.options = _quieted(codec, options)
    try:
        context.open()
    except av.FFmpegError as error:
        return str(error.strerror or error)
    return None


# -- a named encoder: its checks and defaults --


def default_codec_options(codec: str, output: OutputKind = "mp4") -> dict[str, str]:
    """Options that keep an encode up with a GPU decode: x264's crf 18, veryfast and a bounded thread count
    (:func:`_neutral_defaults`), in the terms of ``codec``'s :class:`Rung` (:meth:`Rung.options`: for
    x264/x265 as they are, with ``tune=zerolatency`` for fragmented output; for SVT-AV1 and libvpx-vp9
    translated, with their own low-latency modes). NVENC, and encoders without a rung: none.

    The thread count is ``min(4, cores)``; pin ``threads`` yourself for byte-identical output across machines.
    zerolatency turns off frame reordering (B-frames) and the lookahead, so the first packet comes out with
    frame 0 instead of ~11 frames later: a streamed frame is only worth something once it has left.
    """
    rung = video_rung(codec)
    if rung is None or not rung.named_defaults:
        return {}
    return rung.options(_neutral_defaults(), output)


@functools.cache
def _codec_option_names(codec: str) -> frozenset[str]:
    options = av.codec.CodecContext.create(codec, "w").supported_options
    return frozenset(option.name for option in (*options.generic, *options.private))


#: The pixel format every video encoder is fed: rgb24 frames are converted to it (BT.709) on the way.
ENCODER_PIXEL_FORMAT = "yuv420p"


def check_video_codec(codec: object, options: Mapping[str, str] | None = None) -> None:
    """Raise ValueError unless ``codec`` names a video encoder of this PyAV build that can write this
    library's video, and every key of ``options`` is an option that encoder has (FFmpeg would silently
    ignore an unknown one), with a value it opens with (a test open; :func:`_check_at_door`).

    It can when the MP4 muxer takes its stream and it takes :data:`ENCODER_PIXEL_FORMAT` frames, which
    every encoder is opened for: one that takes only RGB (``libx264rgb``, ``png``) would refuse to open
    at the first frame, once the decode had begun. An encoder that names no pixel formats (hardware and
    wrapper encoders) is let through; its open says. A named encoder is never replaced by another: one
    this build lacks is refused here, before any work. ``"auto"`` takes the codec-neutral options only;
    which rung it opens is decided when the session's first frame is encoded.
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
            f"(FFmpeg {av.ffmpeg_version_info}); {_try_instead()}"
        ) from None
    if encoder.type != "video":
        raise ValueError(
            f"video_codec {codec!r} is an {encoder.type} encoder, not a video encoder; {_try_instead()}"
        )
    if encoder.name not in _mp4_codecs():
        raise ValueError(
            f"video_codec {codec!r}: FFmpeg's MP4 muxer does not take its stream; {_try_instead()}"
        )
    formats = encoder.video_formats
    if formats is not None and ENCODER_PIXEL_FORMAT not in {f.name for f in formats}:
        taken = ", ".join(f.name for f in formats[:6]) + (", …" if len(formats) > 6 else "")
        raise ValueError(
            f"video_codec {codec!r} takes {taken} frames, but every encoder here is fed "
            f"{ENCODER_PIXEL_FORMAT} (rgb24 frames are converted to it); {_try_instead()}"
        )
    known = _codec_option_names(codec)
    for name in options or {}:
        if name not in known:
            hint = did_you_mean(name, sorted(known), most=3)
            raise ValueError(f"video_codec_options: {codec} has no option {name!r}{hint}")
    checked = {name: value for name, value in (options or {}).items() if not name.endswith("-params")}
    if checked:
        _check_at_door(codec, tuple(checked.items()))


@functools.lru_cache(maxsize=256)
def _check_at_door(codec: str, options: tuple[tuple[str, str], ...]) -> None:
    """:func:`refused_option` for the user's ``options`` over the defaults, at a size every encoder takes:
    a value FFmpeg refuses (``crf="banana"``) is a ValueError here, not at the first frame. A pass is
    remembered, once per process and set of options (a server builds the same options for every
    request); a refusal is not (``lru_cache`` keeps no exception): a hardware encoder's test open may fail
    for a GPU busy for now, and a refused request is no hot path.

    An encoder's own parameter list (``x264-params``, ``svtav1-params``...) is left to the open, which
    names a refusal as well: its parameters may depend on the frame size (x264's ``crop-rect``), which the
    door does not know.
    """
    given = dict(options)
    refusal = refused_option(codec, given, merge_codec_options(codec, given))
    if refusal is not None:
        raise ValueError(refusal)


def _try_instead() -> str:
    """The encoder a refused ``video_codec`` message suggests: libx264 where this build has it, else the
    ladder (a build without GPL parts has none)."""
    try:
        av.codec.Codec("libx264", "w")
    except av.codec.codec.UnknownCodecError:
        return f"try 'auto' (the first of {_LADDER_NAMES} that works here)"
    return "try 'libx264'"


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
    A user's ``tune`` replaces the default zerolatency (and so may bring the lookahead back), as a user's
    ``svtav1-params`` replaces SVT-AV1's default one (and its real-time mode with it). x265 logs errors
    only (:attr:`Rung.quiet`) unless the user's ``x265-params`` sets its ``log-level``."""
    merged = default_codec_options(codec, output)
    options = dict(options or {})
    if _RATE_CONTROL_OPTIONS & options.keys():
        merged.pop("crf", None)
    return _quieted(codec, {**merged, **options})


def _quieted(codec: str, options: Mapping[str, str]) -> dict[str, str]:
    """``options`` with ``codec``'s :attr:`Rung.quiet` parameters merged into their lists, where the
    user's list does not set them (a ``log-level`` of the user's is asking for the log)."""
    quieted = dict(options)
    rung = video_rung(codec)
    for name, parameters in () if rung is None else rung.quiet:
        given = quieted.get(name)
        quieted[name] = parameters if not given else _merged_parameters(parameters, given)
    return quieted


# -- the codec-neutral options of "auto" --

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
#: x264's presets → SVT-AV1's (0 slowest … 13 fastest; veryfast is 10, SVT-AV1's own default).
SVT_AV1_PRESETS = dict(zip(X264_PRESETS, ("12", "11", "10", "9", "8", "7", "6", "5", "4", "2"), strict=True))
#: x264's presets → libvpx-vp9's ``cpu-used`` under its realtime deadline (8 fastest).
VP9_SPEEDS = dict(zip(X264_PRESETS, ("8", "8", "7", "6", "6", "5", "4", "3", "2", "1"), strict=True))
#: The largest crf x264 takes (0 is lossless).
MAX_CRF = 51
#: The largest crf SVT-AV1 and libvpx-vp9 take: x264's 0–51 is stretched onto their 0–63.
_MAX_AV1_VP9_CRF = 63
#: SVT-AV1's highest level of parallelism (``lp``): a level, not a thread count.
_MAX_SVT_PARALLELISM = 6


#: The largest ``threads`` and ``g`` every rung opens with: FFmpeg keeps each in a C int (one more is "out
#: of range" at open). libx264 caps the threads it starts (67 at 1080p, from 1000 up), libvpx at 64.
_MAX_C_INT = 2**31 - 1
#: ASCII digits, with an optional fraction: ``float()`` also takes " 18", "1e1", "18_0", "inf", "nan" and
#: other scripts' digits, some of which FFmpeg refuses
_PLAIN_DECIMAL = re.compile(r"[0-9]+(\.[0-9]+)?")
#: ASCII digits alone: ``str.isdigit()`` also takes "²" and "١٢", which FFmpeg does not
_PLAIN_DIGITS = re.compile(r"[0-9]+")


def _check_neutral_options(options: Mapping[str, str]) -> None:
    """Raise ValueError unless every option is codec-neutral, with a value every rung takes.

    Each value has one plain form: a value one rung refuses would pass the check and fail every session
    that rung opens for at its first frame (a server: every request a 500).
    """
    for name, value in options.items():
        if name not in CODEC_NEUTRAL_OPTIONS:
            raise ValueError(
                f"video_codec_options: {name!r} is not codec-neutral: video_codec='auto' may choose any of "
                f"{_LADDER_NAMES}, and accepts only {', '.join(CODEC_NEUTRAL_OPTIONS)} "
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
    """The options rung ``codec`` gets under ``video_codec="auto"``: the codec-neutral ``options`` over
    :func:`_neutral_defaults`, in the rung's own terms (:meth:`Rung.options`; each rung's translation says
    what it does with each option). ValueError for an encoder without a rung.
    """
    rung = video_rung(codec)
    if rung is None:
        raise ValueError(f"auto_codec_options: {codec!r} is not a rung of {_LADDER_NAMES}")
    return rung.options({**_neutral_defaults(), **(options or {})}, output)


def _neutral_defaults() -> dict[str, str]:
    """The codec-neutral options every rung starts from: crf 18, veryfast, ``min(4, cores)`` threads."""
    return {"crf": "18", "preset": "veryfast", "threads": str(min(4, os.cpu_count() or 1))}


def _stretched(crf: float) -> int:
    """x264's crf (0–51) on the 0–63 scale of SVT-AV1 and libvpx-vp9, rounded."""
    return round(crf * _MAX_AV1_VP9_CRF / MAX_CRF)


# -- the rung table --


@dataclass(frozen=True)
class Rung:
    """A video encoder streamvae configures: the one record of what is particular to it.

    A new encoder for the ladder is a record in :data:`VIDEO_RUNGS` with its translation of the
    codec-neutral options; nothing else lists the encoders.
    """

    #: FFmpeg's name of the encoder
    name: str
    #: the codec-neutral options (``crf`` and ``preset`` given, ``threads`` and ``g`` when set) in its own
    #: terms, for an output kind (its own low-latency mode included; a look-ahead one's is :meth:`options`')
    translate: Callable[[Mapping[str, str], OutputKind], dict[str, str]]
    #: the options that give it a keyframe (IDR: a sync sample) exactly every N frames and nowhere else,
    #: scene cuts included: what ``keyframe_interval`` N means on every rung (:func:`with_keyframe_cadence`)
    cadence: Callable[[int], dict[str, str]]
    #: it looks ahead and reorders frames unless its ``tune`` is zerolatency (set for fragmented output)
    lookahead: bool
    #: the start of the RFC 6381 codec string its MP4 carries (``avc1``); None: one streamvae does not read
    codecs: str | None
    #: it copies each input picture inside ``encode()`` (x264_encoder_encode, x265_encoder_encode), so a
    #: frame may wrap memory the caller reuses as soon as the call returns
    copies_frames: bool = False
    #: named by ``video_codec``, it opens with :func:`_neutral_defaults` in its terms; False: FFmpeg's own
    named_defaults: bool = True
    #: (option, ``key=value`` parameters) that keep its own log to errors, merged into that parameter list
    #: unless the user's list sets the key (:func:`merge_codec_options`)
    quiet: tuple[tuple[str, str], ...] = ()
    #: (variable, value) that keeps its own log to errors where it takes no option for it, set unless the
    #: user set the variable (:func:`quiet_encoder_logs`)
    log_environment: tuple[str, str] | None = None
    #: the smallest height and width it opens for (:func:`frame_size_refusal`)
    smallest_side: int = 1
    #: its options for frames of a size (height, width): those it would hang at, changed
    #: (:func:`for_frame_size`); None: the same for every size
    sized: Callable[[Mapping[str, str], int, int], dict[str, str]] | None = None

    def options(self, neutral: Mapping[str, str], output: OutputKind) -> dict[str, str]:
        """``neutral`` in this encoder's terms; a look-ahead encoder's fragmented output gets zerolatency."""
        options = self.translate(neutral, output)
        if self.lookahead and output == "fragmented":
            options["tune"] = "zerolatency"
        return options


def _as_x264(neutral: Mapping[str, str], output: OutputKind) -> dict[str, str]:
    """x264 and x265: the codec-neutral options are theirs, as they are."""
    return dict(neutral)


def _as_nvenc(neutral: Mapping[str, str], output: OutputKind) -> dict[str, str]:
    """h264_nvenc: ``crf`` N → ``rc=vbr``, ``cq`` N, ``b=0`` (constant quality on NVENC's own, roughly
    comparable, scale), ``preset`` through :data:`NVENC_PRESETS`, ``threads`` and ``g`` as they are, and
    for fragmented output ``zerolatency`` (no reordering delay)."""
    options = {"rc": "vbr", "cq": neutral["crf"], "b": "0", "preset": NVENC_PRESETS[neutral["preset"]]}
    if output == "fragmented":
        options["zerolatency"] = "1"
    return options | _given(threads=neutral.get("threads"), g=neutral.get("g"))


def _as_svtav1(neutral: Mapping[str, str], output: OutputKind) -> dict[str, str]:
    """libsvtav1: ``crf`` stretched from x264's 0–51 onto SVT-AV1's 1–63 (18 → 22; it has no lossless
    crf), ``preset`` through :data:`SVT_AV1_PRESETS`, ``threads`` as its level of parallelism ``lp`` (0 its
    choice, 1 its fewest threads, at most 6), ``g`` 0 as 1 (every frame a keyframe: FFmpeg's wrapper leaves
    0 to SVT-AV1's default). For fragmented output its real-time mode ``rtc=1``: low delay, one packet per
    frame (its default random-access order holds ~20 frames back)."""
    crf, threads, keyframes = float(neutral["crf"]), neutral.get("threads"), neutral.get("g")
    options = {"crf": str(max(1, _stretched(crf))), "preset": SVT_AV1_PRESETS[neutral["preset"]]}
    parameters = [] if threads is None else [f"lp={min(int(threads), _MAX_SVT_PARALLELISM)}"]
    if output == "fragmented":
        parameters.append("rtc=1")
    if parameters:
        options["svtav1-params"] = ":".join(parameters)
    return options | _given(g=None if keyframes is None else str(max(1, int(keyframes))))


def _as_vp9(neutral: Mapping[str, str], output: OutputKind) -> dict[str, str]:
    """libvpx-vp9: ``crf`` stretched onto 0–63 with ``b=0`` (constant quality), ``preset`` as ``cpu-used``
    through :data:`VP9_SPEEDS`, ``threads`` and ``g`` as they are, and always the realtime deadline,
    ``lag-in-frames=0`` and ``row-mt=1``: at the good deadline it is ~2× slower than x264 veryfast, and
    under the realtime one a lookahead only holds frames back (measured: the same bytes)."""
    options = {"crf": str(_stretched(float(neutral["crf"]))), "b": "0", "deadline": "realtime"}
    options.update({"cpu-used": VP9_SPEEDS[neutral["preset"]], "lag-in-frames": "0", "row-mt": "1"})
    return options | _given(threads=neutral.get("threads"), g=neutral.get("g"))


def _x264_cadence(interval: int) -> dict[str, str]:
    """libx264: ``g`` (its keyint) and ``keyint_min`` both N, and ``sc_threshold=0``: no keyframe at a scene
    cut (x264's scenecut otherwise starts a new GOP there, and the cadence after it shifts)."""
    return {"g": str(interval), "keyint_min": str(interval), "sc_threshold": "0"}


def _x265_cadence(interval: int) -> dict[str, str]:
    """libx265: ``g`` and ``keyint_min`` N, and in its ``x265-params`` ``scenecut=0`` and ``open-gop=0``
    (x265 opens GOPs by default: a CRA keyframe whose next frames need the GOP before it to decode)."""
    return {"g": str(interval), "keyint_min": str(interval), "x265-params": "scenecut=0:open-gop=0"}


def _nvenc_cadence(interval: int) -> dict[str, str]:
    """h264_nvenc: ``g`` N (FFmpeg makes its IDR period the GOP length), ``no-scenecut=1`` (no adaptive I
    frame at a scene cut) and ``forced-idr=1`` (a keyframe asked for is an IDR, never a plain I frame)."""
    return {"g": str(interval), "no-scenecut": "1", "forced-idr": "1"}


def _svtav1_cadence(interval: int) -> dict[str, str]:
    """libsvtav1: ``g`` N and, in its ``svtav1-params``, ``keyint`` N (which SVT-AV1 reads over ``g``) and
    ``scd=0`` (scene change detection off; SVT-AV1 2.x puts no keyframe at a cut even with it on, but its
    forks and older versions do)."""
    return {"g": str(interval), "svtav1-params": f"keyint={interval}:scd=0"}


def _vp9_cadence(interval: int) -> dict[str, str]:
    """libvpx-vp9: ``g`` and ``keyint_min`` N: FFmpeg sets libvpx's ``kf_min_dist`` only when it equals the
    GOP size, and libvpx then places keyframes at a fixed distance (no automatic one at a cut)."""
    return {"g": str(interval), "keyint_min": str(interval)}


#: Options whose value is a ``key=value:key=value`` list of the encoder's own parameters: a cadence merges
#: its parameters into the list, replacing only the keys it names.
_PARAMETER_LISTS = ("svtav1-params", "x265-params")


def with_keyframe_cadence(codec: str, options: Mapping[str, str], keyframe_interval: int) -> dict[str, str]:
    """``options`` (an encoder's, merged and translated) with ``codec``'s :attr:`Rung.cadence`: a keyframe
    exactly every N frames and nowhere else, scene cuts included. N is ``options``' ``g`` where it is plain
    digits (a ``g`` of the user's own: 0 reads as 1, every frame), else ``keyframe_interval``.

    The cadence's options replace the same-named ones in ``options`` (a ``sc_threshold`` of the user's
    would bring keyframes at scene cuts back); in ``svtav1-params`` and ``x265-params`` only the keys it
    names. An encoder without a rung gets ``g`` N alone: what it does at a scene cut is its own.
    """
    given = options.get("g")
    interval = max(1, int(given)) if given is not None and _is_c_int_digits(given) else keyframe_interval
    rung = video_rung(codec)
    cadence = {"g": str(interval)} if rung is None else rung.cadence(interval)
    merged = dict(options)
    for name, value in cadence.items():
        given = options.get(name) if name in _PARAMETER_LISTS else None
        merged[name] = value if not given else _merged_parameters(given, value)
    return merged


def _merged_parameters(parameters: str, overrides: str) -> str:
    """The ``key=value:...`` list ``parameters`` with the keys of ``overrides`` set to its values."""
    items = dict(item.partition("=")[::2] for item in parameters.split(":") if item)
    items.update(item.partition("=")[::2] for item in overrides.split(":"))
    return ":".join(f"{key}={value}" if value else key for key, value in items.items())


def frame_size_refusal(codec: str, height: int, width: int) -> str | None:
    """Why ``codec`` cannot encode ``height``×``width`` frames (a side under its :attr:`Rung.smallest_side`),
    or None. A named encoder is refused at the first chunk; ``"auto"`` climbs past the rung."""
    rung = video_rung(codec)
    if rung is None or min(height, width) >= rung.smallest_side:
        return None
    side = rung.smallest_side
    return f"{codec} encodes frames of at least {side}×{side} pixels, got {height}×{width}"


def for_frame_size(codec: str, options: Mapping[str, str], height: int, width: int) -> dict[str, str]:
    """``options`` (an encoder's, merged and translated) for ``height``×``width`` frames: its rung's
    :attr:`Rung.sized` changes, or the same options."""
    rung = video_rung(codec)
    if rung is None or rung.sized is None:
        return dict(options)
    return rung.sized(options, height, width)


#: SVT-AV1 encodes frames with a side under this at ``lp=1`` (:func:`_svtav1_sized`)
_SVT_SHORT_SIDE = 32


def _svtav1_sized(options: Mapping[str, str], height: int, width: int) -> dict[str, str]:
    """libsvtav1, frames with a side under 32 pixels: ``lp=1`` in its ``svtav1-params``, whatever was asked.

    SVT-AV1 (4.1, measured over short sides 4–64 against long sides 8–4096) never returns from encoding
    frames with a side of 24 pixels or fewer when it runs more than one thread (``lp`` 2–6, its own choice,
    or ``threads``), and no cancellation reaches into it; at ``lp=1`` every size from 4×4 encodes in
    milliseconds. 32 leaves a margin. ``lp`` sets how many threads it runs, and such frames are small.
    """
    if min(height, width) >= _SVT_SHORT_SIDE:
        return dict(options)
    sized = dict(options)
    given = sized.get("svtav1-params")
    sized["svtav1-params"] = "lp=1" if not given else _merged_parameters(given, "lp=1")
    return sized


def _given(**options: str | None) -> dict[str, str]:
    """The options that have a value."""
    return {name: value for name, value in options.items() if value is not None}


#: ``video_codec="auto"``'s ladder, in the order it is climbed: NVENC where the GPU has it (FFmpeg's own
#: defaults when named), then x264, then the two that builds without GPL parts keep (SVT-AV1, libvpx's VP9).
#: Every one writes MP4 a browser plays.
VIDEO_RUNGS = (
    Rung("h264_nvenc", _as_nvenc, _nvenc_cadence, lookahead=False, codecs="avc1", named_defaults=False),
    Rung("libx264", _as_x264, _x264_cadence, lookahead=True, codecs="avc1", copies_frames=True),
    Rung(
        "libsvtav1",
        _as_svtav1,
        _svtav1_cadence,
        lookahead=False,
        codecs="av01",
        log_environment=("SVT_LOG", "1"),  # 1: errors (its banner and warnings are 3 and 2)
        smallest_side=4,  # its open refuses a side under 4
        sized=_svtav1_sized,
    ),
    Rung("libvpx-vp9", _as_vp9, _vp9_cadence, lookahead=False, codecs="vp09"),
)
#: Configured as libx264 is (its cadence in x265's terms), and never climbed to: few browsers play HEVC
#: from MP4.
_LIBX265 = Rung(
    "libx265",
    _as_x264,
    _x265_cadence,
    lookahead=True,
    codecs=None,
    copies_frames=True,
    quiet=(("x265-params", "log-level=error"),),  # else a banner at every open, a summary at every close
)
_RUNGS = {rung.name: rung for rung in (*VIDEO_RUNGS, _LIBX265)}
#: the ladder as messages name it
_LADDER_NAMES = ", ".join(rung.name for rung in VIDEO_RUNGS)


def video_rung(codec: str | None) -> Rung | None:
    """The :class:`Rung` of encoder ``codec``; None for one streamvae leaves to FFmpeg's defaults."""
    return None if codec is None else _RUNGS.get(codec)
