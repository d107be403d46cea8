"""``Broadcast``: one generation's MP4, encoded once and read by any number of viewers.

A generation writes its fragmented MP4 once, as :class:`streamvae.MP4Piece`\\ s; its owner, spectators,
Low-Latency HLS pollers, ``video.mp4`` readers and replays after the end all read the same bytes from one
:class:`Broadcast`. The generator only ever calls :meth:`Broadcast.publish` and :meth:`Broadcast.end`, which
never block and never wait for a viewer: a viewer that cannot keep up is cut off, so no number of viewers,
and no slow one, changes how fast the video is made.

The words: a *part* (:class:`Part`) is one fragment with frames (its ``moof`` + ``mdat``), what an HLS
playlist lists as an ``EXT-X-PART``; pieces of 0 frames are written but are no part (the trailing ``mfra``;
a fragment of sound alone travels with the next part).
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

import anyio
import anyio.lowlevel

from streamvae._checks import check_bool, check_int, check_seconds
from streamvae._errors import ViewerCutOffError
from streamvae._fragments import MP4Piece

__all__ = ["Broadcast", "BroadcastState", "BroadcastStatistics", "Part"]

_OWNER = "Broadcast"

#: a generation being written (``live``), written to its end (``ended``), or stopped by an error (``failed``)
BroadcastState = Literal["live", "ended", "failed"]


@dataclass(frozen=True)
class Part:
    """One fragment of a broadcast that shows frames: an HLS ``EXT-X-PART``, a viewer's unit of bytes."""

    #: its place among the generation's parts, from 0 (it keeps it when older parts are let go)
    index: int
    #: its ``moof`` + ``mdat`` (after any fragments of sound alone written just before it)
    data: bytes
    #: the video frames it shows (at least 1)
    frames: int
    #: whether its first video frame is a keyframe: a player can start here
    keyframe: bool
    #: its media duration, in seconds
    duration: Fraction
    #: the media time of its first frame, in seconds from the generation's start
    start: Fraction


@dataclass(frozen=True)
class BroadcastStatistics:
    """A snapshot of a :class:`Broadcast`'s viewers (:meth:`Broadcast.statistics`)."""

    viewers: int  # viewers inside their ``viewer()`` block now
    viewers_ever: int  # viewers that entered a ``viewer()`` block
    cut_off: int  # viewers cut off for falling more than their buffer behind
    bytes_served: int  # bytes handed to viewers, all of them together


