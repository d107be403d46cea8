"""Low-Latency HLS playlists, blocking reload and recordings (``server/_hls.py``): the exact text for
hand-made parts, every playlist of a growing generation through the checker of tests/_hls.py (and the
checker refusing each broken rule), and a recording of real pieces that FFmpeg's HLS reader plays to the
last frame."""

from __future__ import annotations

import errno
import os
import resource
import signal
from collections.abc import Iterator, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import anyio
import av
import pytest

from streamvae.server._broadcast import Part
from streamvae.server._hls import (
    INIT_URI,
    BlockingRequest,
    HLSPart,
    HLSTiming,
    check_reachable,
    hls_timing,
    live_playlist,
    parse_blocking_reload,
    part_uri,
    satisfied,
    segments,
    vod_playlist,
    write_recording,
)
from tests._hls import Playlist, check_playlist
from tests._media import DETERMINISTIC_X264, count_frames, wan_like_chunks, written_pieces

TIMING = hls_timing(16, 4, 8)  # parts of 1/4 s, a keyframe every other part
INIT = b"ftyp+moov"


def made(pattern: str, *, frames: int = 4, fps: int = 16) -> list[Part]:
    """Parts of ``frames`` frames each: ``K`` starts with a keyframe, ``.`` does not, ``0`` has no frames
    (the trailing mfra)."""
    return [
        Part(
            index,
            f"<p{index}>".encode(),
            0 if kind == "0" else frames,
            kind == "K",
            Fraction(0) if kind == "0" else Fraction(frames, fps),
            start=Fraction(index * frames, fps),
        )
        for index, kind in enumerate(pattern)
    ]


HEADER = """\
#EXTM3U
#EXT-X-VERSION:9
#EXT-X-TARGETDURATION:1
#EXT-X-PART-INF:PART-TARGET=0.25
#EXT-X-SERVER-CONTROL:CAN-BLOCK-RELOAD=YES,PART-HOLD-BACK=0.75
#EXT-X-MEDIA-SEQUENCE:0
#EXT-X-INDEPENDENT-SEGMENTS
#EXT-X-MAP:URI="init.mp4"
#EXT-X-PART:DURATION=0.25,URI="p0.m4s",INDEPENDENT=YES
#EXT-X-PART:DURATION=0.25,URI="p1.m4s"
#EXTINF:0.5,
s0.m4s
#EXT-X-PART:DURATION=0.25,URI="p2.m4s",INDEPENDENT=YES
#EXT-X-PART:DURATION=0.25,URI="p3.m4s"
#EXTINF:0.5,
s1.m4s
#EXT-X-PART:DURATION=0.25,URI="p4.m4s",INDEPENDENT=YES
"""
LIVE = HEADER + '#EXT-X-PRELOAD-HINT:TYPE=PART,URI="p5.m4s"\n'
ENDED = HEADER + "#EXTINF:0.25,\ns2.m4s\n#EXT-X-ENDLIST\n"


# ---------------------------------------------------------------------------------------------------------
# Timing and playlists of hand-made parts
# ---------------------------------------------------------------------------------------------------------


def test_timing_holds_every_part_and_the_longest_segment() -> None:
    assert HLSTiming(part_target=Fraction(1, 4), target_duration=1, part_hold_back=Fraction(3, 4)) == TIMING
    # Keyframes every 5 frames meet parts of 4 frames every 20: segments of 20/8 s, 2.5 → 3 s.
    assert hls_timing(8, 4, 5).target_duration == 3
    assert hls_timing(Fraction(30000, 1001), 3, 30).part_target == Fraction(3003, 30000)


