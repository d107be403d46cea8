"""MP4 pieces: the encoder's output as whole fragments that know their frames, keyframe, duration and init
segment, handed on once to every reader. Checked against the boxes themselves and against PyAV decoding what
a reader received."""

from __future__ import annotations

import io
import struct
from collections.abc import AsyncIterable, Callable, Sequence
from fractions import Fraction
from typing import Any, TypeVar

import anyio
import av
import numpy as np
import pytest

from streamvae import ChunkedVideoMP4Session, MP4ByteStream, MP4Piece, read_entries
from streamvae._boxes import box_children, file_boxes
from streamvae._fragments import FragmentCutter
from tests import _media
from tests._media import (
    DETERMINISTIC_X264,
    count_frames,
    moving_pattern,
    read_mp4,
    top_level_boxes,
    wan_like_chunks,
)

pytestmark = pytest.mark.anyio

HANG_GUARD = 60  # seconds: turns a hang into a failure, never a speed check
FRAGMENTED: dict[str, Any] = {
    "value_range": (-1, 1),
    "fps": 16,
    "output": "fragmented",
    "video_codec_options": DETERMINISTIC_X264,
}
T = TypeVar("T")
CHUNKS = wan_like_chunks(5, height=32, width=32)  # 17 frames: 1, then 4 a latent frame
FRAMES = sum(chunk.shape[2] for chunk in CHUNKS)


def box_types(data: bytes) -> list[bytes]:
    """The types of the top-level boxes ``data`` is made of; fails unless it is whole boxes exactly."""
    return [kind for kind, _, _ in top_level_boxes(data)]


def joined(pieces: Sequence[MP4Piece]) -> bytes:
    return b"".join(piece.data for piece in pieces)


async def streamed(
    read: Callable[[MP4ByteStream], AsyncIterable[T]], chunks: Sequence[Any] = CHUNKS, **options: Any
) -> list[T]:
    """What ``read`` yields from entry 0's stream while the chunks are pushed (fragmented by default)."""
    return await _media.streamed(read, chunks, **{**FRAGMENTED, **options})


async def streamed_pieces(chunks: Sequence[Any] = CHUNKS, **options: Any) -> list[MP4Piece]:
    """Entry 0's pieces, read with ``pieces()`` while the chunks are pushed."""
    return await streamed(MP4ByteStream.pieces, chunks, **options)


async def test_a_fragmented_mp4_comes_as_whole_fragments_each_knowing_its_frames() -> None:
    pieces = await streamed_pieces()
    kinds = [box_types(piece.data) for piece in pieces]
    assert kinds[0] == [b"ftyp", b"moov", b"moof", b"mdat"]  # the header travels with the first fragment
    assert all(middle == [b"moof", b"mdat"] for middle in kinds[1:-1])
    assert kinds[-1] == [b"mfra"] and pieces[-1].frames == 0
    data = joined(pieces)
    assert sum(piece.frames for piece in pieces) == read_mp4(data).frames.shape[0] == FRAMES
    until = 0
    for index, piece in enumerate(pieces):
        until += piece.frames
        assert piece.frames_until == until
        # what a player that got these pieces so far shows: exactly frames_until frames
        assert count_frames(joined(pieces[: index + 1])) == piece.frames_until


async def test_fragment_frames_puts_several_frames_in_a_piece() -> None:
    pieces = await streamed_pieces(fragment_frames=4)
    assert [piece.frames for piece in pieces] == [4, 4, 4, 4, 1, 0]
    assert count_frames(joined(pieces[:2])) == pieces[1].frames_until == 8


async def test_the_bytes_of_a_stream_are_its_pieces_and_the_mp4_finish_gives() -> None:
    pieces = await streamed_pieces()
    received = await streamed(lambda stream: stream)
    with anyio.fail_after(HANG_GUARD):
        async with ChunkedVideoMP4Session(**FRAGMENTED) as session:
            for chunk in CHUNKS:
                await session.push(chunk)
            (kept,) = await session.finish()
    assert received == [piece.data for piece in pieces]  # a piece a byte-stream item
    assert b"".join(received) == joined(pieces) == kept


async def test_a_plain_mp4_is_one_piece_with_every_frame() -> None:
    pieces = await streamed_pieces(output="mp4")
    [piece] = pieces
    assert piece.frames == piece.frames_until == FRAMES
    assert read_mp4(piece.data).frames.shape[0] == FRAMES
    assert box_types(piece.data)[:2] == [b"ftyp", b"moov"]  # faststart: the moov first
    # it starts at a keyframe and lasts its frames; its moov is no init segment a fragment follows
    assert piece.keyframe and piece.duration == Fraction(FRAMES, 16) and piece.init_size == 0


