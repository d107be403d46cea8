"""``Broadcast``: one generation's MP4 pieces, encoded once, read by any number of viewers. Checked against
real pieces from a session and against PyAV decoding what each viewer received."""

from __future__ import annotations

import contextlib
import gc
import io
import pickle
import weakref
from collections.abc import AsyncIterator, Sequence
from fractions import Fraction
from typing import Any

import anyio
import av
import numpy as np
import pytest

from streamvae import MP4Piece
from streamvae.server import Broadcast, BroadcastStatistics, ViewerCutOffError
from tests._media import DETERMINISTIC_X264, count_frames, wan_like_chunks, written_pieces

HANG_GUARD = 60  # seconds: turns a hang into a failure, never a speed check
KEYFRAME_INTERVAL = 4
CHUNKS = wan_like_chunks(5, height=32, width=32)  # 17 frames: 1, then 4 a latent frame
FRAMES = 17
OPTIONS: dict[str, Any] = {
    "value_range": (-1, 1),
    "fps": 16,
    "output": "fragmented",
    "fragment_frames": 1,
    "keyframe_interval": KEYFRAME_INTERVAL,
    "video_codec_options": DETERMINISTIC_X264,
}


@pytest.fixture(scope="module")
def pieces() -> list[MP4Piece]:
    written = anyio.run(lambda: written_pieces(CHUNKS, **OPTIONS))
    assert [piece.frames for piece in written] == [1] * FRAMES + [0]  # a frame a fragment, then the mfra
    return written


