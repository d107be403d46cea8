"""MP4 pieces: a fragmented MP4 cut, as it is written, into whole fragments that know what a player needs.

The mov muxer keeps a frame until it closes the fragment that holds it, so "frames encoded" is not "frames
out", and the bytes it writes end wherever its last write did. :class:`FragmentCutter` reads the box
headers of the muxer's output once, as it comes, and cuts it after every fragment's ``mdat``: each
:class:`MP4Piece` is whole top-level boxes, and says what a player (a Media Source buffer, a Low-Latency
HLS playlist) needs of it: how many video frames it lets a player show, whether its fragment starts with a
keyframe (a sync sample: a player can start there), its video's media duration, and, on the piece that
holds the ``moov``, where the init segment (``ftyp`` + ``moov``) ends and its tracks' RFC 6381 codec
string (:func:`codec_string`), which a ``Content-Type`` and a Media Source buffer need (``avc1.64001f,
mp4a.40.2``; ``av01.0.04M.08, opus``). The encoder hands these pieces on to every consumer — the sinks, a
byte stream's reader, a WebSocket client, a pacer, a broadcast's viewers — so nobody parses the boxes a
second time.

What is read, and from where (ISO/IEC 14496-12): the video track's timescale from its ``mdhd`` and its
fragment defaults from the ``trex`` in the ``moov``'s ``mvex``; in each ``moof``, the video ``traf``'s
``tfhd`` (defaults that override the ``trex``'s) and ``trun`` boxes (sample count, each sample's duration
and flags where present, the first sample's flags). A sample's flags carry ``sample_is_non_sync_sample``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from fractions import Fraction

from streamvae._boxes import HEADER as _HEADER
from streamvae._boxes import box_children, box_header
from streamvae._public import public
from streamvae._xmp import shift_fragment_index

__all__ = ["FragmentCutter", "MP4Piece", "codec_string"]

#: the track of the video: streamvae adds the video stream first, so the muxer numbers it 1
_VIDEO_TRACK = 1
_U32 = struct.Struct(">I")
#: ``sample_is_non_sync_sample`` in a sample's flags (ISO/IEC 14496-12 8.8.3.1): set on every frame a
#: decoder cannot start at
_NON_SYNC_SAMPLE = 0x0001_0000


@public
@dataclass(frozen=True)
class MP4Piece:
    """A piece of an entry's MP4 as the encoder hands it on: whole top-level boxes.

    Fragmented output: each piece ends right after a fragment's ``mdat`` (the first also holds the
    ``ftyp`` and ``moov`` before it, :attr:`init_size` bytes; the last may be the ``mfra`` alone: 0 frames,
    no keyframe, no duration). A plain MP4 is one piece, the whole file (its moov is no init segment:
    :attr:`init_size` 0). The concatenation of an entry's pieces is its MP4, byte for byte.

    What each field says of a fragment is read from its boxes as the cutter walks them: a player's
    segment can start at a piece with :attr:`keyframe`, and a playlist lists :attr:`duration` for it.
    """

    #: the bytes: whole top-level boxes
    data: bytes
    #: video frames this piece lets a player show (its fragment's video samples; a plain MP4's every frame)
    frames: int
    #: video frames up to the end of this piece (the pieces before it and this one)
    frames_until: int
    #: the piece that holds the ``moov``: its tracks' RFC 6381 codec string, video first
    #: (``"avc1.64001f, mp4a.40.2"``); None on every other piece, or for a codec it does not know
    codecs: str | None = None
    #: its fragment's first video sample is a sync sample (a keyframe: a player can start there); False
    #: for a piece without video frames (the ``mfra``). A plain MP4: True (it starts at a keyframe)
    keyframe: bool = False
    #: the media duration of its video samples, in seconds (their durations over the video track's
    #: timescale); 0 for a piece without video frames
    duration: Fraction = Fraction(0)
    #: bytes at the start of :attr:`data` that are the init segment (``ftyp`` + ``moov``): non-zero only on
    #: the fragmented piece that holds the ``moov``, whose ``data[init_size:]`` is its first fragment
    init_size: int = 0


@dataclass(frozen=True)
class _VideoTrack:
    """What the ``moov`` says of the video track that its fragments need: the timescale of their
    durations, and the ``trex`` defaults a ``tfhd`` or ``trun`` that names no value falls back on."""

    timescale: int
    default_duration: int = 0
    default_flags: int = 0


@dataclass(frozen=True)
class _Fragment:
    """What a ``moof`` says of its video samples."""

    samples: int = 0
    ticks: int = 0  # the sum of their durations, in the track's timescale
    keyframe: bool = False  # its first video sample is a sync sample


class FragmentCutter:
    """Cuts a fragmented MP4 fed to it in any pieces into :class:`MP4Piece`, one per fragment.

    Only what is not yet a whole fragment is held (the muxer writes a fragment in one go, so between the
    encoder's calls that is little or nothing). The video is track 1; an audio track's samples are not
    frames, and count in no piece's :attr:`~MP4Piece.duration` or :attr:`~MP4Piece.keyframe`.

    ``mark``: whole boxes put right after the ``moov`` (the XMP mark of ``_xmp``), inside the init segment
    of the piece that holds it; the ``mfra``'s fragment offsets in :meth:`rest` move by its size. The
    pieces are then the MP4, not the bytes fed.
    """

    def __init__(self, mark: bytes = b"") -> None:
        self._mark = mark
        #: video samples (frames) of the fragments cut so far
        self.samples = 0
        #: fragments (``moof`` + ``mdat``) cut so far, any track
        self.fragments = 0
        self._buffer = bytearray()
        self._cut_bytes = 0  # bytes of the file before the buffer (handed on in pieces)
        self._scanned = 0  # bytes at the front of the buffer that are whole boxes
        self._pending = _Fragment()  # the last moof's video samples, counted once its mdat is whole
        self._codecs: str | None = None  # the moov's codec string, for the piece that holds it
        self._init_size = 0  # where the moov ends in the buffer, for the piece that holds it
        self._video: _VideoTrack | None = None  # from the moov

    def feed(self, data: bytes) -> list[MP4Piece]:
        """Read the next ``data`` of the file; the pieces it completes (maybe none)."""
        self._buffer += data
        pieces: list[MP4Piece] = []
        while True:
            box = self._next_box()
            if box is None:
                return pieces
            kind, size = box
            if kind == b"moof":
                moof = bytes(self._buffer[self._scanned : self._scanned + size])
                self._pending = _video_fragment(moof, self._video)
            elif kind == b"moov":
                moov = bytes(self._buffer[self._scanned : self._scanned + size])
                self._codecs, self._video = _moov_codecs(moov), _video_track(moov)
                self._init_size = self._scanned + size
            self._scanned += size
            if kind == b"mdat":
                self.fragments += 1
                pieces.append(self._cut(self._pending))
                self._pending = _Fragment()

    def rest(self) -> MP4Piece | None:
        """What is left once the file is complete (the ``mfra``: 0 frames), or None if nothing is."""
        if not self._buffer:
            return None
        self._scanned = len(self._buffer)
        if self._mark:
            self._buffer[:] = shift_fragment_index(bytes(self._buffer), len(self._mark))
        return self._cut(_Fragment())

    def _next_box(self) -> tuple[bytes, int] | None:
        """The type and size of the box after the scanned ones, if it is all in the buffer."""
        start, available = self._scanned, len(self._buffer) - self._scanned
        header = box_header(self._buffer, start, len(self._buffer))
        if header is None:
            return None
        kind, header_size, size = header
        if size == 0:
            return None  # the box runs to the end of the file: it ends with the file (rest())
        if size < header_size:
            raise ValueError(
                f"FragmentCutter.feed: the box at byte {self._cut_bytes + start} of the file claims {size} "
                "bytes, less than its own header: these bytes are not an MP4"
            )
        return (kind, size) if size <= available else None

    def _cut(self, fragment: _Fragment) -> MP4Piece:
        data = bytes(self._buffer[: self._scanned])
        del self._buffer[: self._scanned]
        self._cut_bytes += self._scanned
        self._scanned = 0
        self.samples += fragment.samples
        codecs, self._codecs = self._codecs, None
        init_size, self._init_size = self._init_size, 0
        if init_size and self._mark:
            data = data[:init_size] + self._mark + data[init_size:]
            init_size += len(self._mark)
        timescale = 1 if self._video is None else self._video.timescale
        duration = Fraction(fragment.ticks, timescale)
        return MP4Piece(data, fragment.samples, self.samples, codecs, fragment.keyframe, duration, init_size)


# -- the boxes of the video track --


def _video_track(moov: bytes) -> _VideoTrack | None:
    """The video track's timescale (trak/mdia/mdhd) and fragment defaults (mvex/trex); None without one."""
    timescale, defaults = None, (0, 0)
    for kind, span in box_children(moov, _HEADER.size, len(moov)):
        if kind == b"trak" and _track_id(moov, span) == _VIDEO_TRACK:
            timescale = _timescale(moov, span)
        elif kind == b"mvex":
            for child, (body, end) in box_children(moov, *span):
                # trex: version and flags, track, sample description index, then the defaults
                if (
                    child == b"trex"
                    and end - body >= 24
                    and _U32.unpack_from(moov, body + 4)[0] == _VIDEO_TRACK
                ):
                    defaults = (_U32.unpack_from(moov, body + 12)[0], _U32.unpack_from(moov, body + 20)[0])
    return None if not timescale else _VideoTrack(timescale, *defaults)


def _track_id(moov: bytes, trak: tuple[int, int]) -> int | None:
    """A track's id, from its ``tkhd`` (after version 1's 64-bit times or version 0's 32-bit ones)."""
    for kind, (body, end) in box_children(moov, *trak):
        if kind == b"tkhd" and end - body >= 24:
            return int(_U32.unpack_from(moov, body + (20 if moov[body] == 1 else 12))[0])
    return None


def _timescale(moov: bytes, trak: tuple[int, int]) -> int | None:
    """The units per second of a track's sample durations, from its ``mdhd``."""
    for kind, mdia in box_children(moov, *trak):
        if kind != b"mdia":
            continue
        for child, (body, end) in box_children(moov, *mdia):
            if child == b"mdhd" and end - body >= 24:
                return int(_U32.unpack_from(moov, body + (20 if moov[body] == 1 else 12))[0])
    return None


#: tfhd's flags (8.8.7): which optional fields follow its track id, each with its size
_TFHD_FIELDS = ((0x01, 8), (0x02, 4), (0x08, 4), (0x10, 4), (0x20, 4))
_TFHD_DURATION, _TFHD_FLAGS = 0x08, 0x20
#: trun's flags (8.8.8): a data offset and the first sample's flags, then per sample its duration, size,
#: flags and composition time offset (4 bytes each, where present)
_TRUN_DATA_OFFSET, _TRUN_FIRST_FLAGS = 0x001, 0x004
_TRUN_DURATION, _TRUN_SIZE, _TRUN_FLAGS, _TRUN_TIME_OFFSET = 0x100, 0x200, 0x400, 0x800
_TRUN_SAMPLE_FIELDS = (_TRUN_DURATION, _TRUN_SIZE, _TRUN_FLAGS, _TRUN_TIME_OFFSET)


def _video_fragment(moof: bytes, video: _VideoTrack | None) -> _Fragment:
    """What ``moof``'s track runs (``trun``) say of the video track's samples: their count, the sum of
    their durations, and whether the first is a sync sample."""
    fragment = _Fragment()
    for kind, traf in box_children(moof, _HEADER.size, len(moof)):
        if kind != b"traf":
            continue
        boxes = box_children(moof, *traf)
        tfhd = next((span for child, span in boxes if child == b"tfhd"), None)
        if tfhd is None or _U32.unpack_from(moof, tfhd[0] + 4)[0] != _VIDEO_TRACK:
            continue
        duration, flags = _tfhd_defaults(moof, tfhd[0], video)
        for child, (body, _) in boxes:
            if child == b"trun":
                fragment = _with_run(fragment, moof, body, duration, flags)
    return fragment


def _tfhd_defaults(moof: bytes, body: int, video: _VideoTrack | None) -> tuple[int, int]:
    """The default sample duration and flags of a track fragment: its ``tfhd``'s, else the ``trex``'s."""
    duration, flags = (0, 0) if video is None else (video.default_duration, video.default_flags)
    present = _U32.unpack_from(moof, body)[0] & 0xFFFFFF
    position = body + 8  # after version, flags and the track id
    for flag, size in _TFHD_FIELDS:
        if present & flag:
            if flag == _TFHD_DURATION:
                duration = _U32.unpack_from(moof, position)[0]
            elif flag == _TFHD_FLAGS:
                flags = _U32.unpack_from(moof, position)[0]
            position += size
    return duration, flags


def _with_run(fragment: _Fragment, moof: bytes, body: int, duration: int, flags: int) -> _Fragment:
    """``fragment`` with the samples of the ``trun`` whose body starts at ``body`` added to it."""
    present = _U32.unpack_from(moof, body)[0] & 0xFFFFFF
    count = _U32.unpack_from(moof, body + 4)[0]
    position = body + 8 + 4 * bool(present & _TRUN_DATA_OFFSET)
    first_flags = None
    if present & _TRUN_FIRST_FLAGS:
        first_flags = _U32.unpack_from(moof, position)[0]
        position += 4
    stride = 4 * sum(bool(present & field) for field in _TRUN_SAMPLE_FIELDS)
    ticks = count * duration
    if present & _TRUN_DURATION:
        ticks = sum(_U32.unpack_from(moof, position + index * stride)[0] for index in range(count))
    if first_flags is None and present & _TRUN_FLAGS:
        offset = 4 * bool(present & _TRUN_DURATION) + 4 * bool(present & _TRUN_SIZE)  # the fields before it
        first_flags = _U32.unpack_from(moof, position + offset)[0]
    if not fragment.samples and count:  # the fragment's first video sample is this run's
        keyframe = not (flags if first_flags is None else first_flags) & _NON_SYNC_SAMPLE
    else:
        keyframe = fragment.keyframe
    return _Fragment(fragment.samples + count, fragment.ticks + ticks, keyframe)


# -- the codec string of the init segment --


def codec_string(data: bytes) -> str | None:
    """The RFC 6381 codec string of the tracks of the MP4 that starts with ``data`` (whole top-level boxes,
    the ``moov`` among them: a fragmented MP4's first piece, a faststart MP4), video first, as a
    ``Content-Type``'s ``codecs`` parameter and ``MediaSource.isTypeSupported`` take it.

    It is read from each track's sample entry: ``avc1.PPCCLL`` (avcC), ``av01.P.LLT.DD`` (av1C),
    ``vp09.PP.LL.DD`` (vpcC), ``mp4a.40.N`` (esds), ``opus``: what the ladder's encoders and the soundtrack
    write. None without a ``moov``, or if a track has another codec (HEVC, which few browsers play from
    MSE, among them): a partial string would make a player refuse the tracks it leaves out.
    """
    for kind, (body, end) in box_children(data, 0, len(data)):
        if kind == b"moov":
            return _moov_codecs(data[body - _HEADER.size : end])
    return None


def _moov_codecs(moov: bytes) -> str | None:
    codecs = []
    for kind, trak in box_children(moov, _HEADER.size, len(moov)):
        if kind != b"trak":
            continue
        entry = _sample_entry(moov, trak)
        codec = None if entry is None else _entry_codec(moov, *entry)
        if codec is None:
            return None
        codecs.append(codec)
    return ", ".join(codecs) or None


def _sample_entry(data: bytes, trak: tuple[int, int]) -> tuple[bytes, int, int] | None:
    """The type and span (from its header) of a track's first sample entry: trak/mdia/minf/stbl/stsd."""
    span = trak
    for name in (b"mdia", b"minf", b"stbl", b"stsd"):
        found = next((child for kind, child in box_children(data, *span) if kind == name), None)
        if found is None:
            return None
        span = found
    start = span[0] + 8  # stsd's version, flags and entry count
    if start + _HEADER.size > span[1]:
        return None
    size, kind = _HEADER.unpack_from(data, start)
    return bytes(kind), start, min(start + size, span[1])


#: Where a sample entry's child boxes start, from its header: after SampleEntry's 8 bytes and the visual
#: entry's 70 (width, height, resolution, compressor name, ...) or the audio entry's 20 (version 0).
_VISUAL_CHILDREN = _HEADER.size + 8 + 70
_AUDIO_CHILDREN = _HEADER.size + 8 + 20


def _entry_codec(data: bytes, kind: bytes, start: int, end: int) -> str | None:
    if kind == b"Opus":
        return "opus"
    offset = _AUDIO_CHILDREN if kind == b"mp4a" else _VISUAL_CHILDREN
    boxes = {child: data[body:stop] for child, (body, stop) in box_children(data, start + offset, end)}
    if kind in (b"avc1", b"avc3") and len(boxes.get(b"avcC", b"")) >= 4:
        return f"{kind.decode()}.{boxes[b'avcC'][1:4].hex()}"
    if kind == b"av01" and len(boxes.get(b"av1C", b"")) >= 3:
        config = boxes[b"av1C"]
        profile, level = config[1] >> 5, config[1] & 0x1F
        tier = "H" if config[2] & 0x80 else "M"
        depth = (12 if config[2] & 0x20 else 10) if config[2] & 0x40 else 8  # high_bitdepth, twelve_bit
        return f"av01.{profile}.{level:02d}{tier}.{depth:02d}"
    if kind == b"vp09" and len(boxes.get(b"vpcC", b"")) >= 7:
        config = boxes[b"vpcC"][4:]  # after the full box's version and flags
        return f"vp09.{config[0]:02d}.{config[1]:02d}.{config[2] >> 4:02d}"
    if kind == b"mp4a" and b"esds" in boxes:
        audio_object = _aac_object_type(boxes[b"esds"])
        return None if audio_object is None else f"mp4a.40.{audio_object}"
    return None


def _aac_object_type(esds: bytes) -> int | None:
    """The audio object type (2: AAC-LC) in esds's ES descriptor → decoder config → decoder specific info,
    when the decoder config says MPEG-4 audio (object type indication 0x40); None for anything else."""
    position = 4  # after the full box's version and flags
    for tag in (0x03, 0x04, 0x05):
        if position >= len(esds) or esds[position] != tag:
            return None
        position += 1
        for _ in range(4):  # the descriptor's size: up to 4 bytes, 7 bits each, high bit "more"
            position += 1
            if position > len(esds) or not esds[position - 1] & 0x80:
                break
        if tag == 0x03 and position + 3 <= len(esds):
            flags = esds[position + 2]  # after ES_ID: stream dependence, URL, OCR stream
            position += 3 + 2 * bool(flags & 0x80)  # the ES_ID it depends on
            if flags & 0x40 and position < len(esds):  # a URL, its length first
                position += 1 + esds[position]
            position += 2 * bool(flags & 0x20)  # the OCR stream's ES_ID
        elif tag == 0x04:
            if position >= len(esds) or esds[position] != 0x40:
                return None
            position += 13
    if position >= len(esds):
        return None
    audio_object = esds[position] >> 3
    if audio_object == 31:  # escaped: 6 more bits
        if position + 1 >= len(esds):
            return None
        audio_object = 32 + (((esds[position] & 0x07) << 3) | (esds[position + 1] >> 5))
    return audio_object