async def test_an_audio_tracks_samples_are_not_frames() -> None:
    rate = 16000
    wave = np.sin(np.arange(FRAMES * rate // 16) / 10).astype(np.float32)
    pieces = await streamed_pieces(audio_waveforms=[wave], audio_sample_rate=rate)
    assert any(piece.frames == 0 for piece in pieces[:-1])  # fragments of audio alone
    assert sum(piece.frames for piece in pieces) == read_mp4(joined(pieces)).frames.shape[0] == FRAMES
    for index, piece in enumerate(pieces):
        assert count_frames(joined(pieces[: index + 1])) == piece.frames_until


def keyframes_of(data: bytes) -> list[int]:
    """The indices of the frames PyAV decodes from ``data`` as keyframes."""
    with av.open(io.BytesIO(data)) as container:
        return [index for index, frame in enumerate(container.decode(video=0)) if frame.key_frame]


def first_frames(pieces: Sequence[MP4Piece]) -> list[int]:
    """The index of each piece's first video frame."""
    return [piece.frames_until - piece.frames for piece in pieces]


async def test_pieces_say_where_a_player_can_start_how_long_they_last_and_where_the_init_segment_ends() -> (
    None
):
    pieces = await streamed_pieces(keyframe_interval=8, fragment_frames=4)
    keyframes = keyframes_of(joined(pieces))
    assert keyframes == [0, 8, 16]
    assert [piece.keyframe for piece in pieces] == [
        piece.frames > 0 and start in keyframes
        for piece, start in zip(pieces, first_frames(pieces), strict=True)
    ]
    assert [piece.duration for piece in pieces] == [Fraction(piece.frames, 16) for piece in pieces]
    assert sum(piece.duration for piece in pieces) == Fraction(FRAMES, 16)  # exact: frames / fps
    mfra = pieces[-1]
    assert (mfra.frames, mfra.keyframe, mfra.duration, mfra.init_size) == (0, False, 0, 0)
    first = pieces[0]
    assert box_types(first.data[: first.init_size]) == [b"ftyp", b"moov"]
    assert box_types(first.data[first.init_size :]) == [b"moof", b"mdat"]
    assert all(piece.init_size == 0 for piece in pieces[1:])
    # A player that joins at a keyframe piece: the init segment, then the pieces from there on, plays.
    init = first.data[: first.init_size]
    joining = next(index for index, piece in enumerate(pieces) if piece.keyframe and index)
    late = init + joined(pieces[joining:])
    assert count_frames(late) == FRAMES - first_frames(pieces)[joining] == FRAMES - 8
    assert keyframes_of(late)[0] == 0  # the first frame it shows is a keyframe


async def test_an_audio_track_counts_in_no_pieces_duration_or_keyframe() -> None:
    rate = 16000
    wave = np.sin(np.arange(FRAMES * rate // 16) / 10).astype(np.float32)
    pieces = await streamed_pieces(audio_waveforms=[wave], audio_sample_rate=rate, keyframe_interval=8)
    audio_only = [piece for piece in pieces[:-1] if not piece.frames]
    assert audio_only and all(not piece.keyframe and piece.duration == 0 for piece in audio_only)
    assert [piece.duration for piece in pieces] == [Fraction(piece.frames, 16) for piece in pieces]
    assert sum(piece.duration for piece in pieces) == Fraction(FRAMES, 16)
    keyframes = keyframes_of(joined(pieces))
    video = [piece for piece in pieces if piece.frames]
    assert [piece.keyframe for piece in video] == [start in keyframes for start in first_frames(video)]
    assert box_types(pieces[0].data[: pieces[0].init_size]) == [b"ftyp", b"moov"]


async def test_read_entries_yields_every_entrys_pieces_with_pieces_true() -> None:
    chunks = [moving_pattern(start, 4, batch=2, height=32, width=32) for start in range(0, 12, 4)]
    got: dict[int, list[MP4Piece]] = {0: [], 1: []}
    with anyio.fail_after(HANG_GUARD):
        async with ChunkedVideoMP4Session(**FRAGMENTED) as session:
            streams = [session.open_stream(0), session.open_stream(1)]

            async def produce() -> None:
                for chunk in chunks:
                    await session.push(chunk)
                await session.finish()

            session.start_producer(produce)
            async for entry, piece in read_entries(streams, pieces=True):
                assert isinstance(piece, MP4Piece)
                got[entry].append(piece)
    for pieces in got.values():
        video = read_mp4(joined(pieces))
        assert video.frames.shape[0] == sum(piece.frames for piece in pieces) == 12
        assert pieces[-1].frames_until == 12
    assert joined(got[0]) != joined(got[1])  # each entry its own video


async def test_read_entries_checks_its_pieces_argument() -> None:
    async with ChunkedVideoMP4Session(**FRAGMENTED) as session:
        stream = session.open_stream(0)
        with pytest.raises(ValueError, match="read_entries: pieces must be True or False, got 1"):
            async for _ in read_entries([stream], pieces=1):  # type: ignore[call-overload]
                pass
        session.abort()


async def test_pieces_and_bytes_share_the_one_reader_rule() -> None:
    with anyio.fail_after(HANG_GUARD):
        async with ChunkedVideoMP4Session(**FRAGMENTED) as session:
            stream = session.open_stream(0)
            got: list[MP4Piece] = []

            async def read_pieces() -> None:
                async for piece in stream.pieces():
                    got.append(piece)

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(read_pieces)
                await anyio.wait_all_tasks_blocked()  # the pieces reader waits for the first piece
                with pytest.raises(anyio.BusyResourceError):
                    await anext(stream)
                for chunk in CHUNKS:
                    await session.push(chunk)
                await session.finish()
    assert sum(piece.frames for piece in got) == FRAMES


# -- the cutter itself --


def box(kind: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">I4s", 8 + len(body), kind) + body


def large_box(kind: bytes, body: bytes) -> bytes:
    """A box with a 64-bit size (size field 1)."""
    return struct.pack(">I4sQ", 1, kind, 16 + len(body)) + body


def moof(samples: dict[int, int]) -> bytes:
    """A moof with one traf per track, each listing ``samples[track]`` samples in one trun."""
    trafs = b"".join(
        box(b"traf", box(b"tfhd", struct.pack(">II", 0, track)) + box(b"trun", struct.pack(">II", 0, count)))
        for track, count in samples.items()
    )
    return box(b"moof", box(b"mfhd", struct.pack(">II", 0, 1)) + trafs)


def test_the_cutter_cuts_after_each_mdat_and_counts_the_video_track_only() -> None:
    head = box(b"ftyp", b"isom") + box(b"moov", b"x" * 20)
    first = moof({1: 2, 2: 7}) + box(b"mdat", b"v" * 30)
    audio_only = moof({2: 5}) + large_box(b"mdat", b"a" * 10)
    second = moof({1: 3}) + box(b"mdat", b"w" * 5)
    data = head + first + audio_only + second + box(b"mfra", b"r")
    for step in (1, 3, len(data)):
        cutter = FragmentCutter()
        pieces = [p for start in range(0, len(data), step) for p in cutter.feed(data[start : start + step])]
        assert [p.data for p in pieces] == [head + first, audio_only, second]
        assert [(p.frames, p.frames_until) for p in pieces] == [(2, 2), (0, 2), (3, 5)]
        assert (cutter.samples, cutter.fragments) == (5, 3)
        assert cutter.rest() == MP4Piece(box(b"mfra", b"r"), 0, 5)
        assert cutter.rest() is None  # nothing is left twice


def test_a_box_that_runs_to_the_end_of_the_file_is_the_rest() -> None:
    cutter = FragmentCutter()
    assert cutter.feed(struct.pack(">I4s", 0, b"free") + b"tail") == []
    rest = cutter.rest()
    assert rest is not None and rest.data.endswith(b"tail") and rest.frames == 0


def test_a_box_smaller_than_its_header_is_no_mp4() -> None:
    cutter = FragmentCutter()
    cutter.feed(box(b"ftyp", b"isom"))
    with pytest.raises(
        ValueError, match="FragmentCutter.feed: the box at byte 12 of the file claims 4 bytes"
    ):
        cutter.feed(struct.pack(">I4s", 4, b"moof"))


NON_SYNC = 0x0001_0000  # sample_is_non_sync_sample in a sample's flags


def full_box(kind: bytes, version: int, flags: int, body: bytes) -> bytes:
    return box(kind, struct.pack(">I", version << 24 | flags) + body)


def track(track_id: int, timescale: int, version: int) -> bytes:
    """A trak with its tkhd and mdhd (both in ``version``'s layout: 64-bit times for 1)."""
    times = struct.pack(">QQ", 0, 0) if version else struct.pack(">II", 0, 0)
    tkhd = full_box(b"tkhd", version, 3, times + struct.pack(">I", track_id) + bytes(60))
    mdhd = full_box(b"mdhd", version, 0, times + struct.pack(">I", timescale) + bytes(8))
    return box(b"trak", tkhd + box(b"mdia", mdhd))


def trex(track_id: int, duration: int, flags: int) -> bytes:
    return full_box(b"trex", 0, 0, struct.pack(">IIIII", track_id, 1, duration, 0, flags))


def traf(track_id: int, runs: Sequence[bytes], tfhd_flags: int = 0, defaults: bytes = b"") -> bytes:
    tfhd = full_box(b"tfhd", 0, tfhd_flags, struct.pack(">I", track_id) + defaults)
    return box(b"traf", tfhd + b"".join(runs))


def trun(flags: int, count: int, fields: bytes = b"") -> bytes:
    return full_box(b"trun", 0, flags, struct.pack(">I", count) + fields)


def test_the_cutter_reads_keyframes_and_durations_from_the_moov_defaults_tfhd_and_trun() -> None:
    moov = box(
        b"moov",
        track(1, 16_000, version=1)
        + track(2, 44_100, version=0)
        + box(b"mvex", trex(1, 1000, NON_SYNC) + trex(2, 1024, 0)),
    )
    head = box(b"ftyp", b"isom") + moov
    audio = traf(2, [trun(0, 9)])  # 9 samples of 1024 ticks at 44.1 kHz: no frames, no duration
    # the trex's defaults: 1000 ticks a sample, not sync; the trun's first-sample flags make the first sync
    by_trex = box(b"moof", traf(1, [trun(0x005, 3, struct.pack(">iI", 0, 0))]) + audio)
    # the tfhd's defaults (0x08 duration, 0x20 flags) over the trex's: 500 ticks, not sync
    by_tfhd = box(b"moof", traf(1, [trun(0, 2)], 0x28, struct.pack(">II", 500, NON_SYNC)))
    # per-sample duration, size and flags (0x100, 0x200, 0x400) in two runs: the first run's first sample
    samples = struct.pack(">9I", 100, 1, 0, 200, 1, NON_SYNC, 300, 1, NON_SYNC)
    by_trun = box(b"moof", traf(1, [trun(0x701, 3, struct.pack(">i", 0) + samples), trun(0, 1)]) + audio)
    fragments = [moof + box(b"mdat", b"m") for moof in (by_trex, by_tfhd, by_trun)]
    data = head + b"".join(fragments) + box(b"mfra")
    for step in (1, 7, len(data)):
        cutter = FragmentCutter()
        pieces = [p for start in range(0, len(data), step) for p in cutter.feed(data[start : start + step])]
        rest = cutter.rest()
        assert rest is not None
        assert [p.frames for p in pieces] == [3, 2, 4]
        assert [p.keyframe for p in pieces] == [True, False, True]
        ticks = [3 * 1000, 2 * 500, 100 + 200 + 300 + 1000]  # the second run: the trex's duration
        assert [p.duration for p in pieces] == [Fraction(t, 16_000) for t in ticks]
        assert [p.init_size for p in pieces] == [len(head), 0, 0]
        assert pieces[0].data[len(head) :] == fragments[0]
        assert (rest.frames, rest.keyframe, rest.duration, rest.init_size) == (0, False, 0, 0)


def test_a_run_without_first_sample_flags_takes_its_first_samples_own() -> None:
    moov = box(b"moov", track(1, 90_000, version=0) + box(b"mvex", trex(1, 3000, 0)))
    flags_only = struct.pack(">II", NON_SYNC, 0)  # 0x400: each sample's flags; the first is not sync
    moof = box(b"moof", traf(1, [trun(0x400, 2, flags_only)]))
    cutter = FragmentCutter()
    (piece,) = cutter.feed(box(b"ftyp") + moov + moof + box(b"mdat"))
    assert (piece.frames, piece.keyframe, piece.duration) == (2, False, Fraction(6000, 90_000))


def test_the_box_reader_takes_compact_64_bit_and_to_the_end_sizes() -> None:
    compact = struct.pack(">I4s", 12, b"free") + b"abcd"
    large = struct.pack(">I4sQ", 1, b"mdat", 20) + b"wxyz"
    last = struct.pack(">I4s", 0, b"mdat") + b"rest"
    data = compact + large + last
    assert file_boxes(io.BytesIO(data)) == [(b"free", 0, 12), (b"mdat", 12, 20), (b"mdat", 32, 12)]
    # Within a span, a box of size 0 (or one past the span's end) is no whole box: the list stops there.
    assert box_children(data, 0, len(data)) == [(b"free", (8, 12)), (b"mdat", (28, 32))]
    assert box_children(data, 0, 31) == [(b"free", (8, 12))]