@pytest.mark.parametrize(
    ("arguments", "named"),
    [((0, 4, 8), "fps"), ((16, 0, 8), "frames_per_part"), ((16, 4, 2.5), "keyframe_interval")],
)
def test_timing_refuses_a_bad_value_naming_it(arguments: tuple[Any, Any, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        hls_timing(*arguments)


def test_the_live_playlist_lists_each_part_each_complete_segment_and_the_next_part() -> None:
    assert live_playlist(INIT_URI, made("K.K.K"), "live", TIMING) == LIVE


def test_the_ended_playlist_completes_the_last_segment_and_ends_without_a_hint() -> None:
    parts = made("K.K.K0")  # the trailing mfra is no part
    assert live_playlist(INIT_URI, parts, "ended", TIMING) == ENDED
    assert live_playlist(INIT_URI, parts, "failed", TIMING) == ENDED


def test_the_replay_playlist_lists_whole_segments_only() -> None:
    assert vod_playlist(INIT_URI, made("K.K.K0"), TIMING) == (
        "#EXTM3U\n#EXT-X-VERSION:6\n#EXT-X-TARGETDURATION:1\n#EXT-X-PLAYLIST-TYPE:VOD\n"
        '#EXT-X-MEDIA-SEQUENCE:0\n#EXT-X-INDEPENDENT-SEGMENTS\n#EXT-X-MAP:URI="init.mp4"\n'
        "#EXTINF:0.5,\ns0.m4s\n#EXTINF:0.5,\ns1.m4s\n#EXTINF:0.25,\ns2.m4s\n#EXT-X-ENDLIST\n"
    )


def test_a_playlist_before_the_first_part_hints_part_0() -> None:
    playlist = check_playlist(live_playlist(INIT_URI, [], "live", TIMING))
    assert (playlist.segments, playlist.parts, playlist.hint) == ([], [], "p0.m4s")


def test_a_segment_is_its_parts_bytes_from_a_keyframe_to_the_next() -> None:
    cut = segments(made("K..KK.0"), "live")
    assert [(segment.sequence, segment.complete, segment.data) for segment in cut] == [
        (0, True, b"<p0><p1><p2>"),
        (1, True, b"<p3>"),
        (2, False, b"<p4><p5>"),
    ]
    assert segments(made("K..KK.0"), "ended")[-1].complete


def test_a_part_longer_than_the_part_target_is_refused_not_listed() -> None:
    with pytest.raises(ValueError, match="part 1 lasts 0.3125 s, more than the part target"):
        live_playlist(
            INIT_URI, [*made("K"), Part(1, b"", 5, False, Fraction(5, 16), Fraction(1, 4))], "live", TIMING
        )


def test_a_segment_longer_than_the_target_duration_is_refused_not_listed() -> None:
    with pytest.raises(ValueError, match="segment 0 lasts 1.75 s, more than the target duration 1 s"):
        live_playlist(INIT_URI, made("K......K"), "live", TIMING)


def test_parts_that_do_not_start_at_part_0_are_refused() -> None:
    with pytest.raises(ValueError, match="parts must start at part 0"):
        live_playlist(INIT_URI, made("K.K.")[2:], "live", TIMING)


# ---------------------------------------------------------------------------------------------------------
# Every playlist of a growing generation
# ---------------------------------------------------------------------------------------------------------


def grown(parts: Sequence[Part], timing: HLSTiming) -> Iterator[Playlist]:
    """The checked playlist after each part is written, then after the end, each against the one before."""
    previous: Playlist | None = None
    with_frames = [part for part in parts if part.frames]  # a broadcast lists the trailing mfra in no part
    for written in range(len(with_frames) + 1):
        text = live_playlist(INIT_URI, with_frames[:written], "live", timing)
        previous = check_playlist(text, previous=previous)
        assert previous.hint == part_uri(written)
        yield previous
    yield check_playlist(live_playlist(INIT_URI, parts, "ended", timing), previous=previous)


def test_every_playlist_of_a_growing_generation_keeps_apples_rules() -> None:
    parts = made("K." * 15 + "KK." + "K." * 5 + "K0")  # 44 parts, 11 s; an extra keyframe (a scene cut)
    *live, ended = grown(parts, TIMING)
    assert [len(playlist.parts) for playlist in live[:6]] == [0, 1, 2, 3, 4, 5]
    assert ended.ended and ended.hint is None
    assert [segment.uri for segment in ended.segments] == [f"s{sequence}.m4s" for sequence in range(23)]
    # Only the parts of segments that end in the last three target durations (from 8 s) stay: p31 on.
    assert [part.uri for part in ended.parts] == [part_uri(index) for index in range(31, 44)]
    assert ended.segments[0].parts == ()


# ---------------------------------------------------------------------------------------------------------
# The checker refuses each broken rule
# ---------------------------------------------------------------------------------------------------------


def swapped(old: str, new: str, text: str = LIVE) -> str:
    assert old in text
    return text.replace(old, new, 1)


BROKEN: dict[str, tuple[str, str | None, str]] = {
    # rule: (the playlist, the one loaded before it, what the checker says)
    "part longer than PART-TARGET": (
        swapped('DURATION=0.25,URI="p3', 'DURATION=0.3,URI="p3'),
        None,
        "more than PART-TARGET",
    ),
    "hold back under 3 part targets": (swapped("PART-HOLD-BACK=0.75", "PART-HOLD-BACK=0.5"), None, "under 3"),
    "target duration changed": (
        swapped("TARGETDURATION:1", "TARGETDURATION:2"),
        LIVE,
        "target_duration changed",
    ),
    "part target changed": (
        swapped("PART-TARGET=0.25", "PART-TARGET=0.3", swapped("BACK=0.75", "BACK=0.9")),
        LIVE,
        "part_target changed",
    ),
    "hold back changed": (swapped("PART-HOLD-BACK=0.75", "PART-HOLD-BACK=1"), LIVE, "part_hold_back changed"),
    "segment not starting independent": (
        swapped('URI="p2.m4s",INDEPENDENT=YES', 'URI="p2.m4s"'),
        None,
        "segment 1 does not start with an INDEPENDENT part",
    ),
    "EXTINF over the target": (swapped("#EXTINF:0.5,\ns1", "#EXTINF:1.5,\ns1"), None, "more than the target"),
    "parts not summing to EXTINF": (swapped("#EXTINF:0.5,\ns1", "#EXTINF:0.45,\ns1"), None, "EXTINF says"),
    "no hint while live": (
        swapped('#EXT-X-PRELOAD-HINT:TYPE=PART,URI="p5.m4s"\n', ""),
        None,
        "one preload hint",
    ),
    "two hints": (LIVE + '#EXT-X-PRELOAD-HINT:TYPE=PART,URI="p6.m4s"\n', None, "2 preload hints"),
    "hint after the end": (LIVE + "#EXT-X-ENDLIST\n", None, "preload hint after EXT-X-ENDLIST"),
    "segment URI not .m4s": (swapped("s1.m4s", "s1.mp4"), None, "is not .m4s"),
    "part URI not .m4s": (swapped("p3.m4s", "p3.ts"), None, "is not .m4s"),
    "init not .mp4": (swapped('URI="init.mp4"', 'URI="init.m4s"'), None, "must be a .mp4"),
    "segment renumbered on reload": (swapped("\ns0.m4s", "\ns9.m4s"), LIVE, "segment 0 changed on reload"),
    "media sequence going back": (
        LIVE,
        swapped("MEDIA-SEQUENCE:0", "MEDIA-SEQUENCE:1"),
        "EXT-X-MEDIA-SEQUENCE went back",
    ),
    "end taken back": (LIVE, ENDED, "EXT-X-ENDLIST went away"),
}


@pytest.mark.parametrize("rule", list(BROKEN))
def test_the_checker_refuses_a_playlist_that_breaks_a_rule(rule: str) -> None:
    text, before, message = BROKEN[rule]
    previous = None if before is None else check_playlist(before)
    with pytest.raises(AssertionError, match=message):
        check_playlist(text, previous=previous)


def test_the_checker_accepts_the_playlists_it_is_shown_broken_against() -> None:
    assert not check_playlist(LIVE).ended
    assert check_playlist(ENDED, previous=check_playlist(LIVE)).ended


# ---------------------------------------------------------------------------------------------------------
# Blocking reload
# ---------------------------------------------------------------------------------------------------------


def test_a_blocking_reload_asks_for_a_part_or_a_whole_segment() -> None:
    assert parse_blocking_reload({}) is None
    assert parse_blocking_reload({"other": "1"}) is None
    assert parse_blocking_reload({"_HLS_msn": "3"}) == BlockingRequest(3, None)
    assert parse_blocking_reload({"_HLS_msn": "3", "_HLS_part": "0"}) == BlockingRequest(3, 0)


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"_HLS_part": "1"}, "_HLS_part needs _HLS_msn"),
        ({"_HLS_msn": "one"}, "_HLS_msn must be a non-negative integer, got 'one'"),
        ({"_HLS_msn": "-1"}, "_HLS_msn must be a non-negative integer"),
        ({"_HLS_msn": "1", "_HLS_part": "1.5"}, "_HLS_part must be a non-negative integer"),
        ({"_HLS_msn": ""}, "_HLS_msn must be a non-negative integer"),
    ],
)
def test_a_malformed_blocking_reload_is_refused(query: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_blocking_reload(query)


@pytest.mark.parametrize(
    ("msn", "part", "message"),
    [
        (5, None, "more than two segments after the newest one \\(2\\)"),
        (5, 0, "more than two segments"),
        (2, 13, "more than 12 parts after the newest part"),  # 3 s of parts of 1/4 s
        (3, 12, "more than 12 parts"),
    ],
)
def test_a_blocking_reload_too_far_in_the_future_is_refused(msn: int, part: int | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_reachable(BlockingRequest(msn, part), made("K.K.K"), TIMING)


@pytest.mark.parametrize(("msn", "part"), [(4, None), (4, 0), (2, 12), (3, 11), (0, 0)])
def test_a_blocking_reload_within_reach_is_held(msn: int, part: int | None) -> None:
    check_reachable(BlockingRequest(msn, part), made("K.K.K"), TIMING)


def test_a_held_reload_is_answered_by_the_part_asked_for_or_anything_later() -> None:
    parts = made("K.K.K.K")

    def first_answered(request: BlockingRequest) -> int:
        """How many parts are written when the playlist first answers ``request``."""
        return next(n for n in range(len(parts) + 1) if satisfied(request, parts[:n], "live"))

    assert first_answered(BlockingRequest(1, 0)) == 3  # p2 starts segment 1
    assert first_answered(BlockingRequest(1, 1)) == 4
    assert first_answered(BlockingRequest(1, 5)) == 5  # segment 1 has two parts: segment 2 answers it
    assert first_answered(BlockingRequest(1, None)) == 5  # segment 1 is complete once p4 exists
    assert satisfied(BlockingRequest(9, 0), parts, "ended")
    assert satisfied(BlockingRequest(9, None), parts[:1], "failed")


# ---------------------------------------------------------------------------------------------------------
# Recordings
# ---------------------------------------------------------------------------------------------------------


def recorded(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


def test_a_recording_is_the_mp4_the_replay_playlist_and_its_segments(tmp_path: Path) -> None:
    parts = made("K.K.K0")
    folder = write_recording(tmp_path / "recordings", "v1", INIT, parts, b"the whole mp4", TIMING)
    assert folder == tmp_path / "recordings" / "v1"
    files = recorded(folder)
    assert files == {
        "index.m3u8": vod_playlist(INIT_URI, parts, TIMING).encode(),
        "init.mp4": INIT,
        "s0.m4s": b"<p0><p1>",
        "s1.m4s": b"<p2><p3>",
        "s2.m4s": b"<p4>",
        "video.mp4": b"the whole mp4",
    }
    playlist = check_playlist(files["index.m3u8"].decode())
    assert playlist.playlist_type == "VOD" and playlist.parts == []
    assert os.listdir(tmp_path / "recordings") == ["v1"]


def test_a_recording_replaces_one_of_the_same_id_whole(tmp_path: Path) -> None:
    write_recording(tmp_path, "v1", INIT, made("K.K.K.K0"), b"old", TIMING)
    folder = write_recording(tmp_path, "v1", INIT, made("K0"), b"new", TIMING)
    assert recorded(folder).keys() == {"index.m3u8", "init.mp4", "s0.m4s", "video.mp4"}
    assert os.listdir(tmp_path) == ["v1"]


class Unreadable:
    """A part whose bytes cannot be read: the recording fails after some files were written."""

    def __init__(self, index: int) -> None:
        self.index, self.frames, self.keyframe, self.duration = index, 4, True, Fraction(1, 4)

    @property
    def data(self) -> bytes:
        raise OSError(errno.EIO, "the part's bytes are gone")


def test_a_recording_that_fails_midway_leaves_the_old_one_and_nothing_else(tmp_path: Path) -> None:
    old = recorded(write_recording(tmp_path, "v1", INIT, made("K.K0"), b"old", TIMING))
    good = made("K.K.K.")
    broken: list[HLSPart] = [*good[:4], Unreadable(4), good[5]]
    with pytest.raises(OSError, match="the part's bytes are gone"):
        write_recording(tmp_path, "v1", INIT, broken, b"new", TIMING)
    assert os.listdir(tmp_path) == ["v1"]
    assert recorded(tmp_path / "v1") == old


def test_a_recording_that_outgrows_the_file_size_limit_leaves_the_old_one(tmp_path: Path) -> None:
    old = recorded(write_recording(tmp_path, "v1", INIT, made("K.K0"), b"old", TIMING))
    big = [Part(0, b"x" * 300_000, 4, True, Fraction(1, 4), Fraction(0))]
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of the signal that kills
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, limits[1]))
    try:
        with pytest.raises(OSError) as failure:
            write_recording(tmp_path, "v1", INIT, big, b"new", TIMING)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
    assert failure.value.errno == errno.EFBIG
    assert os.listdir(tmp_path) == ["v1"]
    assert recorded(tmp_path / "v1") == old


def test_a_recording_that_cannot_take_the_place_of_the_old_one_puts_it_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = recorded(write_recording(tmp_path, "v1", INIT, made("K.K0"), b"old", TIMING))
    rename = os.rename

    def refuse_the_new_recording(source: Any, destination: Any) -> None:
        if Path(source).name.endswith(".tmp"):  # the last step: the new recording into place
            raise OSError(errno.EIO, "the rename failed")
        rename(source, destination)

    monkeypatch.setattr(os, "rename", refuse_the_new_recording)
    with pytest.raises(OSError, match="the rename failed"):
        write_recording(tmp_path, "v1", INIT, made("K.K.K0"), b"new", TIMING)
    assert os.listdir(tmp_path) == ["v1"]
    assert recorded(tmp_path / "v1") == old


@pytest.mark.parametrize("video_id", ["", ".", "..", ".hidden", "a/b", "a\\b", "x" * 129, 7])
def test_a_recording_refuses_an_id_that_is_no_plain_folder_name(tmp_path: Path, video_id: Any) -> None:
    with pytest.raises(ValueError, match="video_id must be"):
        write_recording(tmp_path, video_id, INIT, made("K0"), b"", TIMING)
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------------------------------------------------
# Real pieces: FFmpeg's HLS reader plays the recording to the last frame
# ---------------------------------------------------------------------------------------------------------

FRAMES_PER_PART = 4
KEYFRAME_INTERVAL = 8
CHUNKS = wan_like_chunks(9, height=32, width=32)  # 33 frames: 1, then 4 a latent frame
FRAMES = sum(chunk.shape[2] for chunk in CHUNKS)


@pytest.mark.anyio
async def test_ffmpeg_plays_the_recording_of_real_pieces_to_the_last_frame(tmp_path: Path) -> None:
    pieces = await written_pieces(
        CHUNKS,
        value_range=(-1, 1),
        fps=16,
        output="fragmented",
        video_codec_options=DETERMINISTIC_X264,
        fragment_frames=FRAMES_PER_PART,
        keyframe_interval=KEYFRAME_INTERVAL,
    )
    init = pieces[0].data[: pieces[0].init_size]
    parts = [
        Part(
            index,
            piece.data[piece.init_size :],
            piece.frames,
            piece.keyframe,
            piece.duration,
            start=Fraction(piece.frames_until - piece.frames, 16),
        )
        for index, piece in enumerate(pieces)
    ]
    timing = hls_timing(16, FRAMES_PER_PART, KEYFRAME_INTERVAL)
    ended = list(grown(parts, timing))[-1]
    assert len(ended.segments) == -(-FRAMES // KEYFRAME_INTERVAL)  # a segment every keyframe interval
    mp4 = b"".join(piece.data for piece in pieces)
    folder = await anyio.to_thread.run_sync(write_recording, tmp_path, "real", init, parts, mp4, timing)
    assert count_frames(folder / "video.mp4") == FRAMES
    assert decoded_frames(folder / "index.m3u8") == FRAMES
    # The live playlist once ended, served from the same files plus its parts, plays the same frames.
    for part in parts:
        (folder / part_uri(part.index)).write_bytes(part.data)
    (folder / "live.m3u8").write_text(live_playlist(INIT_URI, parts, "ended", timing))
    assert decoded_frames(folder / "live.m3u8") == FRAMES


def decoded_frames(playlist: Path) -> int:
    """Frames FFmpeg's HLS reader decodes from ``playlist``, the first a keyframe."""
    with av.open(str(playlist)) as container:
        frames = [frame for packet in container.demux(video=0) for frame in packet.decode()]
    assert frames[0].key_frame
    return len(frames)
