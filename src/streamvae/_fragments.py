"""Which frames a fragmented MP4 has let out: its fragments' video samples, counted as the bytes are written.

The mov muxer keeps a frame until it closes the fragment that holds it, so "frames encoded" is not "frames
out". :class:`FragmentCounter` reads the box headers of the muxer's output as it comes (a ``moof``'s
track runs, then its ``mdat``) and counts the video samples of every fragment written whole: those frames
can be shown by whoever receives these bytes.
"""

from __future__ import annotations

import struct

__all__ = ["FragmentCounter"]

_HEADER = struct.Struct(">I4s")


class FragmentCounter:
    """Counts the samples of one track in the complete fragments of a fragmented MP4 fed to it in pieces.

    ``track_id`` 1 is the first stream the muxer was given (streamvae adds the video first). Only box
    headers and ``moof`` boxes (a few hundred bytes) are kept; sample data is skipped as it passes.
    """

    def __init__(self, track_id: int = 1) -> None:
        self.track_id = track_id
        #: samples of the track in the fragments written whole so far
        self.samples = 0
        #: fragments (moof + mdat) written whole so far, any track
        self.fragments = 0
        self._head = bytearray()  # the start of the current box, until its header (or whole moof) is in
        self._skip = 0  # bytes of the current box still to pass
        self._in_mdat = False
        self._pending = 0  # samples of the last moof, counted once its mdat is whole

    def feed(self, data: bytes) -> None:
        """Read the next ``data`` of the file."""
        view = memoryview(data)
        while view:
            if self._skip:
                passed = min(self._skip, len(view))
                self._skip -= passed
                view = view[passed:]
                if not self._skip:
                    self._box_done()
                continue
            want = self._wanted()
            take = min(want - len(self._head), len(view))
            self._head += view[:take]
            view = view[take:]
            if len(self._head) == self._wanted():
                self._box_started()

    def _wanted(self) -> int:
        """Bytes of the current box to hold before deciding what it is: its header, or a whole moof."""
        if len(self._head) < 8:
            return 8
        size, kind = _HEADER.unpack_from(self._head)
        if size == 1:  # a 64-bit size follows the type
            return 16
        if kind == b"moof":
            return int(size)
        return len(self._head)

    def _box_started(self) -> None:
        size, kind = _HEADER.unpack_from(self._head)
        if size == 1:
            size = struct.unpack_from(">Q", self._head, 8)[0]
        if kind == b"moof":
            self._pending = self._samples_in(bytes(self._head))
        self._in_mdat = kind == b"mdat"
        # size 0: the box runs to the end of the file (nothing after it can be counted)
        self._skip = max(size, len(self._head)) - len(self._head) if size else 1 << 62
        self._head.clear()
        if not self._skip:
            self._box_done()

    def _box_done(self) -> None:
        if self._in_mdat:
            self.samples += self._pending
            self.fragments += 1
            self._pending = 0
        self._in_mdat = False

    def _samples_in(self, moof: bytes) -> int:
        """The track's samples listed by the track runs (``trun``) of its fragments in ``moof``."""
        count = 0
        for kind, traf in _children(moof, 8, len(moof)):
            if kind != b"traf":
                continue
            track, samples = None, 0
            for child, (body, _) in _children(moof, *traf):
                if child == b"tfhd":
                    track = struct.unpack_from(">I", moof, body + 4)[0]  # after version and flags
                elif child == b"trun":
                    samples += struct.unpack_from(">I", moof, body + 4)[0]
            if track == self.track_id:
                count += samples
        return count


def _children(data: bytes, start: int, end: int) -> list[tuple[bytes, tuple[int, int]]]:
    """The boxes between ``start`` and ``end``: each one's type and the span of its body."""
    boxes = []
    while start + 8 <= end:
        size, kind = _HEADER.unpack_from(data, start)
        if size < 8 or start + size > end:
            break  # not a box this reader knows: count nothing from it
        boxes.append((kind, (start + 8, start + size)))
        start += size
    return boxes
