"""Sinks, driven without a VAE: an entry's bytes reach its stream in order, a full stream holds its writer,
the end of a stream says why it ended, and a reader stuck behind an unread stream is reported."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream

import streamvae._sinks
from streamvae import SessionClosedError, UnreadStreamError
from streamvae._failure import FailureRecord
from streamvae._fragments import MP4Piece
from streamvae._sinks import Arrivals, EntrySink, MP4ByteStream, read_entries, watch_readers

HANG_GUARD = 10  # seconds, a hang guard only: every wait below ends in milliseconds unless a sink is broken


class Session:
    """What a session gives its entries' sinks: one failure record and one Arrivals for all its streams."""

    def __init__(self) -> None:
        self.failure = FailureRecord()
        self.arrivals = Arrivals()

    def entry(self, entry: int, max_buffered: int = 4) -> tuple[EntrySink, MP4ByteStream]:
        stream = MP4ByteStream(entry, max_buffered, self.failure, self.arrivals)
        return EntrySink(entry, stream), stream


def piece(data: bytes) -> MP4Piece:
    """Bytes as the encoder hands them on (the sinks carry them whatever frames they hold)."""
    return MP4Piece(data, 0, 0)


def end_complete(sink: EntrySink) -> None:
    """What an entry's encoder does after its last bytes."""
    sink.complete()
    sink.close()


# -- Arrivals --


@pytest.mark.anyio
async def test_arrivals_wake_the_current_waiters_and_arm_a_fresh_event() -> None:
    arrivals = Arrivals()
    before = arrivals.event
    arrivals.notify()
    assert before.is_set()
    assert arrivals.event is not before and not arrivals.event.is_set()


# -- EntrySink and MP4ByteStream --


@pytest.mark.anyio
async def test_an_entry_without_a_stream_keeps_its_bytes_for_finish() -> None:
    sink = EntrySink(0)
    await sink.write(piece(b"ftyp"))
    assert sink.offer(piece(b"moov"))
    await sink.write(piece(b""))
    end_complete(sink)  # nothing to end without a stream
    assert sink.parts == [b"ftyp", b"moov"]
    assert sink.getvalue() == b"ftypmoov"


@pytest.mark.anyio
async def test_written_and_offered_bytes_reach_the_stream_in_order() -> None:
    sink, stream = Session().entry(0)
    await sink.write(piece(b"ftyp"))
    assert sink.offer(piece(b"moof"))
    await sink.write(piece(b"mdat"))
    end_complete(sink)
    assert [data async for data in stream] == [b"ftyp", b"moof", b"mdat"]
    assert sink.getvalue() == b""  # a streamed entry's bytes went to its stream, not to finish


@pytest.mark.anyio
async def test_empty_bytes_are_taken_without_reaching_the_stream_or_waking_anyone() -> None:
    session = Session()
    sink, stream = session.entry(0, max_buffered=1)
    arrived = session.arrivals.event
    await sink.write(piece(b""))
    assert sink.offer(piece(b""))
    assert stream.statistics().current_buffer_used == 0
    assert not arrived.is_set()


@pytest.mark.anyio
async def test_every_piece_handed_to_a_stream_and_its_end_wake_the_arrivals() -> None:
    session = Session()
    sink, _ = session.entry(0)
    woken = []
    arrived = session.arrivals.event
    await sink.write(piece(b"a"))
    woken.append(arrived.is_set())
    arrived = session.arrivals.event
    assert sink.offer(piece(b"b"))
    woken.append(arrived.is_set())
    arrived = session.arrivals.event
    sink.close()
    woken.append(arrived.is_set())
    assert woken == [True, True, True]


@pytest.mark.anyio
async def test_the_stream_statistics_are_its_bounded_buffers() -> None:
    sink, stream = Session().entry(0, max_buffered=3)
    await sink.write(piece(b"a"))
    await sink.write(piece(b"b"))
    statistics = stream.statistics()
    assert (statistics.current_buffer_used, statistics.max_buffer_size) == (2, 3)


