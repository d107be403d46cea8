"""Low-Latency HLS for one generation: its timing, its segments, its playlists, blocking reload, and its
recording for a static origin.

Pure functions over a generation's parts (its MP4 pieces after the init segment, one ``moof`` + ``mdat``
each): the routes call them with what the generation has written so far and serve what they return. They
follow draft-pantos-hls-rfc8216bis (HLS 2nd edition) and Apple's "Enabling Low-Latency HLS":

- one *part* (``EXT-X-PART``) per piece, ``p{index}.m4s``; a *segment* (``EXTINF``) starts at each part that
  starts with a keyframe and holds the parts up to the next one, ``s{sequence}.m4s``, numbered from 0;
- :class:`HLSTiming` is made once per video (:func:`hls_timing`), because Apple's player rejects a playlist
  whose ``TARGETDURATION``, ``PART-TARGET`` or ``PART-HOLD-BACK`` changed between reloads;
- every segment stays in the playlist (a replay starts at the first one); only the parts of segments older
  than three target durations are dropped, as the spec allows.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import secrets
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Literal, Protocol

from streamvae._checks import check_fps, check_int

__all__ = [
    "INIT_URI",
    "BlockingRequest",
    "GenerationState",
    "HLSPart",
    "HLSTiming",
    "Segment",
    "check_reachable",
    "hls_timing",
    "live_playlist",
    "parse_blocking_reload",
    "part_uri",
    "satisfied",
    "segment_uri",
    "segments",
    "vod_playlist",
    "write_recording",
]

GenerationState = Literal["live", "ended", "failed"]

#: the init segment's URI, relative to the playlist (ffmpeg's HLS reader wants a media extension)
INIT_URI = "init.mp4"
# EXT-X-MAP in a media playlist needs version 6; LL-HLS servers and players use 9 (the delta-update version).
_LIVE_VERSION = 9
_VOD_VERSION = 6
# The spec: a part may leave the playlist once it is more than three target durations from its end.
_PART_WINDOW_TARGETS = 3
# Apple: PART-HOLD-BACK at least three part targets, so a player is never closer to the edge than that.
_HOLD_BACK_PARTS = 3
_DECIMALS = 5


def part_uri(index: int) -> str:
    """The URI of part ``index`` (the generation's part index, from 0)."""
    return f"p{index}.m4s"


def segment_uri(sequence: int) -> str:
    """The URI of segment ``sequence`` (its media sequence number, from 0)."""
    return f"s{sequence}.m4s"


class HLSPart(Protocol):
    """What a playlist needs of a part: a broadcast's part, or any record with these attributes."""

    @property
    def index(self) -> int: ...  # the generation's part index, from 0 (its URI)
    @property
    def data(self) -> bytes: ...  # its moof + mdat
    @property
    def frames(self) -> int: ...  # video frames; 0 (the trailing mfra) is no part
    @property
    def keyframe(self) -> bool: ...  # its first video sample is a sync sample
    @property
    def duration(self) -> Fraction: ...  # media seconds


# ---------------------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HLSTiming:
    """The three durations a player holds a video to, fixed for the video's whole life."""

    #: seconds; no part is longer (PART-TARGET)
    part_target: Fraction
    #: whole seconds; no segment's EXTINF, rounded, is longer (TARGETDURATION)
    target_duration: int
    #: seconds a player stays behind the newest part (PART-HOLD-BACK), three part targets
    part_hold_back: Fraction


def hls_timing(fps: object, frames_per_part: object, keyframe_interval: object) -> HLSTiming:
    """The timing of a video whose parts hold ``frames_per_part`` frames at ``fps`` and whose keyframes
    come every ``keyframe_interval`` frames.

    A segment starts at the first part that starts with a keyframe, so parts and keyframes line up every
    ``lcm(frames_per_part, keyframe_interval)`` frames: that is the longest segment.
    """
    rate = check_fps(fps, owner="hls_timing")
    part_frames = check_int("frames_per_part", frames_per_part, minimum=1, owner="hls_timing")
    interval = check_int("keyframe_interval", keyframe_interval, minimum=1, owner="hls_timing")
    part_target = part_frames / rate
    longest_segment = math.lcm(part_frames, interval) / rate
    return HLSTiming(
        part_target=part_target,
        target_duration=max(1, math.ceil(longest_segment)),
        part_hold_back=_HOLD_BACK_PARTS * part_target,
    )


# ---------------------------------------------------------------------------------------------------------
# Segments
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    """A keyframe part and the parts up to the next one."""

    #: media sequence number, from 0
    sequence: int
    parts: tuple[HLSPart, ...]
    #: the next keyframe part exists, or the generation is over
    complete: bool

    @property
    def duration(self) -> Fraction:
        return sum((part.duration for part in self.parts), Fraction(0))

    @property
    def data(self) -> bytes:
        """Its bytes, ``s{sequence}.m4s``: its parts' bytes one after the other."""
        return b"".join(part.data for part in self.parts)

    @property
    def uri(self) -> str:
        return segment_uri(self.sequence)


def segments(parts: Sequence[HLSPart], state: GenerationState) -> list[Segment]:
    """``parts`` cut into segments, the last one complete only once the generation is over.

    The first part starts a segment whatever it is (an encoder's first frame is a keyframe). Segments are
    numbered from the first part, so ``parts`` must be the whole generation from part 0 (a ValueError
    otherwise): a playlist whose numbers moved would send a player to the wrong segment.
    """
    if parts and parts[0].index != 0:
        raise ValueError(
            f"parts must start at part 0 (segments are numbered from it), got part {parts[0].index} first: "
            "keep the whole recording for HLS"
        )
    groups: list[list[HLSPart]] = []
    for part in parts:
        if part.frames == 0:
            continue
        if not groups or part.keyframe:
            groups.append([])
        groups[-1].append(part)
    return [
        Segment(sequence, tuple(group), complete=sequence < len(groups) - 1 or state != "live")
        for sequence, group in enumerate(groups)
    ]


# ---------------------------------------------------------------------------------------------------------
# Playlists
# ---------------------------------------------------------------------------------------------------------


def _decimal(seconds: Fraction) -> str:
    """``seconds`` rounded half up to five decimals, without trailing zeros: rounding is monotonic, so a
    part no longer than PART-TARGET is never written longer than it."""
    scaled = math.floor(seconds * 10**_DECIMALS + Fraction(1, 2))
    whole, fraction = divmod(scaled, 10**_DECIMALS)
    return f"{whole}.{fraction:0{_DECIMALS}d}".rstrip("0").rstrip(".")


def _check_durations(listed: Sequence[Segment], timing: HLSTiming) -> None:
    """A ValueError unless every part and segment fits ``timing``: a playlist that breaks it is rejected
    whole by Apple's player, so none is written."""
    for segment in listed:
        for part in segment.parts:
            if part.duration > timing.part_target:
                raise ValueError(
                    f"part {part.index} lasts {float(part.duration):.6g} s, more than the part target "
                    f"{float(timing.part_target):.6g} s: parts must hold at most frames_per_part frames"
                )
        if math.floor(segment.duration + Fraction(1, 2)) > timing.target_duration:  # rounded half up
            raise ValueError(
                f"segment {segment.sequence} lasts {float(segment.duration):.6g} s, more than the target "
                f"duration {timing.target_duration} s: keyframes must come every keyframe_interval frames"
            )


def _map_lines(init_uri: str, listed: Sequence[Segment]) -> list[str]:
    lines = ["#EXT-X-MEDIA-SEQUENCE:0"]
    if all(segment.parts[0].keyframe for segment in listed):
        lines.append("#EXT-X-INDEPENDENT-SEGMENTS")
    lines.append(f'#EXT-X-MAP:URI="{init_uri}"')
    return lines


def live_playlist(init_uri: str, parts: Sequence[HLSPart], state: GenerationState, timing: HLSTiming) -> str:
    """The Low-Latency HLS media playlist of a generation that has written ``parts``.

    While ``state`` is ``"live"`` it ends with one ``EXT-X-PRELOAD-HINT`` for the next part; once the
    generation has ended or failed it ends with ``EXT-X-ENDLIST`` and is a replay from the first segment.
    A ValueError if a part or segment is longer than ``timing`` allows (see :func:`hls_timing`).
    """
    listed = segments(parts, state)
    _check_durations(listed, timing)
    end = sum((segment.duration for segment in listed), Fraction(0))
    window_start = end - _PART_WINDOW_TARGETS * timing.target_duration
    lines = [
        "#EXTM3U",
        f"#EXT-X-VERSION:{_LIVE_VERSION}",
        f"#EXT-X-TARGETDURATION:{timing.target_duration}",
        f"#EXT-X-PART-INF:PART-TARGET={_decimal(timing.part_target)}",
        f"#EXT-X-SERVER-CONTROL:CAN-BLOCK-RELOAD=YES,PART-HOLD-BACK={_decimal(timing.part_hold_back)}",
        *_map_lines(init_uri, listed),
    ]
    segment_end = Fraction(0)
    for segment in listed:
        segment_end += segment.duration
        if segment_end > window_start or not segment.complete:
            for part in segment.parts:
                independent = ",INDEPENDENT=YES" if part.keyframe else ""
                lines.append(
                    f'#EXT-X-PART:DURATION={_decimal(part.duration)},URI="{part_uri(part.index)}"{independent}'
                )
        if segment.complete:
            lines += [f"#EXTINF:{_decimal(segment.duration)},", segment.uri]
    if state == "live":
        following = listed[-1].parts[-1].index + 1 if listed else 0
        lines.append(f'#EXT-X-PRELOAD-HINT:TYPE=PART,URI="{part_uri(following)}"')
    else:
        lines.append("#EXT-X-ENDLIST")
    return "\n".join(lines) + "\n"


def vod_playlist(init_uri: str, parts: Sequence[HLSPart], timing: HLSTiming) -> str:
    """The replay playlist of an ended generation, for a static origin: whole segments only, no parts,
    ``EXT-X-PLAYLIST-TYPE:VOD`` and ``EXT-X-ENDLIST``."""
    listed = segments(parts, "ended")
    _check_durations(listed, timing)
    lines = [
        "#EXTM3U",
        f"#EXT-X-VERSION:{_VOD_VERSION}",
        f"#EXT-X-TARGETDURATION:{timing.target_duration}",
        "#EXT-X-PLAYLIST-TYPE:VOD",
        *_map_lines(init_uri, listed),
    ]
    for segment in listed:
        lines += [f"#EXTINF:{_decimal(segment.duration)},", segment.uri]
    lines.append("#EXT-X-ENDLIST")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------
# Blocking playlist reload
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BlockingRequest:
    """A playlist request held until the playlist has something newer (``_HLS_msn``, ``_HLS_part``)."""

    #: the media sequence number asked for
    msn: int
    #: the part index within that segment, or None: the whole segment (Safari asks that way)
    part: int | None


def _directive(query: Mapping[str, str], name: str) -> int | None:
    value = query.get(name)
    if value is None:
        return None
    if not re.fullmatch(r"[0-9]{1,18}", value):
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def parse_blocking_reload(query: Mapping[str, str]) -> BlockingRequest | None:
    """The blocking reload a playlist request's ``query`` asks for, or None for a plain reload.

    A ValueError (a 400, as the spec says) for ``_HLS_part`` without ``_HLS_msn``, or either directive
    that is not a non-negative integer. Other parameters are ignored.
    """
    msn = _directive(query, "_HLS_msn")
    part = _directive(query, "_HLS_part")
    if msn is None:
        if part is not None:
            raise ValueError("_HLS_part needs _HLS_msn: a part index means nothing without its segment")
        return None
    return BlockingRequest(msn, part)


def _last_listed(listed: Sequence[Segment]) -> tuple[int, int]:
    """The newest segment listed and the index of its newest part within it; (-1, -1) before any."""
    if not listed:
        return -1, -1
    return listed[-1].sequence, len(listed[-1].parts) - 1


def check_reachable(request: BlockingRequest, parts: Sequence[HLSPart], timing: HLSTiming) -> None:
    """A ValueError (a 400) if ``request`` is too far in the future to hold, as the spec says: a segment
    more than two after the newest one listed, or a part more than the Advance Part Limit (three part
    targets' worth of parts, at least three) after the newest part."""
    newest_segment, newest_part = _last_listed(segments(parts, "live"))
    if request.msn > newest_segment + 2:
        raise ValueError(
            f"_HLS_msn={request.msn} is more than two segments after the newest one ({newest_segment})"
        )
    if request.part is None:
        return
    limit = math.ceil(3 / timing.part_target) if timing.part_target < 1 else 3
    ahead = request.part - newest_part if request.msn == newest_segment else request.part + 1
    if ahead > limit:
        raise ValueError(
            f"_HLS_part={request.part} of segment {request.msn} is more than {limit} parts after the "
            f"newest part"
        )


def satisfied(request: BlockingRequest, parts: Sequence[HLSPart], state: GenerationState) -> bool:
    """Whether the playlist of ``parts`` answers ``request``: the part asked for (or any later part) is
    listed, or, without a part, segment ``msn`` is complete; and always once the generation is over."""
    if state != "live":
        return True
    listed = segments(parts, state)
    if request.part is None:
        return any(segment.sequence >= request.msn and segment.complete for segment in listed)
    newest_segment, newest_part = _last_listed(listed)
    return newest_segment > request.msn or (newest_segment == request.msn and newest_part >= request.part)


# ---------------------------------------------------------------------------------------------------------
# Recordings for a static origin
# ---------------------------------------------------------------------------------------------------------

# One path component a static server serves as is; no leading dot, which the temporary folders use.
_VIDEO_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")


def _write_file(path: Path, data: bytes) -> None:
    """``data`` to a new file at ``path``, flushed to disk."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_directory(directory: Path) -> None:
    with contextlib.suppress(OSError):  # a file system that cannot sync a directory still renamed it
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_recording(
    directory: str | os.PathLike[str],
    video_id: str,
    init: bytes,
    parts: Sequence[HLSPart],
    mp4_bytes: bytes,
    timing: HLSTiming,
) -> Path:
    """Write an ended generation to ``{directory}/{video_id}/`` for any static server to replay:
    ``video.mp4`` (``mp4_bytes``), ``index.m3u8`` (:func:`vod_playlist`), ``init.mp4`` and ``s{M}.m4s``.

    Atomic: everything goes to a temporary ``.{video_id}.*.tmp`` folder beside it, flushed to disk, then
    one rename puts it in place, so a reader sees the whole recording or none. An existing recording of
    the same id is renamed aside first (for that instant the id has no recording, never half of one) and
    removed only once the new one is in place; on any error it is put back and the temporary folder
    removed. Returns the recording's folder. Blocking: call it from a worker
    thread.
    """
    if not isinstance(video_id, str) or not _VIDEO_ID.fullmatch(video_id):
        raise ValueError(
            "video_id must be 1 to 128 letters, digits, '_', '-' or '.', not starting with '.', "
            f"got {video_id!r}"
        )
    playlist = vod_playlist(INIT_URI, parts, timing)  # checked before anything touches the disk
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    target = root / video_id
    temporary = root / f".{video_id}.{secrets.token_hex(4)}.tmp"
    aside = root / f".{video_id}.{secrets.token_hex(4)}.old"
    os.mkdir(temporary)
    moved_aside = False
    try:
        _write_file(temporary / "video.mp4", mp4_bytes)
        _write_file(temporary / INIT_URI, init)
        for segment in segments(parts, "ended"):
            _write_file(temporary / segment.uri, segment.data)
        _write_file(temporary / "index.m3u8", playlist.encode())
        _fsync_directory(temporary)
        if os.path.lexists(target):
            os.rename(target, aside)
            moved_aside = True
        os.rename(temporary, target)
    except BaseException:
        if moved_aside:
            with contextlib.suppress(OSError):
                os.rename(aside, target)
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    _fsync_directory(root)
    if moved_aside:
        shutil.rmtree(aside, ignore_errors=True)
    return target
