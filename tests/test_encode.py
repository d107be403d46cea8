"""The per-entry encoder: what it holds once it is closed, and when a fragment's frames leave."""

from __future__ import annotations

import gc
import io
import struct
import weakref
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import av
import numpy as np
import pytest

from streamvae._codec_options import merge_codec_options
from streamvae._encode import EntryEncoder
from streamvae._fragments import FragmentCutter, MP4Piece
from tests._media import DETERMINISTIC_X264, count_frames, moving_pattern, psnr, read_mp4, to_rgb_uint8

FRAMES = np.random.default_rng(0).integers(0, 256, (5, 32, 32, 3), dtype=np.uint8)


@pytest.fixture
def no_gc() -> Iterator[None]:
    """Only reference counts free objects while the test runs: a reference cycle shows up as a survivor."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _alive(kind: type) -> int:
    return sum(issubclass(type(o), kind) for o in gc.get_objects())


@pytest.mark.parametrize("output", ["mp4", "fragmented"])
@pytest.mark.parametrize("end", ["finish", "close"])
@pytest.mark.parametrize("audio", [False, True])
def test_a_dropped_encoder_frees_its_container_and_codecs_without_the_garbage_collector(
    no_gc: None, output: Any, end: str, audio: bool
) -> None:
    # A server writes an MP4 per request for days: anything a cycle keeps (a whole x264 encoder) would
    # wait for the cyclic collector, and grew such a server by megabytes per hundred requests.
    containers, streams = _alive(av.container.OutputContainer), _alive(av.stream.Stream)
    encoder = EntryEncoder(
        fps=Fraction(16),
        output=output,
        video_codec_options={"threads": "1"},
        audio=np.zeros((1, 8000), np.float32) if audio else None,
        audio_sample_rate=16000 if audio else None,
    )
    encoder.encode(FRAMES)
    getattr(encoder, end)()
    assert _alive(av.stream.Stream) == streams  # closing let go of the streams (and so the codecs)
    dropped = weakref.ref(encoder)
    del encoder
    assert dropped() is None
    assert _alive(av.container.OutputContainer) == containers
    assert _alive(av.stream.Stream) == streams


def test_a_finished_mp4_encoder_keeps_no_copy_of_its_output(no_gc: None) -> None:
    encoder = EntryEncoder(fps=Fraction(16), output="mp4", video_codec_options={"threads": "1"})
    encoder.encode(FRAMES)
    [piece] = encoder.finish()  # a plain MP4 is one piece, every frame
    data = piece.data
    assert data[4:8] == b"ftyp" and encoder.bytes_out == len(data)
    assert piece.frames == piece.frames_until == 5
    referents = gc.get_referents(vars(encoder))
    assert not any(isinstance(o, bytes | bytearray) and len(o) >= len(data) for o in referents)
    assert not any(hasattr(o, "getbuffer") for o in referents)  # no BytesIO left behind


@pytest.mark.parametrize(("codec", "zero_copy"), [("libx264", True), ("libx265", True), ("mpeg4", False)])
def test_yuv420p_frames_wrap_the_slot_only_for_encoders_that_copy_the_picture(
    codec: str, zero_copy: bool
) -> None:
    # The ring reuses a slot as soon as encode() returns: only x264 and x265 are known to copy the
    # picture before that; every other encoder gets a frame PyAV owns.
    slot = np.random.default_rng(1).integers(16, 235, (2, 48, 32), dtype=np.uint8)  # 2 frames of 32×32
    encoder = EntryEncoder(fps=Fraction(16), pixel_format="yuv420p", video_codec=codec)
    seen: list[tuple[int, bytes]] = []
    video_frame = encoder._video_frame

    def recording(array: np.ndarray[Any, Any], height: int, width: int) -> av.VideoFrame:
        frame = video_frame(array, height, width)
        seen.append((frame.planes[0].buffer_ptr, bytes(frame.planes[0])))
        return frame

    encoder._video_frame = recording  # type: ignore[method-assign]
    try:
        encoder.encode(slot)
    finally:
        encoder.close()
    for index, (pointer, luma) in enumerate(seen):
        assert (pointer == slot[index].ctypes.data) == zero_copy
        assert luma[: 32 * 32] == slot[index, :32].tobytes()  # the same picture either way


# -- fragmented output: what leaves when --


def joined(pieces: list[MP4Piece]) -> bytes:
    return b"".join(piece.data for piece in pieces)


def fragment_frames(data: bytes) -> list[int]:
    """The video (track 1) samples of each whole fragment in ``data``, walking the boxes plainly."""
    counts, start = [], 0
    while start + 8 <= len(data):
        size, kind = struct.unpack_from(">I4s", data, start)
        if kind == b"moof" and start + size <= len(data):
            counts.append(_track_samples(data, start + 8, start + size))
        start += size
    return counts


def _track_samples(data: bytes, start: int, end: int) -> int:
    samples = 0
    while start < end:
        size, kind = struct.unpack_from(">I4s", data, start)
        if kind == b"traf":
            inner, track, count = start + 8, 0, 0
            while inner < start + size:
                child_size, child = struct.unpack_from(">I4s", data, inner)
                if child == b"tfhd":
                    track = struct.unpack_from(">I", data, inner + 12)[0]
                elif child == b"trun":
                    count += struct.unpack_from(">I", data, inner + 12)[0]
                inner += child_size
            samples += count if track == 1 else 0
        start += size
    return samples


CLIP = np.ascontiguousarray(to_rgb_uint8(moving_pattern(0, 25, height=64, width=96))[0])
GROUPS = [1, 4, 4, 4, 4, 4, 4]  # how a causal VAE publishes 25 frames


def test_a_groups_frames_leave_with_the_next_groups_first_frame() -> None:
    encoder = EntryEncoder(
        fps=Fraction(16), output="fragmented", video_codec_options=DETERMINISTIC_X264, keyframe_interval=16
    )
    received, start = b"", 0
    try:
        for size in GROUPS:
            if start:
                # the next group's first frame alone: every frame before it must be out
                received += joined(encoder.encode(CLIP[start : start + 1]))
                assert count_frames(received) == sum(fragment_frames(received)) == start
                assert encoder.frames_out == start
            received += joined(encoder.encode(CLIP[start + (start > 0) : start + size]))
            start += size
        received += joined(encoder.finish())
    finally:
        encoder.close()
    assert fragment_frames(received) == [1] * 25  # one fragment a frame (a transfer group of 1)
    assert read_mp4(received).frames.shape[0] == encoder.frames_out == 25


def test_fragment_frames_cuts_every_n_frames_whatever_the_keyframes() -> None:
    encoder = EntryEncoder(
        fps=Fraction(16),
        output="fragmented",
        video_codec_options=DETERMINISTIC_X264,
        keyframe_interval=6,
        fragment_frames=4,
    )
    data = joined(encoder.encode(CLIP) + encoder.finish())
    assert fragment_frames(data) == [4] * 6 + [1]
    with av.open(io.BytesIO(data)) as container:
        keyframes = [p.is_keyframe for p in container.demux(video=0) if p.size]
    starts = set(range(0, 25, 4))
    assert keyframes[0] and not all(keyframes[i] for i in starts)  # only the first must start on one
    assert any(key and i not in starts for i, key in enumerate(keyframes))  # keyframes cut no fragment


@pytest.mark.parametrize(("fps", "rate"), [(16, 16000), (8, 48000), (30, 44100)])
def test_fragments_of_one_frame_with_audio_keep_every_frame_at_its_time(fps: int, rate: int) -> None:
    # FFmpeg 8.1 gives a single-frame fragment closed by an audio packet a duration of 0, and shifts the
    # frames after it, unless the muxer is told a fragment's least duration.
    encoder = EntryEncoder(
        fps=Fraction(fps),
        output="fragmented",
        video_codec_options={"threads": "1"},
        audio=np.zeros((1, rate * 4), np.float32),
        audio_sample_rate=rate,
    )
    data = b"".join(joined(encoder.encode(CLIP[i : i + 1])) for i in range(25)) + joined(encoder.finish())
    with av.open(io.BytesIO(data)) as container:
        times = [float(p.pts * p.time_base) * fps for p in container.demux(video=0) if p.size]
    assert times == pytest.approx(list(range(25)))
    assert read_mp4(data).frames.shape[0] == 25


def test_fragmented_output_defaults_to_zerolatency_and_a_users_tune_replaces_it() -> None:
    assert merge_codec_options("libx264", None, "fragmented")["tune"] == "zerolatency"
    assert merge_codec_options("libx264", {"tune": "film"}, "fragmented")["tune"] == "film"
    assert "tune" not in merge_codec_options("libx264", None, "mp4")  # a plain MP4 is unchanged
    encoder = EntryEncoder(fps=Fraction(16), output="fragmented", video_codec_options={"threads": "1"})
    try:
        # zerolatency: frame 0's packet comes with frame 0, so frame 1 closes its fragment
        assert encoder.encode(CLIP[:1]) == []  # the moov waits for the first fragment
        assert count_frames(joined(encoder.encode(CLIP[1:2]))) == 1
    finally:
        encoder.close()


def test_a_users_tune_brings_b_frames_back_and_the_video_still_starts_at_zero() -> None:
    encoder = EntryEncoder(
        fps=Fraction(16), output="fragmented", video_codec_options={"threads": "1", "tune": "film"}
    )
    data = b"".join(joined(encoder.encode(CLIP[i : i + 4])) for i in range(0, 25, 4)) + joined(
        encoder.finish()
    )
    video = read_mp4(data)
    assert video.frames.shape[0] == 25 and video.video_start == 0
    assert psnr(video.frames, CLIP) > 35


@pytest.mark.parametrize("piece", [1, 7, 4096])
def test_the_fragment_cutter_counts_whole_fragments_however_the_bytes_are_cut(piece: int) -> None:
    encoder = EntryEncoder(fps=Fraction(16), output="fragmented", video_codec_options={"threads": "1"})
    data = b"".join(joined(encoder.encode(CLIP[i : i + 1])) for i in range(25)) + joined(encoder.finish())
    cutter, seen, cut = FragmentCutter(), [], []
    for start in range(0, len(data), piece):
        cut += cutter.feed(data[start : start + piece])
        seen.append(cutter.samples)
    rest = cutter.rest()
    assert cutter.samples == 25 and cutter.fragments == 25
    assert seen == sorted(seen)  # a fragment counts once, when its mdat is whole
    assert [p.frames for p in cut] == [1] * 25 and [p.frames_until for p in cut] == list(range(1, 26))
    assert rest is not None and joined([*cut, rest]) == data  # cut, not changed
    head = data[: data.index(b"mdat") - 4]  # up to the first fragment's mdat: no frame yet
    partial = FragmentCutter()
    assert partial.feed(head) == [] and partial.samples == 0