@pytest.fixture(scope="module")
def sound_pieces() -> list[MP4Piece]:
    rate = 16000
    wave = np.sin(np.arange(FRAMES * rate // 16) / 10).astype(np.float32)
    written = anyio.run(
        lambda: written_pieces(CHUNKS, **OPTIONS, audio_waveforms=[wave], audio_sample_rate=rate)
    )
    assert any(piece.frames == 0 for piece in written[:-1])  # fragments of sound alone between parts
    return written


def published(pieces: Sequence[MP4Piece], **options: Any) -> Broadcast:
    """A broadcast of ``options`` that ``pieces`` were published to."""
    broadcast = Broadcast(**options)
    for piece in pieces:
        broadcast.publish(piece)
    return broadcast


def mp4(pieces: Sequence[MP4Piece]) -> bytes:
    return b"".join(piece.data for piece in pieces)


def keyframes_decoded(data: bytes) -> tuple[int, bool]:
    """The frames PyAV decodes from ``data``, and whether the first is a keyframe."""
    with av.open(io.BytesIO(data)) as container:
        frames = list(container.decode(video=0))
    return len(frames), bool(frames and frames[0].key_frame)


async def read_all(viewer: AsyncIterator[bytes]) -> bytes:
    return b"".join([data async for data in viewer])


# ---- what a broadcast holds ----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_parts_are_the_fragments_with_frames_and_the_recording_is_every_piece(
    pieces: list[MP4Piece],
) -> None:
    broadcast = published(pieces)
    assert broadcast.state == "live" and broadcast.frames == FRAMES
    broadcast.end()
    assert broadcast.state == "ended"
    parts = broadcast.parts
    assert len(parts) == FRAMES  # the mfra is no part
    assert [part.index for part in parts] == list(range(FRAMES))
    assert [part.keyframe for part in parts] == [index % KEYFRAME_INTERVAL == 0 for index in range(FRAMES)]
    assert all(part.duration == Fraction(1, 16) for part in parts)
    assert [part.start for part in parts] == [Fraction(index, 16) for index in range(FRAMES)]
    assert broadcast.init == pieces[0].data[: pieces[0].init_size]
    assert broadcast.codecs == pieces[0].codecs and broadcast.codecs is not None
    assert (
        broadcast.mp4_bytes()
        == mp4(pieces)
        == broadcast.init + b"".join(p.data for p in parts) + pieces[-1].data
    )
    assert broadcast.size == len(mp4(pieces))
    assert count_frames(broadcast.mp4_bytes()) == FRAMES
    assert broadcast.next_part == FRAMES
    assert [broadcast.part(index) for index in range(FRAMES)] == list(parts)
    assert broadcast.part(FRAMES) is None and broadcast.part(-1) is None


@pytest.mark.anyio
async def test_a_fragment_of_sound_alone_travels_with_the_next_part(sound_pieces: list[MP4Piece]) -> None:
    broadcast = Broadcast()
    with anyio.fail_after(HANG_GUARD):
        async with contextlib.AsyncExitStack() as stack:
            viewers = []
            for piece in sound_pieces:
                broadcast.publish(piece)
                # one viewer from the start joins after each piece: never a fragment twice, or none
                viewers.append(await stack.enter_async_context(broadcast.viewer(live_edge=False)))
            broadcast.end()
            for viewer in viewers:
                assert await read_all(viewer) == mp4(sound_pieces)
    parts = broadcast.parts
    assert len(parts) == FRAMES and broadcast.frames == FRAMES
    last = max(index for index, piece in enumerate(sound_pieces) if piece.frames)
    after = mp4(sound_pieces[last + 1 :])  # sound alone at the end, and the mfra: no part
    assert (
        broadcast.mp4_bytes() == mp4(sound_pieces) == broadcast.init + b"".join(p.data for p in parts) + after
    )
    assert sum(part.duration for part in parts) == Fraction(FRAMES, 16)  # the sound counts in no duration


# ---- viewers ---------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_hundred_viewers_each_get_every_byte_from_the_keyframe_where_they_joined(
    pieces: list[MP4Piece],
) -> None:
    broadcast = Broadcast()
    received: list[tuple[int, bytes]] = []  # (the part each viewer started at, what it got)

    async def watch(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        async with broadcast.viewer() as viewer:
            parts = broadcast.parts
            start = max((part.index for part in parts if part.keyframe), default=0)
            task_status.started()
            received.append((start, await read_all(viewer)))

    with anyio.fail_after(HANG_GUARD):
        async with anyio.create_task_group() as group:
            for _ in range(10):  # viewers before the first piece
                await group.start(watch)
            for piece in pieces:
                broadcast.publish(piece)
                for _ in range(5):  # 18 pieces: 90 more
                    await group.start(watch)
                await anyio.lowlevel.checkpoint()  # the viewers read while the generation goes on
            broadcast.end()
    assert len(received) == 100
    expected: dict[int, bytes] = {}
    for start, data in received:
        if start not in expected:
            expected[start] = (
                broadcast.init + b"".join(p.data for p in broadcast.parts[start:]) + pieces[-1].data
            )
            frames, keyframe = keyframes_decoded(data)
            assert (frames, keyframe) == (FRAMES - start, True), start  # it plays from its join keyframe
        assert data == expected[start]
    assert sorted(expected) == [0, 4, 8, 12, 16]
    statistics = broadcast.statistics()
    assert statistics == BroadcastStatistics(
        viewers=0, viewers_ever=100, cut_off=0, bytes_served=sum(len(data) for _, data in received)
    )


@pytest.mark.anyio
async def test_a_late_joiner_starts_at_the_newest_keyframe_with_the_init_segment_first(
    pieces: list[MP4Piece],
) -> None:
    broadcast = Broadcast()
    for piece in pieces[:11]:  # parts 0..10: the newest keyframe is part 8
        broadcast.publish(piece)
    with anyio.fail_after(HANG_GUARD):
        async with broadcast.viewer() as viewer:
            iterator = aiter(viewer)
            assert await anext(iterator) == broadcast.init
            assert await anext(iterator) == broadcast.parts[8].data
            for piece in pieces[11:]:
                broadcast.publish(piece)
            broadcast.end()
            rest = await read_all(iterator)
    data = broadcast.init + broadcast.parts[8].data + rest
    assert data == broadcast.init + b"".join(part.data for part in broadcast.parts[8:]) + pieces[-1].data
    assert keyframes_decoded(data) == (FRAMES - 8, True)


@pytest.mark.anyio
async def test_a_viewer_from_the_start_of_a_live_generation_gets_the_mp4_byte_for_byte(
    pieces: list[MP4Piece],
) -> None:
    broadcast = published(pieces[:10])
    with anyio.fail_after(HANG_GUARD):
        async with broadcast.viewer(live_edge=False) as viewer, anyio.create_task_group() as group:
            got: list[bytes] = []

            async def read() -> None:
                got.append(await read_all(viewer))

            group.start_soon(read)
            for piece in pieces[10:]:
                broadcast.publish(piece)
                await anyio.lowlevel.checkpoint()
            broadcast.end()
    assert got == [mp4(pieces)]


@pytest.mark.anyio
async def test_a_replay_after_the_end_is_the_whole_mp4_byte_for_byte(pieces: list[MP4Piece]) -> None:
    broadcast = published(pieces)
    broadcast.end()
    broadcast.end()  # only the first call counts
    with anyio.fail_after(HANG_GUARD):
        for live_edge in (True, False):  # an ended generation plays from its start either way
            async with broadcast.viewer(live_edge=live_edge) as viewer:
                data = await read_all(viewer)
            assert data == mp4(pieces) == broadcast.mp4_bytes()
    assert count_frames(data) == FRAMES


@pytest.mark.anyio
async def test_a_viewer_that_reads_nothing_is_cut_off_without_slowing_anyone(pieces: list[MP4Piece]) -> None:
    broadcast = Broadcast(viewer_buffer=64)
    watched: list[bytes] = []
    with anyio.fail_after(HANG_GUARD):
        async with anyio.create_task_group() as group:
            idle = broadcast.viewer(buffer=3)
            idle_viewer = await idle.__aenter__()
            viewer_ref = weakref.ref(idle_viewer)

            async def watch(*, task_status: anyio.abc.TaskStatus[None]) -> None:
                async with broadcast.viewer() as viewer:
                    task_status.started()
                    watched.append(await read_all(viewer))

            await group.start(watch)
            for piece in pieces:  # publish never waits: these calls return whatever the idle viewer does
                broadcast.publish(piece)
            broadcast.end()
        # the 4th piece it left unread cut it off, while the generation and the other viewer went on
        assert broadcast.statistics().cut_off == 1
        with pytest.raises(ViewerCutOffError) as raised:
            await anext(aiter(idle_viewer))
        assert raised.value.buffer == 3 and "buffer of 3 pieces" in str(raised.value)
        copy = pickle.loads(pickle.dumps(raised.value))  # it crosses a process boundary whole
        assert (type(copy), copy.buffer, str(copy)) == (ViewerCutOffError, 3, str(raised.value))
        await idle.__aexit__(None, None, None)
    assert watched == [mp4(pieces)]  # the reading viewer got everything
    assert broadcast.statistics().viewers == 0
    del idle, idle_viewer, raised  # the traceback of the cut-off holds the viewer too
    gc.collect()
    assert viewer_ref() is None  # nothing of the viewer outlives its block


@pytest.mark.anyio
async def test_a_failed_generation_ends_each_viewer_with_its_error_after_the_last_bytes(
    pieces: list[MP4Piece],
) -> None:
    broadcast = published(pieces[:5])
    error = OSError("the encoder's disk is full")
    got: list[bytes] = []
    with anyio.fail_after(HANG_GUARD):
        async with broadcast.viewer(live_edge=False) as viewer:
            broadcast.end(error)
            broadcast.end()  # the first cause stays
            with pytest.raises(OSError) as raised:
                async for data in viewer:
                    got.append(data)
    assert raised.value is error and broadcast.state == "failed"
    assert b"".join(got) == mp4(pieces[:5])
    with pytest.raises(RuntimeError, match="has failed"):
        broadcast.publish(pieces[5])


# ---- waiting for a part ----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_wait_for_wakes_when_the_part_is_published_and_when_the_generation_ends(
    pieces: list[MP4Piece],
) -> None:
    broadcast = Broadcast()
    answers: dict[int, bool] = {}
    woke = {index: anyio.Event() for index in (3, 40)}

    async def wait(index: int) -> None:
        answers[index] = await broadcast.wait_for(index, timeout=HANG_GUARD)  # the hang guard, no deadline
        woke[index].set()

    with anyio.fail_after(HANG_GUARD):
        async with anyio.create_task_group() as group:
            group.start_soon(wait, 3)
            group.start_soon(wait, 40)
            for piece in pieces[:3]:
                broadcast.publish(piece)
                await anyio.lowlevel.checkpoint()
            assert not woke[3].is_set()  # parts 0..2 exist, not 3
            broadcast.publish(pieces[3])
            await woke[3].wait()
            assert answers == {3: True}
            broadcast.end()
    assert answers == {3: True, 40: False}  # the end woke it: part 40 will never be written
    assert await broadcast.wait_for(2, timeout=0) is True  # a part that exists, after the end too


