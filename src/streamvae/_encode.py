"""Encode: one MP4 per batch entry, H.264 (or another FFmpeg codec) with an optional AAC (or Opus) track.

An :class:`EntryEncoder` is driven from a worker thread, a call or two per transfer group (fragmented
output: its first frame alone, which closes the previous group's fragment, then the rest). It never crosses
into the event loop: the bytes the muxer writes are collected in memory and handed back as the return
value of :meth:`EntryEncoder.encode` / :meth:`EntryEncoder.finish`, between frames — PyAV swallows a
``BaseException`` raised inside a ``write()`` callback and would "complete" a truncated file. They come
back as :class:`MP4Piece` (whole fragments that know their frames, cut here once, in the worker thread),
which every consumer downstream takes as they are.

The container is opened here, so its muxer options and I/O are here too, one target per kind of output
with one interface: :class:`FragmentedTarget` (fragments handed on as the muxer writes them) and
:class:`FaststartTarget` (the whole file at the end). The soundtrack is :class:`_Soundtrack`, fed from one
:class:`LiveAudioTrack` whether the audio is pushed as it is made or given whole (a track that is already
complete). The climb down ``video_codec="auto"``'s ladder when an open fails is here; what each codec is
opened with (the rung table, defaults, checks and probes) is ``_codec_options``'. A soundtrack is AAC at
the waveform's own rate where this build has an AAC encoder and AAC takes that rate (else resampled to one
it takes); else Opus, resampled to 48 kHz (Opus takes no 44.1 kHz), on the same timeline.

Each encoder's calls run in a thread of its own, :class:`EncoderWorker`, whose caller can leave when
cancelled: an encoder is C code that may never return, and nothing may hold a cancelled caller.
"""

from __future__ import annotations

import contextlib
import io
import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any, Protocol, TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel
import av
import numpy as np
from av.video.reformatter import ColorRange, Colorspace

from streamvae._codec_options import (
    ENCODER_PIXEL_FORMAT,
    OPEN_FAILURES,
    VIDEO_RUNGS,
    OutputKind,
    audio_encoder,
    audio_encoder_rate,
    auto_codec_options,
    encode_failure,
    for_frame_size,
    frame_size_refusal,
    merge_codec_options,
    quiet_encoder_logs,
    refused_option,
    video_rung,
    with_keyframe_cadence,
)
from streamvae._errors import NoEncoderError
from streamvae._fragments import FragmentCutter, MP4Piece, codec_string
from streamvae._live_audio import LiveAudioTrack, samples_for_frames
from streamvae._output_file import OutputFile
from streamvae._provenance import Provenance
from streamvae._quantize import PixelFormat
from streamvae._xmp import xmp_mark

__all__ = [
    "ENCODER_GRACE_SECONDS",
    "EncoderWorker",
    "EntryEncoder",
    "FaststartTarget",
    "FragmentedTarget",
    "OutputTarget",
    "end_workers",
    "faststart_io_open",
    "open_containers",
    "open_entry_encoders",
]


# FFmpeg's AVCOL_* codes for BT.709 primaries / transfer / matrix, and limited ("MPEG") range.
_BT709 = 1
_LIMITED_RANGE = 1


# -- the container: how many are open --

_open_containers = 0
_open_containers_lock = threading.Lock()


def open_containers() -> int:
    """MP4 containers open in this process right now (a leak check for tests and servers)."""
    return _open_containers


def _opened(container: Any) -> Any:
    global _open_containers
    with _open_containers_lock:
        _open_containers += 1
    return container


def _close(container: Any) -> None:
    global _open_containers
    with _open_containers_lock:
        _open_containers -= 1
    container.close()


# -- the targets: where the muxer writes, and how its bytes come out --


class OutputTarget(Protocol):
    """Where an entry's muxer writes, one per kind of output, made afresh for each open.

    :meth:`take` and :meth:`finish` return ``(bytes, pieces)``: the bytes the muxer wrote since the last
    call (what an output file gets) and the pieces they complete (what is handed on). A target holds what
    it was written until the encoder drops it.
    """

    def open_container(self) -> Any:
        """A PyAV container for writing into this target, with the muxer's options."""
        ...

    def take(self) -> tuple[bytes, list[MP4Piece]]:
        """While encoding: what the muxer wrote since the last call, and the pieces it completes."""
        ...

    def finish(self, frames: int) -> tuple[bytes, list[MP4Piece]]:
        """Once the container closed (its trailer written, ``frames`` frames in all): the rest."""
        ...