@pytest.mark.anyio
async def test_a_complete_stream_ends_its_iteration_after_the_last_bytes() -> None:
    sink, stream = Session().entry(0)
    await sink.write(piece(b"ftyp"))
    await sink.write(piece(b"moov"))
    end_complete(sink)
    assert [data async for data in stream] == [b"ftyp", b"moov"]
    with pytest.raises(StopAsyncIteration):
        await anext(stream)  # and stays ended


@pytest.mark.anyio
async def test_a_stream_that_ends_incomplete_raises_the_sessions_original_error_after_its_bytes() -> None:
    session = Session()
    sink, stream = session.entry(0)
    error = OSError("disk full")
    await sink.write(piece(b"part"))
    session.failure.record(error)
    sink.close()
    got = []
    with pytest.raises(OSError) as raised:
        async for data in stream:
            got.append(data)
    assert raised.value is error
    assert got == [b"part"]


@pytest.mark.anyio
async def test_a_reader_that_raised_the_failure_has_delivered_it() -> None:
    session = Session()
    sink, stream = session.entry(0)
    session.failure.record(OSError("disk full"))
    sink.close()
    with pytest.raises(OSError):
        await anext(stream)
    session.failure.raise_if_undelivered()  # raises nothing: leaving the block raises it no second time


@pytest.mark.anyio
async def test_a_stream_that_ends_incomplete_without_an_error_says_the_session_was_aborted() -> None:
    sink, stream = Session().entry(2)
    sink.close()
    with pytest.raises(SessionClosedError, match="aborted before entry 2's MP4 was complete"):
        await anext(stream)


@pytest.mark.anyio
async def test_a_complete_stream_ends_quietly_though_the_session_failed_afterwards() -> None:
    session = Session()
    sink, stream = session.entry(0)
    await sink.write(piece(b"whole"))
    sink.complete()
    session.failure.record(OSError("another entry's disk is full"))
    sink.close()
    assert [data async for data in stream] == [b"whole"]


@pytest.mark.anyio
async def test_a_stream_ended_before_any_write_wakes_its_waiting_reader_with_the_error() -> None:
    session = Session()
    _, stream = session.entry(0)
    error = OSError("the decode failed before its first chunk")
    raised: list[BaseException] = []

    async def reader() -> None:
        with pytest.raises(OSError) as caught:
            await anext(stream)
        raised.append(caught.value)

    with anyio.fail_after(HANG_GUARD):  # hang guard: the point is that the reader does not wait forever
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(reader)
            await anyio.wait_all_tasks_blocked()  # the reader waits for a first byte
            session.failure.record(error)
            stream.end_unwritten()
    assert raised == [error]


@pytest.mark.anyio
async def test_closing_the_stream_fails_its_writer_and_its_reads() -> None:
    sink, stream = Session().entry(3)
    await stream.aclose()
    gone = "the reader of entry 3's stream closed it before the MP4 was complete"
    with pytest.raises(SessionClosedError, match=gone):
        await sink.write(piece(b"moof"))
    with pytest.raises(SessionClosedError, match=gone):
        sink.offer(piece(b"moof"))
    with pytest.raises(SessionClosedError, match="aborted before entry 3's MP4 was complete"):
        await anext(stream)


@pytest.mark.anyio
async def test_closing_the_stream_releases_a_writer_waiting_on_its_full_buffer() -> None:
    sink, stream = Session().entry(0, max_buffered=1)
    await sink.write(piece(b"first"))
    refused = anyio.Event()

    async def writer() -> None:
        with pytest.raises(SessionClosedError, match="closed it before the MP4 was complete"):
            await sink.write(piece(b"second"))
        refused.set()

    with anyio.fail_after(HANG_GUARD):  # hang guard
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(writer)
            await anyio.wait_all_tasks_blocked()  # the writer waits on the full buffer
            await stream.aclose()
    assert refused.is_set()


