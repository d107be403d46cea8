"""A playlist checker: the rules Apple's player enforces, applied to every HLS media playlist a test receives.

:func:`check_playlist` parses one playlist, fails (``AssertionError``) on the first broken rule, and returns
what it read, so that the next reload of the same video is checked against it (``previous=``). Written from
draft-pantos-hls-rfc8216bis and Apple's "Enabling Low-Latency HLS", independently of the server's writer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal

__all__ = ["ListedPart", "ListedSegment", "Playlist", "check_playlist"]


@dataclass(frozen=True)
class ListedPart:
    duration: Decimal
    uri: str
    independent: bool


@dataclass(frozen=True)
class ListedSegment:
    #: media sequence number
    sequence: int
    duration: Decimal
    uri: str
    #: the parts listed before its EXTINF (none once they left the playlist)
    parts: tuple[ListedPart, ...]


@dataclass
class Playlist:
    """What a media playlist says."""

    version: int | None = None
    target_duration: int | None = None
    part_target: Decimal | None = None
    part_hold_back: Decimal | None = None
    can_block_reload: bool = False
    media_sequence: int | None = None
    playlist_type: str | None = None
    independent_segments: bool = False
    map_uri: str | None = None
    segments: list[ListedSegment] = field(default_factory=list)
    #: the parts of the segment being written (after the last EXTINF)
    open_parts: list[ListedPart] = field(default_factory=list)
    #: the URI of EXT-X-PRELOAD-HINT's part, if any
    hint: str | None = None
    ended: bool = False

    @property
    def parts(self) -> list[ListedPart]:
        """Every part listed, in order."""
        return [part for segment in self.segments for part in segment.parts] + self.open_parts


def _attributes(text: str) -> dict[str, str]:
    """An attribute list (``A=1,B="x,y"``) as a dict, quotes removed."""
    pairs = re.findall(r'([A-Z0-9-]+)=("[^"]*"|[^,]*)', text)
    return {name: value.strip('"') for name, value in pairs}


def _parse(text: str) -> Playlist:
    lines = text.splitlines()
    assert lines and lines[0] == "#EXTM3U", f"a playlist starts with #EXTM3U, got {lines[:1]}"
    playlist = Playlist()
    pending: list[ListedPart] = []
    duration: Decimal | None = None
    hints = 0
    for number, line in enumerate(lines[1:], start=2):
        assert not playlist.ended, f"line {number} comes after EXT-X-ENDLIST: {line!r}"
        tag, _, value = line.partition(":")
        if not line:
            continue
        if not line.startswith("#"):
            assert duration is not None, f"line {number}: the URI {line!r} has no EXTINF before it"
            assert playlist.media_sequence is not None, "EXT-X-MEDIA-SEQUENCE comes before the first segment"
            sequence = playlist.media_sequence + len(playlist.segments)
            playlist.segments.append(ListedSegment(sequence, duration, line, tuple(pending)))
            pending, duration = [], None
        elif tag == "#EXT-X-VERSION":
            playlist.version = int(value)
        elif tag == "#EXT-X-TARGETDURATION":
            playlist.target_duration = int(value)
        elif tag == "#EXT-X-PART-INF":
            playlist.part_target = Decimal(_attributes(value)["PART-TARGET"])
        elif tag == "#EXT-X-SERVER-CONTROL":
            control = _attributes(value)
            playlist.can_block_reload = control.get("CAN-BLOCK-RELOAD") == "YES"
            if "PART-HOLD-BACK" in control:
                playlist.part_hold_back = Decimal(control["PART-HOLD-BACK"])
        elif tag == "#EXT-X-MEDIA-SEQUENCE":
            assert not playlist.segments and not pending, "EXT-X-MEDIA-SEQUENCE comes before any segment"
            playlist.media_sequence = int(value)
        elif tag == "#EXT-X-PLAYLIST-TYPE":
            playlist.playlist_type = value
        elif line == "#EXT-X-INDEPENDENT-SEGMENTS":
            playlist.independent_segments = True
        elif tag == "#EXT-X-MAP":
            playlist.map_uri = _attributes(value)["URI"]
        elif tag == "#EXT-X-PART":
            part = _attributes(value)
            independent = part.get("INDEPENDENT") == "YES"
            pending.append(ListedPart(Decimal(part["DURATION"]), part["URI"], independent))
        elif tag == "#EXTINF":
            assert duration is None, f"line {number}: two EXTINF without a URI between them"
            duration = Decimal(value.split(",")[0])
        elif tag == "#EXT-X-PRELOAD-HINT":
            hint = _attributes(value)
            assert hint.get("TYPE") == "PART", f"line {number}: a preload hint of type {hint.get('TYPE')}"
            playlist.hint = hint["URI"]
            hints += 1
        elif line == "#EXT-X-ENDLIST":
            playlist.ended = True
        else:
            raise AssertionError(f"line {number}: a tag this checker does not know: {line!r}")
    assert duration is None, "the last EXTINF has no URI"
    assert hints <= 1, f"{hints} preload hints: at most one"
    playlist.open_parts = pending
    return playlist


def _check_media(playlist: Playlist) -> None:
    assert playlist.version is not None, "no EXT-X-VERSION"
    assert playlist.target_duration is not None, "no EXT-X-TARGETDURATION"
    assert playlist.media_sequence is not None, "no EXT-X-MEDIA-SEQUENCE"
    assert playlist.map_uri is not None and playlist.map_uri.endswith(".mp4"), (
        f"the init segment (EXT-X-MAP) must be a .mp4 URI, got {playlist.map_uri!r}"
    )
    assert playlist.version >= 6, f"EXT-X-MAP needs EXT-X-VERSION 6 or more, got {playlist.version}"
    for segment in playlist.segments:
        assert segment.uri.endswith(".m4s"), f"segment {segment.sequence}'s URI {segment.uri!r} is not .m4s"
        rounded = int(segment.duration.to_integral_value(rounding="ROUND_HALF_UP"))
        assert rounded <= playlist.target_duration, (
            f"segment {segment.sequence} lasts {segment.duration} s, more than the target duration "
            f"{playlist.target_duration} s once rounded"
        )
    uris = [segment.uri for segment in playlist.segments]
    assert len(set(uris)) == len(uris), "two segments share a URI"


def _check_parts(playlist: Playlist) -> None:
    parts = playlist.parts
    if not parts and playlist.part_target is None:
        return
    target, hold_back = playlist.part_target, playlist.part_hold_back
    assert target is not None, "parts are listed without EXT-X-PART-INF"
    assert playlist.can_block_reload, "a low-latency playlist says CAN-BLOCK-RELOAD=YES"
    assert hold_back is not None, "no PART-HOLD-BACK in EXT-X-SERVER-CONTROL"
    assert hold_back >= 3 * target, f"PART-HOLD-BACK {hold_back} is under 3 × PART-TARGET {target}"
    for part in parts:
        assert part.duration <= target, (
            f"part {part.uri} lasts {part.duration} s, more than PART-TARGET {target}"
        )
        assert part.uri.endswith(".m4s"), f"part URI {part.uri!r} is not .m4s"
    uris = [part.uri for part in parts]
    assert len(set(uris)) == len(uris), "two parts share a URI"
    listed = [segment for segment in playlist.segments if segment.parts]
    once_listed = False
    for segment in playlist.segments:
        assert segment.parts or not once_listed, (
            f"segment {segment.sequence} lists no parts after one that does: only old parts may leave"
        )
        once_listed = once_listed or bool(segment.parts)
    for segment in listed:
        assert segment.parts[0].independent, (
            f"segment {segment.sequence} does not start with an INDEPENDENT part"
        )
        total = sum((part.duration for part in segment.parts), Decimal(0))
        # Each duration is written rounded to the writer's precision: allow one unit of it per value.
        slack = Decimal("0.00001") * (len(segment.parts) + 1)
        assert abs(total - segment.duration) <= slack, (
            f"segment {segment.sequence}'s parts last {total} s, its EXTINF says {segment.duration} s"
        )
    if playlist.open_parts:
        assert playlist.open_parts[0].independent, "the segment being written does not start INDEPENDENT"


def _check_end(playlist: Playlist) -> None:
    if playlist.ended:
        assert playlist.hint is None, "a preload hint after EXT-X-ENDLIST"
        assert not playlist.open_parts, "parts of an unfinished segment after EXT-X-ENDLIST"
        return
    assert playlist.playlist_type != "VOD", "a VOD playlist ends with EXT-X-ENDLIST"
    if playlist.part_target is not None:
        assert playlist.hint is not None, "a live low-latency playlist has one preload hint"
    if playlist.hint is not None:
        assert playlist.hint.endswith(".m4s"), f"the preload hint {playlist.hint!r} is not .m4s"
        assert playlist.hint not in {part.uri for part in playlist.parts}, (
            "the preload hint is already listed"
        )


def _check_reload(playlist: Playlist, previous: Playlist) -> None:
    for name in ("target_duration", "part_target", "part_hold_back"):
        before, now = getattr(previous, name), getattr(playlist, name)
        assert before == now, f"{name} changed between reloads: {before} then {now}"
    assert playlist.media_sequence is not None and previous.media_sequence is not None
    assert playlist.media_sequence >= previous.media_sequence, "EXT-X-MEDIA-SEQUENCE went back"
    assert not (previous.ended and not playlist.ended), "EXT-X-ENDLIST went away"
    now = {segment.sequence: segment for segment in playlist.segments}
    for before in previous.segments:
        if before.sequence < playlist.media_sequence:
            continue
        after = now.get(before.sequence)
        assert after is not None, f"segment {before.sequence} left the playlist on reload"
        assert (after.uri, after.duration) == (before.uri, before.duration), (
            f"segment {before.sequence} changed on reload: {before.uri} {before.duration} s, "
            f"then {after.uri} {after.duration} s"
        )
    durations = {part.uri: part.duration for part in playlist.parts}
    for part in previous.parts:
        if part.uri in durations:
            assert durations[part.uri] == part.duration, f"part {part.uri} changed its duration on reload"


def check_playlist(text: str, *, previous: Playlist | None = None) -> Playlist:
    """``text`` parsed, after checking every rule; ``previous``: the same video's playlist loaded before."""
    playlist = _parse(text)
    _check_media(playlist)
    _check_parts(playlist)
    _check_end(playlist)
    if previous is not None:
        _check_reload(playlist, previous)
    return playlist