class FragmentedTarget:
    """Fragmented MP4 (``output="fragmented"``): every fragment is handed on as the muxer writes it.

    The muxer writes into a :class:`_ByteCollector`; its bytes are cut once, by a :class:`FragmentCutter`,
    into whole fragments that know their frames. ``mark``: boxes the cutter puts after the ``moov`` (the
    XMP mark); the bytes handed on are then the pieces', which hold it.
    """

    def __init__(self, fps: Fraction, fragment_frames: int, mark: bytes = b"") -> None:
        self._fps = fps
        self._fragment_frames = fragment_frames
        self._collector = _ByteCollector()
        self._cutter = FragmentCutter(mark)
        self._marked = bool(mark)

    def muxer_options(self) -> dict[str, str]:
        """A fragment every ``fragment_frames`` frames, whatever the keyframes.

        FFmpeg's mov muxer closes a fragment only when the next packet arrives (PyAV has no call that
        flushes one on demand): ``frag_every_frame`` closes it at the very next packet, and
        ``min_frag_duration`` (half a frame under ``fragment_frames`` frames) keeps it open until it holds
        that many. The gate is needed even for one frame a fragment: an audio packet that closes a fragment
        holding a single video frame leaves that frame with a duration of 0 and shifts the ones after it
        (FFmpeg 8.1). ``delay_moov``: the moov waits for the first packets, so it carries the edit list
        that starts every track at 0 (AAC's priming, or B-frames a user turned back on, would otherwise
        shift the timeline).
        """
        microseconds = (Fraction(self._fragment_frames) - Fraction(1, 2)) / self._fps * 1_000_000
        return {
            "movflags": "empty_moov+default_base_moof+frag_every_frame+delay_moov",
            "min_frag_duration": str(int(microseconds)),
        }

    def open_container(self) -> Any:
        return av.open(self._collector, mode="w", format="mp4", options=self.muxer_options())

    def take(self) -> tuple[bytes, list[MP4Piece]]:
        data = self._collector.take()
        pieces = self._cutter.feed(data) if data else []
        return (b"".join(piece.data for piece in pieces) if self._marked else data), pieces

    def finish(self, frames: int) -> tuple[bytes, list[MP4Piece]]:
        data, pieces = self.take()
        rest = self._cutter.rest()  # what follows the last fragment: the mfra
        if rest is None:
            return data, pieces
        return (data + rest.data if self._marked else data), [*pieces, rest]


class FaststartTarget:
    """A plain MP4 (``output="mp4"``): written into memory, the moov moved to the front when the trailer is
    written, and handed on whole, one piece, at the end (it is only complete once the moov is written)."""

    def __init__(self, fps: Fraction) -> None:
        self._fps = fps
        self._memory = io.BytesIO()

    def muxer_options(self) -> dict[str, str]:
        """faststart: the moov up front, so a player starts before the whole file has arrived."""
        return {"movflags": "+faststart"}

    def open_container(self) -> Any:
        io_open = faststart_io_open(self._memory)
        return av.open(self._memory, mode="w", format="mp4", options=self.muxer_options(), io_open=io_open)

    def take(self) -> tuple[bytes, list[MP4Piece]]:
        return b"", []  # nothing is whole before the trailer

    def finish(self, frames: int) -> tuple[bytes, list[MP4Piece]]:
        data = self._memory.getvalue()
        # Every frame lasts one frame (the encoder's packets say so), and an MP4 starts at a keyframe.
        piece = MP4Piece(data, frames, frames, codec_string(data), frames > 0, frames / self._fps)
        return data, [piece]


class _Aborted(Exception):
    """Raised out of a signing commit that :meth:`EntryEncoder.close` aborted meanwhile (never escapes)."""


def _target(output: OutputKind, fps: Fraction, fragment_frames: int, mark: bytes) -> OutputTarget:
    if output == "fragmented":
        return FragmentedTarget(fps, fragment_frames, mark)
    return FaststartTarget(fps)


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