@pytest.mark.anyio
async def test_a_writer_waits_while_the_stream_is_full_and_goes_on_once_it_is_read() -> None:
    sink, stream = Session().entry(0, max_buffered=1)
    await sink.write(piece(b"first"))
    assert not sink.offer(piece(b"second"))  # full: nothing taken, the caller writes it later
    assert stream.statistics().current_buffer_used == 1
    written = anyio.Event()

    async def writer() -> None:
        await sink.write(piece(b"second"))
        written.set()

    with anyio.fail_after(HANG_GUARD):  # hang guard
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(writer)
            await anyio.wait_all_tasks_blocked()
            assert not written.is_set()
            assert stream.statistics().tasks_waiting_send == 1
            assert await anext(stream) == b"first"
            await written.wait()
        assert await anext(stream) == b"second"


@pytest.mark.anyio
async def test_a_second_reader_meanwhile_gets_busy_resource_error() -> None:
    sink, stream = Session().entry(0)
    got: list[bytes] = []

    async def first_reader() -> None:
        got.append(await anext(stream))

    with anyio.fail_after(HANG_GUARD):  # hang guard
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(first_reader)
            await anyio.wait_all_tasks_blocked()  # the first reader waits inside the stream
            with pytest.raises(anyio.BusyResourceError):
                await anext(stream)
            with pytest.raises(anyio.BusyResourceError):
                async for _ in read_entries([stream]):
                    pass
            await sink.write(piece(b"moof"))
    assert got == [b"moof"]


@pytest.mark.anyio
async def test_readers_may_take_turns_on_a_stream_one_after_another() -> None:
    sink, stream = Session().entry(0)
    for data in (b"a", b"b"):
        await sink.write(piece(data))
    got: list[bytes] = []

    async def read_one() -> None:
        got.append(await anext(stream))

    for _ in range(2):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(read_one)
    assert got == [b"a", b"b"]


@pytest.mark.anyio
async def test_a_stream_counts_as_read_from_the_moment_a_reader_waits_on_it() -> None:
    sink, stream = Session().entry(0)
    assert not stream.read_started

    async def reader() -> None:
        await anext(stream)

    with anyio.fail_after(HANG_GUARD):  # hang guard
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(reader)
            await anyio.wait_all_tasks_blocked()
            assert stream.read_started  # before any byte came
            await sink.write(piece(b"moof"))
    assert stream.read_started  # and after the reader left


# -- read_entries --


@pytest.mark.anyio
async def test_read_entries_yields_each_piece_as_it_arrives_whichever_entry_it_belongs_to() -> None:
    session = Session()
    sinks, streams = zip(*(session.entry(entry) for entry in range(2)), strict=True)
    got_send, got_receive = anyio.create_memory_object_stream[tuple[int, bytes]](8)

    async def reader() -> None:
        async with got_send:
            async for item in read_entries(streams):
                await got_send.send(item)

    with anyio.fail_after(HANG_GUARD):  # hang guard
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(reader)
            for entry, data in [(1, b"a"), (0, b"b"), (0, b"c"), (1, b"d")]:
                await sinks[entry].write(piece(data))
                assert await got_receive.receive() == (entry, data)
            end_complete(sinks[0])
            await sinks[1].write(piece(b"e"))  # an entry still gets bytes after another is complete
            assert await got_receive.receive() == (1, b"e")
            end_complete(sinks[1])
            with pytest.raises(anyio.EndOfStream):
                await got_receive.receive()  # the reader ended: every entry is complete


@pytest.mark.anyio
async def test_read_entries_takes_turns_between_entries_with_bytes_waiting() -> None:
    session = Session()
    sinks, streams = zip(*(session.entry(entry) for entry in range(2)), strict=True)
    for entry, data in [(0, b"a"), (0, b"b"), (1, b"x"), (0, b"c")]:
        await sinks[entry].write(piece(data))
    for sink in sinks:
        end_complete(sink)
    got = [item async for item in read_entries(streams)]
    assert got == [(0, b"a"), (1, b"x"), (0, b"b"), (0, b"c")]  # each entry's own order kept


