"""Sinks: where an entry's MP4 pieces go once its encoder wrote them.

Each batch entry has one :class:`EntrySink`: its pieces (:class:`streamvae.MP4Piece`, whole fragments
with their frame counts) are kept in memory for ``finish()``, or handed to an :class:`MP4ByteStream` its
reader iterates as they are written — as bytes, or as the pieces themselves. (An output file is written
by the entry's encoder itself, in its worker thread: see ``_output_file``.) The streams of a session share
one pipeline, so they must be read at once: :func:`read_entries` does that from one task.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, Literal, overload

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectStreamStatistics

from streamvae._checks import check_bool
from streamvae._errors import SessionClosedError, UnreadStreamError
from streamvae._failure import FailureRecord
from streamvae._fragments import MP4Piece
from streamvae._public import public

__all__ = ["Arrivals", "EntrySink", "MP4ByteStream", "read_entries", "watch_readers"]

#: how often a session with several byte streams looks for a reader that waits on an unread entry
_READER_CHECK_SECONDS = 0.05


class Arrivals:
    """Wakes :func:`read_entries` when any stream of a session got bytes, ended, or the session failed."""

    def __init__(self) -> None:
        self.event = anyio.Event()

    def notify(self) -> None:
        arrived, self.event = self.event, anyio.Event()
        arrived.set()


@public
class MP4ByteStream:
    """One entry's MP4 bytes as they are written; iterate it with ``async for``.

    ``async for data in stream`` gives ``bytes``; ``async for piece in stream.pieces()`` gives the same
    output as :class:`streamvae.MP4Piece` — whole fragments, each with the video frames it lets a player
    show (what a WebSocket frame or a pacer needs), so nobody parses the MP4 again. Either way the
    concatenation is the entry's MP4.

    The buffer between the encoder and the reader is bounded (``max_buffered`` pieces): a slow reader
    holds up that entry's encoder, then the ring and finally ``push``. The iteration ends after the last
    bytes; if the session failed, it raises the session's error instead of ending quietly. Closing the
    stream (``aclose``) before the end aborts the session — nobody is left to read the entry. One reader
    at a time, whichever way it reads: a second task iterating the stream meanwhile gets
    ``anyio.BusyResourceError`` (each would get part of the bytes).
    """

    def __init__(self, entry: int, max_buffered: int, failure: FailureRecord, arrivals: Arrivals) -> None:
        self._send, self._receive = anyio.create_memory_object_stream[MP4Piece](max_buffered)
        self._failure = failure
        self._arrivals = arrivals
        self.entry = entry
        #: set once the entry's MP4 is complete (every byte has been handed to the stream)
        self.completed = False
        self._read_started = False  # a reader has come: a full buffer is then not left behind for good
        self._reading = False

    def __aiter__(self) -> MP4ByteStream:
        return self

    async def __anext__(self) -> bytes:
        return (await self._next_piece()).data

    def pieces(self) -> AsyncIterator[MP4Piece]:
        """The entry's output as :class:`streamvae.MP4Piece`, as written (the same one-reader rule)."""
        return _Pieces(self)

    async def _next_piece(self) -> MP4Piece:
        with self._claim():
            try:
                return await self._receive.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                self._raise_end()
                raise StopAsyncIteration from None

    def statistics(self) -> MemoryObjectStreamStatistics:
        """The bounded buffer's statistics (``current_buffer_used``, ``max_buffer_size``, ...)."""
        return self._receive.statistics()

    async def aclose(self) -> None:
        self._receive.close()

    def end_unwritten(self) -> None:
        """End the stream from the writing side before any encoder wrote to it (the session was aborted
        before its first chunk): a waiting reader wakes and raises why, instead of waiting forever."""
        self._send.close()

    @property
    def read_started(self) -> bool:
        """Whether a reader has come for this stream (the session's stall check uses it)."""
        return self._read_started

    @contextlib.contextmanager
    def _claim(self) -> Iterator[None]:
        if self._reading:
            raise anyio.BusyResourceError("reading from")
        self._reading = self._read_started = True
        try:
            yield
        finally:
            self._reading = False

    def _raise_end(self) -> None:
        """The stream ended: return if the MP4 is complete, else raise why it is not."""
        if self.completed:
            return
        self._failure.raise_if_failed()
        raise SessionClosedError(f"the session was aborted before entry {self.entry}'s MP4 was complete")


class _Pieces:
    """The iterator :meth:`MP4ByteStream.pieces` returns: each piece as the stream receives it."""

    def __init__(self, stream: MP4ByteStream) -> None:
        self._stream = stream

    def __aiter__(self) -> _Pieces:
        return self

    async def __anext__(self) -> MP4Piece:
        return await self._stream._next_piece()