class Broadcast:
    """One generation's init segment and MP4 pieces, as they are written, for any number of viewers.

    The generator's side runs on the event loop and never waits: :meth:`publish` each
    :class:`streamvae.MP4Piece` as the encoder hands it on (``async for piece in stream.pieces()``), then
    :meth:`end` (``end(error)`` if the generation failed). Everything else reads:

    - :meth:`viewer` follows the generation as bytes (an MP4 a player appends as it comes);
    - :attr:`parts`, :attr:`init` and :meth:`wait_for` are what an HLS playlist and its blocking reload
      are made of;
    - :meth:`mp4_bytes` is the recording: byte for byte what the generation's own client received.

    Memory: with ``keep_recording`` (the default) the whole recording is held, for replays after the end.
    Without it only a live window is: the newest ``window`` parts at least (``None``: none beyond the
    newest keyframe), cut at a keyframe so that what is held always starts where a player can; and each
    viewer holds references to at most its ``buffer`` pieces besides. Works on asyncio and trio. Bad
    values are ValueErrors naming the argument.
    """

    def __init__(
        self, *, viewer_buffer: int = 64, window: int | None = None, keep_recording: bool = True
    ) -> None:
        #: pieces a viewer may fall behind before it is cut off (:meth:`viewer`'s default ``buffer``)
        self.viewer_buffer = check_int("viewer_buffer", viewer_buffer, minimum=1, owner=_OWNER)
        #: parts held at least while the recording is not kept (None: back to the newest keyframe only)
        self.window = None if window is None else check_int("window", window, minimum=1, owner=_OWNER)
        #: whether the whole recording is held (for :meth:`mp4_bytes` and replays from the start)
        self.keep_recording = check_bool("keep_recording", keep_recording, owner=_OWNER)
        self._state: BroadcastState = "live"
        self._error: BaseException | None = None
        self._init: bytes | None = None
        self._codecs: str | None = None
        self._parts: list[Part] = []  # held, oldest first
        self._next_index = 0  # the index of the next part
        self._next_start = Fraction(0)  # the media time of the next part's first frame
        self._frames = 0
        self._silent: list[bytes] = []  # pieces of 0 frames since the last part: the next part's front
        self._tail: list[bytes] = []  # pieces of 0 frames after the last part, once the generation ended
        self._size = 0
        self._viewers: set[_Viewer] = set()
        self._changed: anyio.Event | None = None  # set (and dropped) whenever something is written or it ends
        self._viewers_ever = 0
        self._cut_off = 0
        self._bytes_served = 0

    # -- what was written --

    @property
    def state(self) -> BroadcastState:
        """``"live"`` while it is written, ``"ended"`` once it ended, ``"failed"`` if it ended with an
        error."""
        return self._state

    @property
    def init(self) -> bytes | None:
        """The init segment (``ftyp`` + ``moov``), once the first piece is published."""
        return self._init

    @property
    def codecs(self) -> str | None:
        """The RFC 6381 codec string of the first piece (``"avc1.64001f, mp4a.40.2"``), if it had one."""
        return self._codecs

    @property
    def frames(self) -> int:
        """Video frames written so far."""
        return self._frames

    @property
    def parts(self) -> Sequence[Part]:
        """The parts held, oldest first; ``parts[0].index`` is 0 unless older ones were let go (without
        ``keep_recording``)."""
        return tuple(self._parts)

    @property
    def next_part(self) -> int:
        """The index the next part written will have (the number of parts written so far)."""
        return self._next_index

    def part(self, index: int) -> Part | None:
        """The held part ``index``, or None: not written yet, or let go (without ``keep_recording``)."""
        position = index - (self._parts[0].index if self._parts else 0)
        return self._parts[position] if 0 <= position < len(self._parts) else None

    @property
    def size(self) -> int:
        """Bytes held: the init segment, the parts and the pieces of 0 frames (not the viewers' buffers,
        which hold references to these)."""
        return self._size

    def mp4_bytes(self) -> bytes:
        """The MP4 as written so far (the whole file once it ended): the concatenation of every published
        piece. A RuntimeError without ``keep_recording``, where older parts are let go."""
        if not self.keep_recording:
            raise RuntimeError(f"{_OWNER}.mp4_bytes: the recording is not kept (keep_recording=False)")
        return b"".join([*self._written(0), *self._silent])

    # -- the generator's side --

    def publish(self, piece: MP4Piece) -> None:
        """Append ``piece``, the next the encoder handed on (the first carries the init segment). It never
        waits: each viewer gets it in its buffer, and a viewer whose buffer overflows is cut off."""
        if not isinstance(piece, MP4Piece):
            raise TypeError(
                f"{_OWNER}.publish: piece must be a streamvae.MP4Piece, got {type(piece).__name__}"
            )
        if self._state != "live":
            raise RuntimeError(f"{_OWNER}.publish: the generation has {self._state}; it takes no more pieces")
        data = piece.data
        written: list[bytes] = []  # what viewers get of it: the init segment, a part
        if self._init is None:
            if piece.init_size <= 0:
                raise ValueError(
                    f"{_OWNER}.publish: the first piece must carry the init segment (init_size > 0), "
                    f"got init_size={piece.init_size}"
                )
            self._init, data = data[: piece.init_size], data[piece.init_size :]
            self._codecs = piece.codecs
            self._size += len(self._init)
            written.append(self._init)
        elif piece.init_size:
            raise ValueError(
                f"{_OWNER}.publish: only the first piece carries an init segment, got init_size="
                f"{piece.init_size} on a later one"
            )
        if piece.frames == 0:
            if data:
                self._silent.append(data)
                self._size += len(data)
        else:
            if self._silent:
                self._size -= sum(map(len, self._silent))
                data = b"".join([*self._silent, data])
                self._silent.clear()
            part = Part(
                self._next_index, data, piece.frames, piece.keyframe, piece.duration, self._next_start
            )
            self._next_index += 1
            self._next_start += piece.duration
            self._frames += piece.frames
            self._parts.append(part)
            self._size += len(data)
            written.append(data)
            if not self.keep_recording:
                self._let_go()
        for viewer in tuple(self._viewers):
            viewer.take(written, pieces=int(piece.frames > 0))
        self._wake()

    def end(self, error: BaseException | None = None) -> None:
        """The generation ended (``"ended"``), or failed with ``error`` (``"failed"``): every viewer and
        waiter is woken. A viewer reads to the end and then stops, or raises ``error`` after the last
        bytes if the generation failed. Only the first call counts."""
        if self._state != "live":
            return
        if error is not None and not isinstance(error, BaseException):
            raise TypeError(f"{_OWNER}.end: error must be an exception or None, got {type(error).__name__}")
        self._state = "ended" if error is None else "failed"
        self._error = error
        self._tail, self._silent = self._silent, []
        for viewer in tuple(self._viewers):
            viewer.take(self._tail, pieces=0)  # the end's few bytes are no lag
        self._wake()

    # -- waiting --

    async def wait_for(self, part_index: int, *, timeout: float) -> bool:
        """Wait until the part ``part_index`` exists (True), or the generation ends or ``timeout`` seconds
        pass first (False): what a blocking playlist reload holds a request on. A waiter that is cancelled
        leaves nothing behind."""
        check_int("part_index", part_index, minimum=0, owner=f"{_OWNER}.wait_for")
        check_seconds("timeout", timeout, owner=f"{_OWNER}.wait_for", zero=True, infinite=True)
        with anyio.move_on_after(timeout):
            while part_index >= self._next_index and self._state == "live":
                await self._next_change()
        return part_index < self._next_index

    def viewer(
        self, *, live_edge: bool = True, buffer: int | None = None
    ) -> AbstractAsyncContextManager[AsyncIterator[bytes]]:
        """A viewer of the generation: ``async with broadcast.viewer() as viewer: async for data in viewer``.

        It yields the init segment first, then each part's bytes: from the newest keyframe while the
        generation is live (``live_edge``), else from the start (an ended generation, or
        ``live_edge=False``; without ``keep_recording``, from the oldest part held). It follows the
        generation until it ends; the pieces of 0 frames come along, so a viewer from the start gets the
        MP4 byte for byte. A failed generation ends the iteration with its error, after its last bytes.

        ``buffer`` (default ``viewer_buffer``): the pieces published since the viewer joined that it may
        leave unread. One more, and it is cut off: its buffer is dropped at once and its iteration raises
        :class:`streamvae.server.ViewerCutOffError`. Cut off, not jumped to the newest keyframe: a viewer
        reads one continuous fragmented MP4, and a jump leaves a gap in its timeline that a Media Source
        player stalls at; an HLS client, which fetches parts by name from the playlist, needs no buffer
        here at all. Either way the generator and the other viewers never wait for it. Leaving the block
        lets go of everything the viewer held.
        """
        check_bool("live_edge", live_edge, owner=f"{_OWNER}.viewer")
        if buffer is not None:
            check_int("buffer", buffer, minimum=1, owner=f"{_OWNER}.viewer")
        return _ViewerBlock(self, live_edge, self.viewer_buffer if buffer is None else buffer)

    def statistics(self) -> BroadcastStatistics:
        """A snapshot of the viewers' counters."""
        return BroadcastStatistics(
            viewers=len(self._viewers),
            viewers_ever=self._viewers_ever,
            cut_off=self._cut_off,
            bytes_served=self._bytes_served,
        )

    # -- the implementation --

    def _written(self, first_part: int) -> list[bytes]:
        """The bytes a viewer starting at the held part ``first_part`` (a position in ``_parts``) gets."""
        if self._init is None:
            return []
        # not the pieces of 0 frames since the last part: they reach every viewer with the next part
        return [self._init, *(part.data for part in self._parts[first_part:]), *self._tail]

    def _start(self, live_edge: bool) -> int:
        """Where a new viewer starts, as a position in ``_parts``."""
        if live_edge and self._state == "live":
            for position in range(len(self._parts) - 1, -1, -1):
                if self._parts[position].keyframe:
                    return position
        return 0

    def _let_go(self) -> None:
        """Drop the parts before the newest keyframe that leaves at least ``window`` parts held."""
        keep = self.window or 1
        for position in range(len(self._parts) - keep, 0, -1):
            if self._parts[position].keyframe:
                self._size -= sum(len(part.data) for part in self._parts[:position])
                del self._parts[:position]
                return

    async def _next_change(self) -> None:
        if self._changed is None:
            self._changed = anyio.Event()
        await self._changed.wait()

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def _register(self, viewer: _Viewer) -> None:
        self._viewers.add(viewer)
        self._viewers_ever += 1

    def _unregister(self, viewer: _Viewer) -> None:
        self._viewers.discard(viewer)

    def _count_cut_off(self) -> None:
        self._cut_off += 1

    def _count_served(self, size: int) -> None:
        self._bytes_served += size


