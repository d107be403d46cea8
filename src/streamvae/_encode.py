"""Encode: one MP4 per batch entry, H.264 (or another FFmpeg codec) with an optional AAC (or Opus) track.

An :class:`EntryEncoder` is driven from a worker thread, a call or two per transfer group (fragmented
output: its first frame alone, which closes the previous group's fragment, then the rest). It never crosses
into the event loop: the bytes the muxer writes are collected in memory and handed back as the return
value of :meth:`EntryEncoder.encode` / :meth:`EntryEncoder.finish`, between frames — PyAV swallows a
``BaseException`` raised inside a ``write()`` callback and would "complete" a truncated file. They come
back as :class:`MP4Piece` (whole fragments that know their frames, cut here once, in the worker thread),
which every consumer downstream takes as they are.

The container is opened here, so its muxer options and I/O are here too, and so is the climb down
``video_codec="auto"``'s ladder when an open fails; what each codec is opened with (defaults, checks, the
ladder's rungs and probes) is ``_codec_options``'. A soundtrack is AAC at the waveform's own rate where this
build has an AAC encoder; else Opus, resampled to 48 kHz (Opus takes no 44.1 kHz), on the same timeline.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
from av.video.reformatter import ColorRange, Colorspace

from streamvae._codec_options import (
    ENCODER_PIXEL_FORMAT,
    OPEN_FAILURES,
    OPUS_SAMPLE_RATE,
    VIDEO_LADDER,
    NoEncoderError,
    OutputKind,
    audio_encoder,
    auto_codec_options,
    encode_failure,
    merge_codec_options,
)
from streamvae._fragments import FragmentCutter, MP4Piece, codec_string
from streamvae._live_audio import LiveAudioTrack, samples_for_frames
from streamvae._output_file import OutputFile
from streamvae._quantize import PixelFormat

__all__ = [
    "EntryEncoder",
    "container_options",
    "faststart_io_open",
    "open_containers",
    "open_entry_encoders",
]


# FFmpeg's AVCOL_* codes for BT.709 primaries / transfer / matrix, and limited ("MPEG") range.
_BT709 = 1
_LIMITED_RANGE = 1

#: Encoders that copy each input picture inside ``encode()`` (x264_encoder_encode / x265_encoder_encode copy
#: it into their own frames), so a frame may wrap memory the caller reuses as soon as the call returns.
_COPYING_ENCODERS = frozenset({"libx264", "libx265"})


# -- the container: the muxer's options, its I/O, how many are open --

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


_open_containers = 0
_open_containers_lock = threading.Lock()


def open_containers() -> int:
    """MP4 containers open in this process right now (a leak check for tests and servers)."""
    return _open_containers


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


# -- the encoder of one entry --


class EntryEncoder:
    """The MP4 of one batch entry, written frame by frame from a worker thread.

    Frames arrive as uint8 arrays, ``[T, H, W, 3]`` (rgb24, converted to BT.709 yuv420p by swscale) or
    ``[T, H * 3 // 2, W]`` (planar yuv420p, BT.709 limited range, used as is). The container opens with the
    first frames and is always closed, by :meth:`finish` or :meth:`close`. Audio — a whole waveform
    (``audio``) or a live track its pushes fill as the video goes (``live_audio``) — is one stream muxed
    interleaved with the video as frames arrive, up to the video's time and never ahead of it, both
    tracks starting at 0; at :meth:`finish` it is trimmed or padded with silence to the video's duration
    (a session checks first that a live track is within one frame of it). It is AAC at the waveform's
    rate, or where this build has no AAC encoder Opus at 48 kHz, resampled as it goes (the resampler's
    last samples are flushed at :meth:`finish`, so the track still lasts the video's duration). With
    ``file``, the MP4 is also written to that path, which holds either the complete file (after
    :meth:`finish`) or what it held before (see :class:`OutputFile`).

    :meth:`encode` and :meth:`finish` return the output as :class:`MP4Piece`: for fragmented output a
    piece per fragment as the muxer writes it (then the ``mfra``); a plain MP4 is one piece at
    :meth:`finish`. Fragmented output closes a fragment every ``fragment_frames`` frames, whatever the
    keyframes; the muxer writes it when the next packet arrives, so the pieces :meth:`encode` returns hold
    every frame before the first one it was given. :attr:`frames_out` counts the frames the returned
    pieces hold.

    ``video_codec="auto"``: the first rung of :data:`VIDEO_LADDER` (h264_nvenc, libx264, libsvtav1,
    libvpx-vp9) whose probe encodes and whose open here succeeds, with the codec-neutral options translated
    for it (:func:`auto_codec_options`); :class:`NoEncoderError`, naming every rung, if none opens.

    Not thread-safe: one caller at a time (the session gives each entry its own task); only :meth:`open`
    and :meth:`close` may race (a cancelled session closes while another stage opens).
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
    ) -> None:
        self.fps = fps
        self.pixel_format = pixel_format
        self.video_codec = video_codec
        self.output = output
        self._requested_options = dict(video_codec_options or {})
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
        if audio is not None and live_audio is not None:
            raise ValueError(
                "EntryEncoder takes audio (a whole waveform) or live_audio (a live track), not both"
            )
        if (audio is not None or live_audio is not None) and audio_sample_rate is None:
            raise ValueError("EntryEncoder: audio and live_audio need audio_sample_rate")
        self._audio = audio
        self._live_audio = live_audio
        self._sample_rate = audio_sample_rate
        self._audio_sent = 0  # samples of the waveform's (or the live track's) rate encoded so far
        self._resampler: Any = None  # Opus: the waveform's rate → 48 kHz
        self._audio_out = 0  # samples the audio encoder was given, at its own rate
        self.frames_encoded = 0
        #: frames held by the pieces returned so far (a frame waits in the muxer until its fragment closes)
        self.frames_out = 0
        self.bytes_out = 0
        self._cutter = FragmentCutter() if output == "fragmented" else None
        self._container: Any = None
        self._video: Any = None
        self._audio_stream: Any = None
        self._memory: io.BytesIO | None = None
        self._collector: _ByteCollector | None = None
        self._file: OutputFile | None = None
        self._closed = False
        self._open_lock = threading.Lock()

    # -- opening --

    def _options_for(self, codec: str) -> dict[str, str]:
        if self.video_codec == "auto":
            return auto_codec_options(codec, self._requested_options, self.output)
        return merge_codec_options(codec, self._requested_options, self.output)

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
        with self._open_lock:
            if self._container is not None or self._closed:
                return
            self._open(height, width, self.video_codec if codec is None else codec)

    def _open(self, height: int, width: int, codec: str) -> None:
        try:
            self._open_streams(height, width, codec)
            self._video.codec_context.open()  # now: a failure to open is an error of opening
        except BaseException:
            self._unopen()
            raise
        self.encoder_name = codec

    def _unopen(self) -> None:
        """Back to unopened (nothing was encoded yet): the container closed, the output file removed."""
        self._close_container()
        self._close_file()
        self._memory = self._collector = None
        self._closed = False
        self.encoder_name = self.audio_codec = None
        self._resampler = None

    def _open_streams(self, height: int, width: int, codec: str) -> None:
        target: Any
        io_open = None
        if self.output == "fragmented":
            target = self._collector = _ByteCollector()
        else:
            target = self._memory = io.BytesIO()
            io_open = faststart_io_open(self._memory)
        if self.file is not None:
            self._file = OutputFile(self.file)
            self._file.open()
        global _open_containers
        options = container_options(self.output, self.fps, self.fragment_frames)
        self._container = av.open(target, mode="w", format="mp4", options=options, io_open=io_open)
        with _open_containers_lock:
            _open_containers += 1
        self.codec_options = self._options_for(codec)
        video = self._container.add_stream(codec, rate=self.fps, options=self.codec_options)
        video.width = width
        video.height = height
        video.pix_fmt = ENCODER_PIXEL_FORMAT
        video.codec_context.time_base = 1 / self.fps
        context = video.codec_context
        context.colorspace = context.color_primaries = context.color_trc = _BT709
        context.color_range = _LIMITED_RANGE
        self._video = video
        channels = self._audio_channels()
        if channels is not None:
            self._open_audio("mono" if channels == 1 else "stereo")

    def _open_audio(self, layout: str) -> None:
        """The soundtrack's stream: AAC at the waveform's rate, else Opus at 48 kHz through a resampler
        (to the packed samples libopus takes, whatever the rate)."""
        codec = audio_encoder()
        rate = self._sample_rate if codec == "aac" else OPUS_SAMPLE_RATE
        self._audio_stream = self._container.add_stream(codec, rate=rate, layout=layout)
        if codec != "aac":
            encoded = self._audio_stream.codec_context.format.name  # the stream's own: s16 for libopus
            self._resampler = av.AudioResampler(format=encoded, layout=layout, rate=rate)
        self.audio_codec = codec

    def _audio_channels(self) -> int | None:
        if self._audio is not None:
            return int(self._audio.shape[0])
        if self._live_audio is not None:
            return self._live_audio.channels
        return None

    # -- encoding (worker thread) --

    def encode(self, frames: np.ndarray[Any, Any]) -> list[MP4Piece]:
        """Encode ``frames`` (see the class docstring) and return the pieces of output ready to hand on."""
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
        self._send_audio(self._audio_samples_for(self.frames_encoded))
        return self._take_output()

    def _video_frame(self, array: np.ndarray[Any, Any], height: int, width: int) -> av.VideoFrame:
        if self.pixel_format == "rgb24":
            frame = av.VideoFrame.from_numpy_buffer(array, format="rgb24")
            return frame.reformat(
                format=ENCODER_PIXEL_FORMAT, dst_colorspace=Colorspace.ITU709, dst_color_range=ColorRange.MPEG
            )
        if height % 4 == 0 and self.encoder_name in _COPYING_ENCODERS:
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

    def _audio_samples_for(self, frames: int) -> int:
        if self._sample_rate is None:
            return 0
        return samples_for_frames(frames, self.fps, self._sample_rate)

    def _send_audio(self, until: int, *, final: bool = False) -> None:
        """Encode the audio after the samples sent so far, up to sample index ``until``: a waveform's
        samples, silence past its end; a live track's samples as far as they have arrived (``final``: and
        silence for any missing, since no more will come). Every call continues the one audio stream."""
        if self._audio_stream is None or until <= self._audio_sent:
            return
        start, wanted = self._audio_sent, until - self._audio_sent
        if self._live_audio is not None:
            piece = self._live_audio.take(wanted)
            if final and piece.shape[1] < wanted:
                piece = np.pad(piece, ((0, 0), (0, wanted - piece.shape[1])))
            if not piece.shape[1]:
                return  # nothing has arrived: the audio catches up at the next call
        else:
            assert self._audio is not None
            available = self._audio.shape[1]
            piece = np.zeros((self._audio.shape[0], wanted), dtype=np.float32)
            if start < available:
                real = self._audio[:, start:until]
                piece[:, : real.shape[1]] = real
        layout = "mono" if piece.shape[0] == 1 else "stereo"
        frame = av.AudioFrame.from_ndarray(piece, format="fltp", layout=layout)
        assert self._sample_rate is not None
        frame.sample_rate = self._sample_rate
        frame.pts = start
        frame.time_base = Fraction(1, self._sample_rate)
        self._audio_sent = start + piece.shape[1]
        if self._resampler is None:
            self._mux(self._audio_stream.encode(frame))
        else:
            self._encode_audio(self._resampler.resample(frame))

    def _encode_audio(self, frames: list[Any]) -> None:
        """Encode resampled ``frames``, stamped with the samples before them at the encoder's rate: the
        resampler's own timestamps round, and a track stamped by its sample count never drifts."""
        rate = OPUS_SAMPLE_RATE
        for frame in frames:
            frame.pts, frame.time_base = self._audio_out, Fraction(1, rate)
            self._audio_out += frame.samples
            self._mux(self._audio_stream.encode(frame))

    def _mux_video(self, packets: list[Any]) -> None:
        # Every frame lasts one frame. x264 leaves the duration 0, and the muxer then writes a duration of 0
        # for a frame whose fragment another track's packet closes (a player shows it not at all).
        for packet in packets:
            packet.duration = 1
        self._mux(packets)

    def _mux(self, packets: list[Any]) -> None:
        if packets:
            self._container.mux(packets)

    def _take_output(self) -> list[MP4Piece]:
        """The fragments the muxer has written whole since the last call (fragmented output)."""
        data = self._collector.take() if self._collector is not None else b""
        if data and self._file is not None:
            self._file.write(data)
        self.bytes_out += len(data)
        if self._cutter is None or not data:
            return []
        pieces = self._cutter.feed(data)
        self.frames_out = self._cutter.samples
        return pieces

    def finish(self) -> list[MP4Piece]:
        """Flush the encoders, write the trailer and close; return the remaining pieces of output.

        For ``output="mp4"`` that is one piece, the whole file (it is only complete once the moov is
        written); for fragmented output the last fragments, then what follows them (the ``mfra``).
        """
        if self._closed:
            raise RuntimeError("EntryEncoder.finish() called twice")
        if self._container is None:
            raise RuntimeError("EntryEncoder.finish() before any frame was encoded")
        try:
            self._mux_video(self._video.encode(None))
            if self._audio_stream is not None:
                self._send_audio(self._audio_samples_for(self.frames_encoded), final=True)
                if self._resampler is not None:
                    self._encode_audio(self._resampler.resample(None))  # the samples it still holds
                self._mux(self._audio_stream.encode(None))
        finally:
            self._close_container()
        if self._memory is not None:
            data = self._memory.getvalue()
            if self._file is not None:
                self._file.write(data)
            self.bytes_out += len(data)
            self.frames_out = self.frames_encoded
            pieces = [MP4Piece(data, self.frames_encoded, self.frames_encoded, codec_string(data))]
        else:
            assert self._cutter is not None
            pieces = self._take_output()
            rest = self._cutter.rest()
            if rest is not None:
                pieces.append(rest)
        self._memory = self._collector = None  # handed over: keep no copy
        if self._file is not None:
            self._file.commit()  # the file appears at its path, complete, only now
        return pieces

    def close(self) -> None:
        """Close the container without finishing (abort); the output file's path keeps what it had before
        (only the temporary file is removed).

        Idempotent, and a no-op after :meth:`finish`.
        """
        with self._open_lock:
            self._close_container()
            self._memory = self._collector = None  # an aborted output is nobody's
            self._close_file()

    def _close_container(self) -> None:
        global _open_containers
        self._closed = True
        container, self._container = self._container, None
        if container is not None:
            with _open_containers_lock:
                _open_containers -= 1
            container.close()
        # The streams hold the container and its codecs (x264's buffers and threads): let them go now,
        # not whenever this encoder is dropped.
        self._video = self._audio_stream = self._resampler = None

    def _close_file(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            file.abort()  # a no-op once committed


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
    """Open ``encoders`` with the first rung of :data:`VIDEO_LADDER` that every one of them opens; skip a
    rung whose probe failed; :class:`NoEncoderError` naming every rung and its failure if none opens.

    A rung climbed past leaves nothing open: each rung builds its containers, and a failure closes them
    (removing any output file's temporary) before the next rung begins.
    """
    tried: list[tuple[str, str]] = []
    for codec in VIDEO_LADDER:
        failure = encode_failure(codec)
        if failure is None:
            try:
                for encoder in encoders:
                    encoder.open(height, width, codec)
                return
            except OPEN_FAILURES as error:
                failure = f"its open failed ({error})"
                for encoder in encoders:
                    with encoder._open_lock:
                        if not encoder._closed:
                            encoder._unopen()
        tried.append((codec, failure))
    raise NoEncoderError("video", tried)