class EntrySink:
    """Where one entry's MP4 pieces go: kept for ``finish``, or sent to its :class:`MP4ByteStream`."""

    def __init__(self, entry: int, stream: MP4ByteStream | None = None) -> None:
        self.entry = entry
        self.parts: list[bytes] = []
        self.stream = stream

    async def write(self, piece: MP4Piece) -> None:
        """Keep or send ``piece``; waits while the stream's buffer is full (backpressure)."""
        if not piece.data:
            return
        if self.stream is None:
            self.parts.append(piece.data)
            return
        try:
            await self.stream._send.send(piece)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            raise self._reader_gone() from None
        self.stream._arrivals.notify()

    def offer(self, piece: MP4Piece) -> bool:
        """Keep or send ``piece`` if that needs no wait; False (nothing taken) while the stream's buffer
        is full: the caller writes it later, when it holds nothing a wait could block others on."""
        if not piece.data:
            return True
        if self.stream is None:
            self.parts.append(piece.data)
            return True
        try:
            self.stream._send.send_nowait(piece)
        except anyio.WouldBlock:
            return False
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            raise self._reader_gone() from None
        self.stream._arrivals.notify()
        return True

    def _reader_gone(self) -> SessionClosedError:
        return SessionClosedError(
            f"the reader of entry {self.entry}'s stream closed it before the MP4 was complete"
        )

    def complete(self) -> None:
        """Every byte of the entry's MP4 has been written."""
        if self.stream is not None:
            self.stream.completed = True

    def close(self) -> None:
        """No more bytes: the stream's reader sees its end (or the session's error)."""
        if self.stream is not None:
            self.stream._send.close()
            self.stream._arrivals.notify()

    def getvalue(self) -> bytes:
        return b"".join(self.parts)


@overload
def read_entries(
    streams: Sequence[MP4ByteStream], *, pieces: Literal[False] = False
) -> AsyncIterator[tuple[int, bytes]]: ...


@overload
def read_entries(
    streams: Sequence[MP4ByteStream], *, pieces: Literal[True]
) -> AsyncIterator[tuple[int, MP4Piece]]: ...


@public
async def read_entries(
    streams: Sequence[MP4ByteStream], *, pieces: bool = False
) -> AsyncIterator[tuple[int, bytes] | tuple[int, MP4Piece]]:
    """Every entry's MP4 bytes as ``(entry, data)``, in the order they are written, until all are complete.

    The way to read several entries from one task: ``async for entry, data in read_entries(streams)``. The
    entries share one pipeline, so reading one to its end before the next would stop it once the unread
    entry's buffer fills (the session then fails with :class:`streamvae.UnreadStreamError`); this takes
    whatever any entry has. Raises the session's error if it failed, like iterating a stream does; while it
    runs, the streams are its own (another reader gets ``anyio.BusyResourceError``).

    ``pieces=True`` yields ``(entry, piece)`` with each :class:`streamvae.MP4Piece` instead of its bytes.
    """
    check_bool("pieces", pieces, owner="read_entries")
    streams = list(streams)
    if not streams or not all(isinstance(stream, MP4ByteStream) for stream in streams):
        raise TypeError("read_entries() takes a non-empty sequence of MP4ByteStream (from stream_mp4)")
    arrivals = streams[0]._arrivals
    if any(stream._arrivals is not arrivals for stream in streams):
        raise ValueError("read_entries() takes the streams of one session")
    with contextlib.ExitStack() as claims:
        for stream in streams:
            claims.enter_context(stream._claim())
        pending = streams
        while pending:
            arrived = arrivals.event  # taken before looking, so no wake-up falls in between
            taken = False
            for stream in list(pending):
                try:
                    piece = stream._receive.receive_nowait()
                except anyio.WouldBlock:
                    continue
                except (anyio.EndOfStream, anyio.ClosedResourceError):
                    stream._raise_end()
                    pending.remove(stream)
                else:
                    yield (stream.entry, piece) if pieces else (stream.entry, piece.data)
                taken = True
            if not taken:
                await arrived.wait()


async def watch_readers(
    streams: dict[int, MP4ByteStream],
    entry_queues: list[MemoryObjectReceiveStream[Any]],
    fail: Callable[[BaseException], None],
) -> None:
    """Fail the session with :class:`UnreadStreamError` instead of letting its readers hang.

    Readers that take one entry to its end before starting the next wait forever once the unread entry's
    buffer fills: its encoder stops, the land stage stops at it, and no entry gets new frames. The state
    is checked a few times a second while it lasts and reported once seen twice in a row, so a reader task
    that is about to start is not mistaken for one that never will. ``entry_queues`` are the encoders'
    input queues, one per entry.
    """
    suspect: tuple[int, int] | None = None
    while True:
        await anyio.sleep(_READER_CHECK_SECONDS)
        stalled = _stalled_readers(streams, entry_queues)
        if stalled is not None and stalled == suspect:
            fail(UnreadStreamError(*stalled))
            return
        suspect = stalled


def _stalled_readers(
    streams: dict[int, MP4ByteStream], entry_queues: list[MemoryObjectReceiveStream[Any]]
) -> tuple[int, int] | None:
    """``(waiting, unread)`` when entry ``waiting``'s reader can only get bytes after entry ``unread``'s
    never-read stream is read: the reader waits on an empty buffer, its encoder on an empty queue, and the
    land stage on the unread entry's encoder, which waits on its full buffer."""
    for waiting, stream in streams.items():
        output, queue = stream.statistics(), entry_queues[waiting].statistics()
        if output.tasks_waiting_receive == 0 or output.current_buffer_used:
            continue
        if queue.tasks_waiting_receive == 0 or queue.current_buffer_used:
            continue
        for unread, other in streams.items():
            if unread == waiting or other.read_started:
                continue
            full, landing = other.statistics(), entry_queues[unread].statistics()
            if (
                full.current_buffer_used >= full.max_buffer_size
                and full.tasks_waiting_send
                and landing.tasks_waiting_send
            ):
                return waiting, unread
    return None