@pytest.mark.anyio
async def test_wait_for_gives_up_after_its_timeout_and_a_cancelled_waiter_leaves_nothing(
    pieces: list[MP4Piece],
) -> None:
    broadcast = Broadcast()
    broadcast.publish(pieces[0])
    assert await broadcast.wait_for(1, timeout=0) is False
    with anyio.CancelScope() as scope:
        scope.cancel()
        await broadcast.wait_for(1, timeout=HANG_GUARD)
    assert scope.cancelled_caught
    broadcast.publish(pieces[1])  # the cancelled waiter is no longer woken: nothing of it is left
    assert await broadcast.wait_for(1, timeout=0) is True


# ---- the live window -------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_without_the_recording_only_the_live_window_from_a_keyframe_is_held(
    pieces: list[MP4Piece],
) -> None:
    broadcast = Broadcast(window=6, keep_recording=False)
    held = []
    for piece in pieces[:-1]:
        broadcast.publish(piece)
        parts = broadcast.parts
        held.append(parts[0].index)
        assert parts[0].keyframe  # what is held starts where a player can
        assert len(parts) >= min(6, parts[-1].index + 1)
        assert len(parts) < 6 + KEYFRAME_INTERVAL  # bounded: the window and at most one keyframe's worth
        assert broadcast.size == len(broadcast.init or b"") + sum(len(part.data) for part in parts)
    assert held[-1] == 8 and held[5] == 0  # part 16 is written: parts 8..16 are 9, parts 12..16 only 5
    with pytest.raises(RuntimeError, match="keep_recording=False"):
        broadcast.mp4_bytes()
    with anyio.fail_after(HANG_GUARD):
        async with broadcast.viewer(live_edge=False) as viewer:  # the oldest held part, a keyframe
            broadcast.end()
            data = await read_all(viewer)
    assert keyframes_decoded(data) == (FRAMES - 8, True)

    newest = Broadcast(keep_recording=False)  # no window: back to the newest keyframe only
    for piece in pieces[:11]:
        newest.publish(piece)
    assert [part.index for part in newest.parts] == [8, 9, 10]
    assert newest.next_part == 11 and newest.part(8) == newest.parts[0]
    assert newest.part(7) is None and newest.part(11) is None  # let go, and not written yet


