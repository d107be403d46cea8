"""The per-entry encoder: what it holds once it is closed."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import av
import numpy as np
import pytest

from streamvae._encode import EntryEncoder

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
    data = encoder.finish()
    assert data[4:8] == b"ftyp" and encoder.bytes_out == len(data)
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