class _ByteCollector:
    """A write-only, non-seekable file for PyAV: it keeps what the muxer writes until taken."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        data, self._parts = b"".join(self._parts), []
        return data


# -- the soundtrack --


class _Soundtrack:
    """An entry's audio stream in its container, fed from one :class:`LiveAudioTrack` up to the video's time.

    AAC, or where this build has no AAC encoder Opus, at the rate the encoder takes for the track's
    (:func:`audio_encoder_rate`: AAC at the track's own where it takes it, Opus at 48 kHz). A track at
    another rate, or in other samples than the encoder's (libopus takes packed ones), goes through a
    resampler. Every call continues the one stream, which starts at 0 like the video.
    """

    def __init__(self, container: Any, track: LiveAudioTrack, sample_rate: int) -> None:
        self.codec = audio_encoder()
        self._container = container
        self._track = track
        self._rate = sample_rate
        self._layout = "mono" if track.channels == 1 else "stereo"
        self._encoder_rate = rate = audio_encoder_rate(self.codec, sample_rate)
        self._stream = container.add_stream(self.codec, rate=rate, layout=self._layout)
        self._resampler: Any = None  # the track's rate and samples → the encoder's
        encoded = self._stream.codec_context.format.name  # the stream's own: s16 for libopus
        if rate != sample_rate or encoded != "fltp":
            self._resampler = av.AudioResampler(format=encoded, layout=self._layout, rate=rate)
        self._sent = 0  # samples of the track's rate encoded so far
        self._out = 0  # samples the audio encoder was given, at its own rate

    def send(self, until: int) -> None:
        """Encode the track's samples after those sent so far, up to sample index ``until``, as far as they
        have arrived (a complete track: and silence for any missing, since no more will come)."""
        if until <= self._sent:
            return
        start = self._sent
        piece = self._track.take(until - start)
        if not piece.shape[1]:
            return  # nothing has arrived: the audio catches up at the next call
        frame = av.AudioFrame.from_ndarray(piece, format="fltp", layout=self._layout)
        frame.sample_rate = self._rate
        frame.pts = start
        frame.time_base = Fraction(1, self._rate)
        self._sent = start + piece.shape[1]
        if self._resampler is None:
            _mux(self._container, self._stream.encode(frame))
        else:
            self._encode_resampled(self._resampler.resample(frame))

    def finish(self, until: int) -> None:
        """The track is complete: encode it up to ``until`` (silence for what never came), then flush."""
        self._track.end()
        self.send(until)
        if self._resampler is not None:
            self._encode_resampled(self._resampler.resample(None))  # the samples it still holds
        _mux(self._container, self._stream.encode(None))

    def _encode_resampled(self, frames: list[Any]) -> None:
        """Encode resampled ``frames``, stamped with the samples before them at the encoder's rate: the
        resampler's own timestamps round, and a track stamped by its sample count never drifts."""
        for frame in frames:
            frame.pts, frame.time_base = self._out, Fraction(1, self._encoder_rate)
            self._out += frame.samples
            _mux(self._container, self._stream.encode(frame))


def _mux(container: Any, packets: list[Any]) -> None:
    if packets:
        container.mux(packets)


# -- the encoder's worker: calls a cancelled caller can leave --

_T = TypeVar("_T")


class EncoderWorker:
    """The thread one entry's encoder runs in: its calls run there in turn, and a cancelled caller leaves
    without waiting for the call it was in.

    An encoder is C code that may never return (SVT-AV1 did, on frames of few rows), and no cancellation
    reaches into it. A caller waiting on an anyio worker thread would be held as long, and at exit the
    interpreter would wait for that thread too. Here the caller waits on an event the call sets, so a cancel
    gets it out at once, as the ring's copy wait does; the call goes on in this thread, a daemon that holds
    no exit, and :meth:`EntryEncoder.close` leaves the release of what the call holds to the call itself.
    :func:`end_workers` then gives the calls in flight a grace to return, so that a session that stops
    normally leaves nothing open.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._calls: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._last: anyio.Event | None = None  # set once the last call submitted has returned
        self._lock = threading.Lock()

    async def run(self, func: Callable[..., _T], *args: Any, limiter: anyio.CapacityLimiter) -> _T:
        """``func(*args)`` in this worker's thread, holding one of ``limiter``'s tokens; its result, or its
        exception. Cancelled, it leaves at once (and gives the token back): the call runs on unwaited."""
        token = anyio.lowlevel.current_token()
        done = anyio.Event()
        outcome: list[tuple[Any, BaseException | None]] = []

        def call() -> None:
            try:
                outcome.append((func(*args), None))
            except BaseException as error:  # handed to the caller, who raises it
                outcome.append((None, error))
            with contextlib.suppress(RuntimeError):  # the event loop has ended: nobody waits any more
                anyio.from_thread.run_sync(done.set, token=token)

        async with limiter:
            self._submit(call, done)
            await done.wait()
        result, error = outcome.pop()
        if error is None:
            return result  # type: ignore[no-any-return]
        try:
            raise error
        finally:
            del error  # no cycle through its traceback and this frame

    def stop(self) -> None:
        """No more calls: the thread ends once those queued have run (a call that never returns keeps it)."""
        self._calls.put(None)

    async def join(self) -> None:
        """After :meth:`stop`: wait until the last call returned (a cancel leaves this wait), then until the
        thread ended (at once: it has only to read the stop)."""
        with self._lock:
            last, thread = self._last, self._thread
        if last is None or thread is None:
            return
        await last.wait()
        await anyio.to_thread.run_sync(thread.join, limiter=anyio.CapacityLimiter(1))

    def _submit(self, call: Callable[[], None], done: anyio.Event) -> None:
        with self._lock:
            self._last = done
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
                self._thread.start()
        self._calls.put(call)

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            call()


#: How long a stopping pipeline waits for its encoders' calls in flight to return (:func:`end_workers`).
#: An encode or a flush takes milliseconds to a second; a call still running after this is left to its
#: thread, which releases what it holds if it ever returns.
ENCODER_GRACE_SECONDS = 5.0


async def end_workers(encoders: Sequence[EntryEncoder]) -> None:
    """Wait for the worker of every encoder (each closed: its worker stopped) to end, shielded from
    cancellation for at most :data:`ENCODER_GRACE_SECONDS` in all.

    A call a cancelled caller left is usually a moment from returning, and returning it releases its
    container: waiting for it is what lets a cancelled or failed session leave no container and no thread
    behind. An encoder that never returns is left after the grace, so a cancelled caller gets out.
    """
    with anyio.move_on_after(ENCODER_GRACE_SECONDS, shield=True):
        for encoder in encoders:
            await encoder.worker.join()


# -- the encoder of one entry --


class EntryEncoder:
    """The MP4 of one batch entry, written frame by frame from a worker thread.

    Frames arrive as uint8 arrays, ``[T, H, W, 3]`` (rgb24, converted to BT.709 yuv420p by swscale) or
    ``[T, H * 3 // 2, W]`` (planar yuv420p, BT.709 limited range, used as is). The container opens with the
    first frames and is always closed, by :meth:`finish` or :meth:`close`. Audio — a whole waveform
    (``audio``: a track that is already complete) or a live track its pushes fill as the video goes
    (``live_audio``) — is one stream muxed interleaved with the video as frames arrive, up to the video's
    time and never ahead of it, both tracks starting at 0; at :meth:`finish` it is trimmed or padded with
    silence to the video's duration (a session checks first that a live track is within one frame of it).
    It is AAC at the waveform's rate (or the nearest rate above it that AAC takes; above 96 kHz, AAC's
    highest, 96 kHz), or where this build has no AAC encoder Opus at 48 kHz, resampled as it goes where
    the rate differs (the resampler's last samples are flushed at :meth:`finish`, so the track still
    lasts the video's duration). With ``file``, the MP4 is also written to that path, which holds either
    the complete file (after :meth:`finish`) or what it held before (see :class:`OutputFile`).

    ``provenance``: a regular file is signed with its Content Credentials before it is put in place (a
    :class:`streamvae.SigningError` leaves the path as it was; the options refuse a device or FIFO with
    provenance), and fragmented output carries the unsigned XMP mark (``_xmp``) after its ``moov``. The
    pieces of a plain MP4 are signed by the session (``_pipeline``), not here.

    :meth:`encode` and :meth:`finish` return the output as :class:`MP4Piece`, as the output's target
    (:class:`FragmentedTarget`, :class:`FaststartTarget`) cuts it: for fragmented output a piece per
    fragment as the muxer writes it (then the ``mfra``); a plain MP4 is one piece at :meth:`finish`.
    Fragmented output closes a fragment every ``fragment_frames`` frames, whatever the keyframes; the muxer
    writes it when the next packet arrives, so the pieces :meth:`encode` returns hold every frame before
    the first one it was given. :attr:`frames_out` counts the frames the returned pieces hold.

    ``keyframe_interval`` N: a keyframe exactly every N frames and nowhere else, scene cuts included, on
    every rung (its cadence options, :func:`with_keyframe_cadence`; a ``g`` among the codec options sets N
    instead). Without it, the encoder's own placement (x264 adds keyframes at scene cuts).

    ``video_codec="auto"``: the first rung of ``_codec_options.VIDEO_RUNGS`` (the rung table) whose probe
    encodes and whose open here succeeds, with the codec-neutral options translated for it
    (:func:`auto_codec_options`); :class:`NoEncoderError`, naming every rung, if none opens.

    Not thread-safe: one caller at a time (the session gives each entry its own task, which calls
    :meth:`encode` and :meth:`finish` through :attr:`worker`); only :meth:`open`, :meth:`unopen` and
    :meth:`close` may race (a cancelled session closes while another stage opens, or while a call it left
    is still in the worker: that call releases the container when it returns, and :meth:`close` never waits
    for it).
    """

    def __init__(
        self,
        *,
        fps: Fraction,
        pixel_format: PixelFormat = "rgb24",
        video_codec: str = "libx264",
        video_codec_options: Mapping[str, str] | None = None,
        audio: np.ndarray[Any, np.dtype[np.float32]] | None = None,
        audio_sample_rate: int | None = None,
        live_audio: LiveAudioTrack | None = None,
        output: OutputKind = "mp4",
        keyframe_interval: int | None = None,
        fragment_frames: int = 1,
        file: str | Path | None = None,
        provenance: Provenance | None = None,
    ) -> None:
        self.fps = fps
        self.pixel_format = pixel_format
        self.video_codec = video_codec
        self.output = output
        self._requested_options = dict(video_codec_options or {})
        self._keyframe_interval = keyframe_interval
        if keyframe_interval is not None:
            self._requested_options.setdefault("g", str(keyframe_interval))
        #: the options the video encoder opened with (under "auto": set once it opened)
        self.codec_options = {} if video_codec == "auto" else self._options_for(video_codec)
        #: the video encoder that opened (what "auto" chose); None before
        self.encoder_name: str | None = None
        #: the audio encoder that opened ("aac", else "libopus"); None before, or without audio
        self.audio_codec: str | None = None
        self.fragment_frames = fragment_frames
        self.file = Path(file) if file is not None else None
        self._provenance = provenance
        self._mark = xmp_mark() if provenance is not None and output == "fragmented" else b""
        if audio is not None and live_audio is not None:
            raise ValueError(
                "EntryEncoder takes audio (a whole waveform) or live_audio (a live track), not both"
            )
        if (audio is not None or live_audio is not None) and audio_sample_rate is None:
            raise ValueError("EntryEncoder: audio and live_audio need audio_sample_rate")
        self._track = LiveAudioTrack.whole(audio) if audio is not None else live_audio
        self._sample_rate = audio_sample_rate
        self.frames_encoded = 0
        #: frames held by the pieces returned so far (a frame waits in the muxer until its fragment closes)
        self.frames_out = 0
        self.bytes_out = 0
        # What an open makes, and a close or an unopen lets go: the target, the container and its streams.
        self._target: OutputTarget | None = None
        self._container: Any = None
        self._video: Any = None
        self._soundtrack: _Soundtrack | None = None
        self._file: OutputFile | None = None
        self._closed = False  # finish() or close() was called: nothing opens or encodes any more
        self._in_call = False  # encode() or finish() is running: a close() meanwhile leaves it the release
        self._aborted = False  # close() came while a call was in flight: finish() commits no file
        self._open_lock = threading.Lock()
        #: the thread :meth:`encode` and :meth:`finish` run in (started at the first call, ended by a close)
        self.worker = EncoderWorker(f"streamvae encoder ({video_codec})")

    # -- opening --

    def _options_for(self, codec: str) -> dict[str, str]:
        if self.video_codec == "auto":
            options = auto_codec_options(codec, self._requested_options, self.output)
        else:
            options = merge_codec_options(codec, self._requested_options, self.output)
        if self._keyframe_interval is None:
            return options
        return with_keyframe_cadence(codec, options, self._keyframe_interval)  # every rung, scene cuts too

    def frame_size(self, shape: Sequence[int]) -> tuple[int, int]:
        """(height, width) of frames whose arrays have ``shape`` (one frame's, as :meth:`encode` takes)."""
        if self.pixel_format == "rgb24":
            return shape[0], shape[1]
        return shape[0] * 2 // 3, shape[1]

    def open(self, height: int, width: int, codec: str | None = None) -> None:
        """Open the container and encoder for ``height``×``width`` frames (else :meth:`encode` does), once.

        ``codec`` picks the rung under ``video_codec="auto"``; without it, auto climbs the ladder (see
        :func:`open_entry_encoders`). A failed open raises, leaving this encoder unopened.
        """
        if self.video_codec == "auto" and codec is None:
            _open_on_ladder([self], height, width)
            return
        refusal = frame_size_refusal(self.video_codec if codec is None else codec, height, width)
        if refusal is not None:
            raise ValueError(refusal)
        with self._open_lock:
            if self._container is not None or self._closed:
                return
            self._open(height, width, self.video_codec if codec is None else codec)

    def unopen(self) -> None:
        """Undo an open before any frame was encoded (the ladder leaves a rung another entry could not
        open): the container closed and the output file's temporary removed, ready to open again. A no-op
        once :meth:`close` or :meth:`finish` was called."""
        with self._open_lock:
            if not self._closed:
                self._unopened()

    def _open(self, height: int, width: int, codec: str) -> None:
        try:
            self._open_streams(height, width, codec)
            self._video.codec_context.open()  # now: a failure to open is an error of opening
        except OPEN_FAILURES as error:
            self._unopened()
            if self.video_codec != "auto":  # "auto"'s options are its own, checked: the ladder goes on
                self._raise_refused_option(codec, height, width, error)
            raise
        except BaseException:
            self._unopened()
            raise
        self.encoder_name = codec

    def _raise_refused_option(self, codec: str, height: int, width: int, error: Exception) -> None:
        """Raise a ValueError naming the option ``codec`` refused (the user's first), if one is at fault."""
        options = self.codec_options
        given = {name: options[name] for name in self._requested_options if name in options}
        refusal = refused_option(codec, given, options, height, width)
        if refusal is not None:
            raise ValueError(refusal) from error

    def _unopened(self) -> None:
        self._release()
        self.encoder_name = self.audio_codec = None

    def _open_streams(self, height: int, width: int, codec: str) -> None:
        self._target = _target(self.output, self.fps, self.fragment_frames, self._mark)
        if self.file is not None:
            self._file = OutputFile(self.file)
            self._file.open()
        self._container = _opened(self._target.open_container())
        self.codec_options = for_frame_size(codec, self._options_for(codec), height, width)
        quiet_encoder_logs(codec)
        video = self._container.add_stream(codec, rate=self.fps, options=self.codec_options)
        video.width = width
        video.height = height
        video.pix_fmt = ENCODER_PIXEL_FORMAT
        video.codec_context.time_base = 1 / self.fps
        context = video.codec_context
        context.colorspace = context.color_primaries = context.color_trc = _BT709
        context.color_range = _LIMITED_RANGE
        self._video = video
        if self._track is not None:
            assert self._sample_rate is not None
            self._soundtrack = _Soundtrack(self._container, self._track, self._sample_rate)
            self.audio_codec = self._soundtrack.codec

    # -- encoding (worker thread) --

    def encode(self, frames: np.ndarray[Any, Any]) -> list[MP4Piece]:
        """Encode ``frames`` (see the class docstring) and return the pieces of output ready to hand on."""
        with self._call():
            return self._encode(frames)

    def _encode(self, frames: np.ndarray[Any, Any]) -> list[MP4Piece]:
        if self._closed:
            raise RuntimeError("EntryEncoder.encode() after finish() or close()")
        height, width = self.frame_size(frames.shape[1:])
        if self._container is None:
            self.open(height, width)
        for array in frames:
            frame = self._video_frame(array, height, width)
            frame.pts = self.frames_encoded
            self._mux_video(self._video.encode(frame))
            self.frames_encoded += 1
        if self._soundtrack is not None:
            self._soundtrack.send(self._audio_samples())
        assert self._target is not None
        return self._hand_on(*self._target.take())

    def _video_frame(self, array: np.ndarray[Any, Any], height: int, width: int) -> av.VideoFrame:
        if self.pixel_format == "rgb24":
            frame = av.VideoFrame.from_numpy_buffer(array, format="rgb24")
            return frame.reformat(
                format=ENCODER_PIXEL_FORMAT, dst_colorspace=Colorspace.ITU709, dst_color_range=ColorRange.MPEG
            )
        rung = video_rung(self.encoder_name)
        if height % 4 == 0 and rung is not None and rung.copies_frames:
            # Zero-copy: PyAV wraps the slot in a refcounted buffer that FFmpeg references, and these
            # encoders copy the picture before encode() returns, so the slot is free again after it.
            frame = av.VideoFrame.from_numpy_buffer(array, format="yuv420p")
        else:
            # A frame PyAV owns: other encoders may keep a reference to the picture after encode()
            # returns (and the ring reuses the slot then); and PyAV derives the height of a yuv420p
            # buffer as rows // 6 * 4, exact only for heights % 4 == 0.
            frame = av.VideoFrame(width, height, "yuv420p")
            flat = array.reshape(-1)
            luma, chroma = height * width, height * width // 4
            for plane, data in zip(
                frame.planes,
                (flat[:luma], flat[luma : luma + chroma], flat[luma + chroma :]),
                strict=True,
            ):
                rows = plane.height
                plane_view = np.frombuffer(memoryview(plane), np.uint8).reshape(rows, plane.line_size)
                plane_view[:, : plane.width] = data.reshape(rows, plane.width)
        frame.colorspace = Colorspace.ITU709
        frame.color_range = ColorRange.MPEG
        return frame

    def _audio_samples(self) -> int:
        """The audio samples that last as long as the frames encoded so far."""
        assert self._sample_rate is not None
        return samples_for_frames(self.frames_encoded, self.fps, self._sample_rate)

    def _mux_video(self, packets: list[Any]) -> None:
        # Every frame lasts one frame. x264 leaves the duration 0, and the muxer then writes a duration of 0
        # for a frame whose fragment another track's packet closes (a player shows it not at all).
        for packet in packets:
            packet.duration = 1
        _mux(self._container, packets)

    def _hand_on(self, data: bytes, pieces: list[MP4Piece]) -> list[MP4Piece]:
        """Account for what the target gave: ``data`` to the output file, ``pieces`` to the caller."""
        if data and self._file is not None:
            self._file.write(data)
        self.bytes_out += len(data)
        if pieces:
            self.frames_out = pieces[-1].frames_until
        return pieces

    def finish(self) -> list[MP4Piece]:
        """Flush the encoders, write the trailer and close; return the remaining pieces of output.

        For ``output="mp4"`` that is one piece, the whole file (it is only complete once the moov is
        written); for fragmented output the last fragments, then what follows them (the ``mfra``).
        """
        with self._call():
            return self._finish()

    def _finish(self) -> list[MP4Piece]:
        if self._closed:
            raise RuntimeError("EntryEncoder.finish() called twice")
        if self._container is None or self._target is None:
            raise RuntimeError("EntryEncoder.finish() before any frame was encoded")
        self._closed = True
        try:
            self._mux_video(self._video.encode(None))
            if self._soundtrack is not None:
                self._soundtrack.finish(self._audio_samples())
        finally:
            self._close_container()
        target, self._target = self._target, None  # handed over: keep no copy
        pieces = self._hand_on(*target.finish(self.frames_encoded))
        if self._file is not None:
            self._commit(self._file)
        return pieces

    def _commit(self, file: OutputFile) -> None:
        """The file appears at its path, complete (and signed), only now — unless :meth:`close` came while
        this call was in flight (a cancelled session): then it is aborted, ``path`` keeps what it had and
        no ``.part`` is left. Checked before the commit and again once signed (a slow KMS is where a cancel
        lands); a close in the last fsync and rename finds the complete file in place."""
        with self._open_lock:
            if self._aborted:
                file.abort()
                return
        with contextlib.suppress(_Aborted):  # the commit removed both temporary files
            file.commit(sign=None if self._provenance is None else self._sign_file)

    def _sign_file(self, source: Path, destination: Path) -> None:
        assert self._provenance is not None
        self._provenance.sign_file(source, destination, what=f"the output file {str(self.file)!r}")
        with self._open_lock:
            if self._aborted:
                raise _Aborted

    def close(self) -> None:
        """Close the container without finishing (abort); the output file's path keeps what it had before
        (only the temporary file is removed).

        Idempotent, and a no-op after :meth:`finish`. It never waits for a call in flight in the worker (a
        caller that left it when cancelled): that call releases the container when it returns.
        """
        with self._open_lock:
            self._closed = True
            if self._in_call:
                self._aborted = True  # a finish() in flight aborts its file instead of committing it
            else:
                self._release()
        self.worker.stop()

    @contextlib.contextmanager
    def _call(self) -> Iterator[None]:
        """Mark :meth:`encode` or :meth:`finish` in flight: a :meth:`close` meanwhile leaves the release
        to it."""
        with self._open_lock:
            self._in_call = True
        try:
            yield
        finally:
            with self._open_lock:
                self._in_call = False
                if self._closed:  # closed meanwhile (or finished): what is left open goes now
                    self._release()

    def _release(self) -> None:
        """Let go of what an open made: the container closed, its output dropped (an unfinished output is
        nobody's), the output file's temporary removed."""
        self._close_container()
        self._target = None
        file, self._file = self._file, None
        if file is not None:
            file.abort()  # a no-op once committed

    def _close_container(self) -> None:
        container, self._container = self._container, None
        if container is not None:
            _close(container)
        # The streams hold the container and its codecs (x264's buffers and threads): let them go now,
        # not whenever this encoder is dropped.
        self._video = self._soundtrack = None


def open_entry_encoders(encoders: Sequence[EntryEncoder], frame_shape: Sequence[int]) -> None:
    """Worker thread: open every entry's encoder before its first frame, all with the same codec.

    Under ``video_codec="auto"`` every entry opens the same rung of the ladder: a rung is taken only if
    every entry's open succeeds (a GPU's NVENC session limit may refuse the later ones), else all close and
    the next rung is tried, before any frame was encoded.
    """
    if not encoders:
        return
    height, width = encoders[0].frame_size(frame_shape)
    if encoders[0].video_codec == "auto":
        _open_on_ladder(encoders, height, width)
        return
    for encoder in encoders:
        encoder.open(height, width)


def _open_on_ladder(encoders: Sequence[EntryEncoder], height: int, width: int) -> None:
    """Open ``encoders`` with the first rung of ``VIDEO_RUNGS`` that every one of them opens; skip a rung
    whose probe failed; :class:`NoEncoderError` naming every rung and its failure if none opens.

    A rung climbed past leaves nothing open: each rung builds its containers, and a failure closes them
    (removing any output file's temporary) before the next rung begins.
    """
    tried: list[tuple[str, str]] = []
    for rung in VIDEO_RUNGS:
        failure = encode_failure(rung.name) or frame_size_refusal(rung.name, height, width)
        if failure is None:
            try:
                for encoder in encoders:
                    encoder.open(height, width, rung.name)
                return
            except OPEN_FAILURES as error:
                failure = f"its open failed ({error})"
                for encoder in encoders:
                    encoder.unopen()
        tried.append((rung.name, failure))
    raise NoEncoderError("video", tried)
