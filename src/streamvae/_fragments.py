"""MP4 pieces: a fragmented MP4 cut, as it is written, into whole fragments that know their frames.

The mov muxer keeps a frame until it closes the fragment that holds it, so "frames encoded" is not "frames
out", and the bytes it writes end wherever its last write did. :class:`FragmentCutter` reads the box
headers of the muxer's output once, as it comes, and cuts it after every fragment's ``mdat``: each
:class:`MP4Piece` is whole top-level boxes, and says how many video frames it lets a player show. The
encoder hands these pieces on to every consumer — the sinks, a byte stream's reader, a WebSocket client,
a pacer — so nobody parses the boxes a second time.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from streamvae._public import public

__all__ = ["FragmentCutter", "MP4Piece"]

_HEADER = struct.Struct(">I4s")
_LARGE_SIZE = struct.Struct(">Q")
#: the track of the video: streamvae adds the video stream first, so the muxer numbers it 1
_VIDEO_TRACK = 1


@public
@dataclass(frozen=True)
class MP4Piece:
    """A piece of an entry's MP4 as the encoder hands it on: whole top-level boxes.

    Fragmented output: each piece ends right after a fragment's ``mdat`` (the first also holds the
    ``ftyp`` and ``moov`` before it; the last may be the ``mfra`` alone, 0 frames). A plain MP4 is one
    piece, the whole file. The concatenation of an entry's pieces is its MP4, byte for byte.
    """

    #: the bytes: whole top-level boxes
    data: bytes
    #: video frames this piece lets a player show (its fragment's video samples; a plain MP4's every frame)
    frames: int
    #: video frames up to the end of this piece (the pieces before it and this one)
    frames_until: int


class FragmentCutter:
    """Cuts a fragmented MP4 fed to it in any pieces into :class:`MP4Piece`, one per fragment.

    Only what is not yet a whole fragment is held (the muxer writes a fragment in one go, so between the
    encoder's calls that is little or nothing). The video is track 1; an audio track's samples are not
    frames.
    """

    def __init__(self) -> None:
        #: video samples (frames) of the fragments cut so far
        self.samples = 0
        #: fragments (``moof`` + ``mdat``) cut so far, any track
        self.fragments = 0
        self._buffer = bytearray()
        self._cut_bytes = 0  # bytes of the file before the buffer (handed on in pieces)
        self._scanned = 0  # bytes at the front of the buffer that are whole boxes
        self._pending = 0  # video samples of the last moof, counted once its mdat is whole

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
                self._pending = _video_samples(bytes(self._buffer[self._scanned : self._scanned + size]))
            self._scanned += size
            if kind == b"mdat":
                self.fragments += 1
                pieces.append(self._cut(self._pending))
                self._pending = 0

    def rest(self) -> MP4Piece | None:
        """What is left once the file is complete (the ``mfra``: 0 frames), or None if nothing is."""
        if not self._buffer:
            return None
        self._scanned = len(self._buffer)
        return self._cut(0)

    def _next_box(self) -> tuple[bytes, int] | None:
        """The type and size of the box after the scanned ones, if it is all in the buffer."""
        start, available = self._scanned, len(self._buffer) - self._scanned
        if available < _HEADER.size:
            return None
        size, kind = _HEADER.unpack_from(self._buffer, start)
        if size == 1:  # a 64-bit size follows the type
            if available < _HEADER.size + _LARGE_SIZE.size:
                return None
            size = _LARGE_SIZE.unpack_from(self._buffer, start + _HEADER.size)[0]
        elif size == 0:
            return None  # the box runs to the end of the file: it ends with the file (rest())
        if size < _HEADER.size:
            raise ValueError(
                f"FragmentCutter.feed: the box at byte {self._cut_bytes + start} of the file claims {size} "
                "bytes, less than its own header: these bytes are not an MP4"
            )
        return (bytes(kind), int(size)) if size <= available else None

    def _cut(self, frames: int) -> MP4Piece:
        data = bytes(self._buffer[: self._scanned])
        del self._buffer[: self._scanned]
        self._cut_bytes += self._scanned
        self._scanned = 0
        self.samples += frames
        return MP4Piece(data, frames, self.samples)


def _video_samples(moof: bytes) -> int:
    """The video track's samples listed by the track runs (``trun``) of its fragments in ``moof``."""
    count = 0
    for kind, traf in _children(moof, _HEADER.size, len(moof)):
        if kind != b"traf":
            continue
        track, samples = None, 0
        for child, (body, _) in _children(moof, *traf):
            if child == b"tfhd":
                track = struct.unpack_from(">I", moof, body + 4)[0]  # after version and flags
            elif child == b"trun":
                samples += struct.unpack_from(">I", moof, body + 4)[0]
        if track == _VIDEO_TRACK:
            count += samples
    return count


def _children(data: bytes, start: int, end: int) -> list[tuple[bytes, tuple[int, int]]]:
    """The boxes between ``start`` and ``end``: each one's type and the span of its body."""
    boxes = []
    while start + _HEADER.size <= end:
        size, kind = _HEADER.unpack_from(data, start)
        if size < _HEADER.size or start + size > end:
            break  # not a box this reader knows: count nothing from it
        boxes.append((kind, (start + _HEADER.size, start + size)))
        start += size
    return boxes