# ---- bad arguments ---------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_bad_arguments_are_errors_that_name_them(pieces: list[MP4Piece]) -> None:
    for keywords, named in [
        ({"viewer_buffer": 0}, "viewer_buffer"),
        ({"viewer_buffer": 2.5}, "viewer_buffer"),
        ({"window": 0}, "window"),
        ({"keep_recording": "yes"}, "keep_recording"),
    ]:
        with pytest.raises(ValueError, match=f"Broadcast: {named} must"):
            Broadcast(**keywords)
    broadcast = Broadcast()
    with pytest.raises(ValueError, match="buffer must"):
        broadcast.viewer(buffer=0)
    with pytest.raises(ValueError, match="live_edge must"):
        broadcast.viewer(live_edge=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="part_index must"):
        await broadcast.wait_for(-1, timeout=1)
    with pytest.raises(ValueError, match="timeout must"):
        await broadcast.wait_for(0, timeout=-1)
    with pytest.raises(TypeError, match="piece must be a streamvae.MP4Piece"):
        broadcast.publish(pieces[0].data)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="the first piece must carry the init segment"):
        broadcast.publish(pieces[1])
    broadcast.publish(pieces[0])
    with pytest.raises(ValueError, match="only the first piece carries an init segment"):
        broadcast.publish(pieces[0])
    with pytest.raises(TypeError, match="error must be an exception"):
        broadcast.end("failed")  # type: ignore[arg-type]