class _Viewer:
    """One viewer's place in a broadcast: what it has yet to read, and whether it was cut off."""

    def __init__(self, broadcast: Broadcast, live_edge: bool, buffer: int) -> None:
        self._broadcast = broadcast
        self._buffer = buffer
        self._backlog = deque(broadcast._written(broadcast._start(live_edge)))  # there when it joined
        self._unread: deque[tuple[bytes, bool]] = deque()  # written since it joined, and whether it counts
        self._unread_pieces = 0  # the pieces among them: at most ``buffer``
        self._cut_off = False
        self._closed = False

    def take(self, written: Sequence[bytes], *, pieces: int) -> None:
        """Hand on newly written bytes, ``pieces`` pieces of them (the init segment and the end's bytes
        are none); one more unread piece than ``buffer`` cuts the viewer off."""
        if self._cut_off or self._closed or not written:
            return
        self._unread.extend((data, index >= len(written) - pieces) for index, data in enumerate(written))
        self._unread_pieces += pieces
        if self._unread_pieces > self._buffer:
            self._cut_off = True
            self._backlog.clear()
            self._unread.clear()
            self._broadcast._count_cut_off()

    def close(self) -> None:
        self._closed = True
        self._backlog.clear()
        self._unread.clear()

    def __aiter__(self) -> _Viewer:
        return self

    async def __anext__(self) -> bytes:
        broadcast = self._broadcast
        while True:
            await anyio.lowlevel.checkpoint()  # before anything is taken: a cancelled read loses nothing
            if self._closed:
                raise RuntimeError(f"{_OWNER}.viewer: the viewer is read inside its async with block only")
            if self._cut_off:
                raise ViewerCutOffError(self._buffer)
            if self._backlog:
                data = self._backlog.popleft()
            elif self._unread:
                data, counted = self._unread.popleft()
                self._unread_pieces -= counted
            else:
                data = None
            if data is not None:
                broadcast._count_served(len(data))
                return data
            if broadcast._state == "failed" and broadcast._error is not None:
                raise broadcast._error
            if broadcast._state != "live":
                raise StopAsyncIteration
            await broadcast._next_change()


class _ViewerBlock:
    """:meth:`Broadcast.viewer`'s async context manager: the viewer is registered for the block's length."""

    def __init__(self, broadcast: Broadcast, live_edge: bool, buffer: int) -> None:
        self._broadcast = broadcast
        self._live_edge = live_edge
        self._buffer = buffer
        self._viewer: _Viewer | None = None

    async def __aenter__(self) -> AsyncIterator[bytes]:
        if self._viewer is not None:
            raise RuntimeError(f"{_OWNER}.viewer: a viewer's block is entered once")
        self._viewer = _Viewer(self._broadcast, self._live_edge, self._buffer)
        self._broadcast._register(self._viewer)
        return self._viewer

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._viewer is not None
        self._broadcast._unregister(self._viewer)
        self._viewer.close()