@pytest.mark.anyio
async def test_read_entries_raises_the_sessions_original_error_after_the_bytes_before_it() -> None:
    session = Session()
    (whole, whole_stream), (cut, cut_stream) = session.entry(0), session.entry(1)
    await whole.write(piece(b"whole"))
    end_complete(whole)
    await cut.write(piece(b"part"))
    error = OSError("disk full")
    session.failure.record(error)
    cut.close()
    got = []
    with pytest.raises(OSError) as raised:
        async for item in read_entries([whole_stream, cut_stream]):
            got.append(item)
    assert raised.value is error
    assert got == [(0, b"whole"), (1, b"part")]


@pytest.mark.anyio
async def test_read_entries_takes_only_streams_of_one_session() -> None:
    _, stream = Session().entry(0)
    _, foreign = Session().entry(1)
    with pytest.raises(TypeError, match="non-empty sequence of MP4ByteStream"):
        async for _ in read_entries([stream, b"bytes"]):  # type: ignore[list-item]
            pass
    with pytest.raises(ValueError, match="streams of one session"):
        async for _ in read_entries([stream, foreign]):
            pass


@pytest.mark.anyio
async def test_read_entries_holds_every_stream_while_it_runs_and_frees_them_at_its_end() -> None:
    session = Session()
    sinks, streams = zip(*(session.entry(entry) for entry in range(2)), strict=True)

    async def reader() -> None:
        async for _ in read_entries(streams):
            pass

    with anyio.fail_after(HANG_GUARD):  # hang guard
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(reader)
            await anyio.wait_all_tasks_blocked()  # read_entries waits for bytes
            for stream in streams:
                with pytest.raises(anyio.BusyResourceError):
                    await anext(stream)
            for sink in sinks:
                end_complete(sink)
    assert [[data async for data in stream] for stream in streams] == [[], []]  # readable again: ended


# -- watch_readers --


@dataclass
class StoppedPipeline:
    """Entry 0's reader waits for bytes that cannot come, because entry 1's stream is full (and, unless
    ``unread_stream_was_read``, has never had a reader): entry 0's encoder waits on its empty input queue,
    entry 1's encoder waits to write into its full stream, and the land stage waits to hand entry 1 its
    next lease."""

    session: Session = field(default_factory=Session)
    sinks: list[EntrySink] = field(default_factory=list)
    streams: dict[int, MP4ByteStream] = field(default_factory=dict)
    entry_queues: list[MemoryObjectReceiveStream[int]] = field(default_factory=list)
    #: what entry 0's reader raised
    reader_errors: list[Exception] = field(default_factory=list)
    reader_done: anyio.Event = field(default_factory=anyio.Event)

    async def start(self, tasks: TaskGroup, *, unread_stream_was_read: bool = False) -> None:
        for entry in range(2):
            sink, stream = self.session.entry(entry, max_buffered=1)
            self.sinks.append(sink)
            self.streams[entry] = stream
        queues = [anyio.create_memory_object_stream[int](1) for _ in range(2)]
        self.entry_queues = [receive for _, receive in queues]
        if unread_stream_was_read:
            await self.sinks[1].write(piece(b"earlier"))
            assert await anext(self.streams[1]) == b"earlier"
        await self.sinks[1].write(piece(b"fills it"))
        queues[1][0].send_nowait(0)  # entry 1's encoder takes no lease while it waits on its stream
        tasks.start_soon(self._read_entry_0)
        tasks.start_soon(self.entry_queues[0].receive)  # entry 0's encoder waits for a lease
        tasks.start_soon(self._encode_entry_1)
        tasks.start_soon(queues[1][0].send, 1)  # the land stage waits on entry 1
        await anyio.wait_all_tasks_blocked()

    async def _read_entry_0(self) -> None:
        try:
            async for _ in self.streams[0]:
                pass
        except Exception as error:
            self.reader_errors.append(error)
        finally:
            self.reader_done.set()

    async def _encode_entry_1(self) -> None:
        # Released with SessionClosedError once the failed session ends its streams.
        with contextlib.suppress(SessionClosedError):
            await self.sinks[1].write(piece(b"waits"))

    def fail(self, error: BaseException) -> None:
        """What failing the session does to its sinks: record the error, end every stream."""
        self.session.failure.record(error)
        for sink in self.sinks:
            sink.close()


@dataclass
class Looks:
    """What the watcher saw at each look, and an event set after ``until`` looks."""

    until: int
    seen: list[tuple[int, int] | None] = field(default_factory=list)
    enough: anyio.Event = field(default_factory=anyio.Event)


def spy_on_what_the_watcher_sees(monkeypatch: pytest.MonkeyPatch, *, until: int) -> Looks:
    """Record each look of watch_readers (through the private _stalled_readers: the number of looks has no
    public counter), so a test waits for looks, not for time."""
    looks = Looks(until)
    stalled_readers = streamvae._sinks._stalled_readers

    def spy(
        streams: dict[int, MP4ByteStream], entry_queues: list[MemoryObjectReceiveStream[Any]]
    ) -> tuple[int, int] | None:
        looks.seen.append(stalled_readers(streams, entry_queues))
        if len(looks.seen) >= looks.until:
            looks.enough.set()
        return looks.seen[-1]

    monkeypatch.setattr(streamvae._sinks, "_stalled_readers", spy)
    return looks


@pytest.mark.anyio
async def test_a_reader_waiting_behind_a_full_unread_stream_fails_with_unread_stream_error() -> None:
    pipeline = StoppedPipeline()
    with anyio.fail_after(HANG_GUARD):  # hang guard: without the watcher, entry 0's reader waits forever
        async with anyio.create_task_group() as tasks:
            await pipeline.start(tasks)
            await watch_readers(pipeline.streams, pipeline.entry_queues, pipeline.fail)
            await pipeline.reader_done.wait()
            tasks.cancel_scope.cancel()
    [error] = pipeline.session.failure.errors
    assert isinstance(error, UnreadStreamError)
    assert (error.waiting, error.unread) == (0, 1)
    assert pipeline.reader_errors == [error]  # the reader raised it instead of hanging


@pytest.mark.anyio
async def test_a_full_stream_whose_reader_has_come_is_not_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    # A reader that read entry 1 before may come back for it: nothing is stuck for good.
    looks = spy_on_what_the_watcher_sees(monkeypatch, until=3)
    pipeline = StoppedPipeline()
    failures: list[BaseException] = []
    with anyio.fail_after(HANG_GUARD):  # hang guard
        async with anyio.create_task_group() as tasks:
            await pipeline.start(tasks, unread_stream_was_read=True)
            tasks.start_soon(watch_readers, pipeline.streams, pipeline.entry_queues, failures.append)
            await looks.enough.wait()
            tasks.cancel_scope.cancel()
    assert len(looks.seen) >= 3 and all(stalled is None for stalled in looks.seen)
    assert failures == []


@pytest.mark.anyio
async def test_a_stall_is_reported_only_once_seen_twice_in_a_row(monkeypatch: pytest.MonkeyPatch) -> None:
    # What the watcher sees is scripted (it looks through the private _stalled_readers, and no public
    # state can be held for exactly one look without sleeping): a reader about to start is not reported.
    script = iter([(0, 1), None, (0, 1), (1, 0), (1, 0)])
    looks: list[tuple[int, int] | None] = []

    def scripted(streams: object, entry_queues: object) -> tuple[int, int] | None:
        looks.append(next(script))
        return looks[-1]

    monkeypatch.setattr(streamvae._sinks, "_stalled_readers", scripted)
    monkeypatch.setattr(streamvae._sinks, "_READER_CHECK_SECONDS", 0)
    failures: list[BaseException] = []
    with anyio.fail_after(HANG_GUARD):  # hang guard
        await watch_readers({}, [], failures.append)
    assert len(looks) == 5  # and it stopped watching once it reported
    [error] = failures
    assert isinstance(error, UnreadStreamError)
    assert (error.waiting, error.unread) == (1, 0)
