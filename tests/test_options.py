"""Session options as one checked value, defined once, and the library's errors: no event loop needed."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
import torch

import streamvae
from streamvae import (
    ChunkedVideoMP4Session,
    PinnedChunkRing,
    RingAbortedError,
    SessionClosedError,
    SessionKeywords,
    SessionOptions,
    StreamVAEError,
    UnreadStreamError,
    decode_to_mp4,
)
from streamvae.distributed import PeerDecodeError
from tests._media import read_mp4


def test_options_are_checked_and_normalized_without_an_event_loop() -> None:
    options = SessionOptions(
        value_range=(-1, 1),
        fps=23.976,
        output="fragmented",
        audio_waveforms=[np.zeros(100), None],
        audio_sample_rate=8000,
        video_codec_options={"crf": "20"},
    )
    assert options.fps == Fraction(2997, 125) and options.value_range == (-1.0, 1.0)
    assert options.keyframe_interval == 24  # fragmented MP4: a keyframe (and fragment) a second
    waveform = options.audio_waveforms[0] if options.audio_waveforms else None
    assert waveform is not None and waveform.dtype == np.float32 and waveform.shape == (1, 100)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.fps = Fraction(8)  # type: ignore[misc]
    with pytest.raises(TypeError):
        options.video_codec_options["crf"] = "30"  # type: ignore[index]
    with pytest.raises(ValueError, match="fps must be a number between"):
        dataclasses.replace(options, fps=0)  # a variant is checked too
    assert dataclasses.replace(options, fps=8).keyframe_interval == 24  # normalized values are kept


def test_every_option_error_is_raised_when_the_options_are_built() -> None:
    with pytest.raises(ValueError, match="batch_frames must be an int >= 1, got 0"):
        SessionOptions(value_range=(0, 1), fps=8, batch_frames=0)
    with pytest.raises(ValueError, match="output must be 'mp4' or 'fragmented', got 'webm'"):
        SessionOptions(value_range=(0, 1), fps=8, output="webm")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        SessionOptions(value_range=(0, 1))  # type: ignore[call-arg]  # fps is required


@pytest.mark.parametrize(
    ("options", "name"),
    [
        ({"fps": "16"}, "fps"),
        ({"value_range": "0,1"}, "value_range"),
        ({"batch_frames": "2"}, "batch_frames"),
        ({"transfer_slots": 1.5}, "transfer_slots"),
        ({"keyframe_interval": True}, "keyframe_interval"),
        ({"crop": "64x64"}, "crop"),
        ({"crop": ("a", 1)}, "crop"),
        ({"video_codec_options": {"crf": 18}}, "video_codec_options"),
        ({"audio_waveforms": np.zeros(10), "audio_sample_rate": 8000}, "audio_waveforms"),
        ({"audio_waveforms": [None], "audio_sample_rate": "8000"}, "audio_sample_rate"),
        ({"record_timeline": 1}, "record_timeline"),
        ({"pixel_format": 3}, "pixel_format"),
    ],
)
def test_a_bad_option_value_of_any_type_is_a_value_error_naming_it(
    options: dict[str, Any], name: str
) -> None:
    with pytest.raises(ValueError, match=name) as caught:
        SessionOptions(**{"value_range": (0, 1), "fps": 8, **options})
    assert not isinstance(caught.value, TypeError)
    with pytest.raises(ValueError, match=f"ChunkedVideoMP4Session: .*{name}"):
        ChunkedVideoMP4Session(**{"value_range": (0, 1), "fps": 8, **options})


@pytest.mark.parametrize("limiter", [2, "budget", object()])
def test_an_encode_limiter_that_is_no_limiter_is_a_type_error_everywhere(limiter: object) -> None:
    with pytest.raises(TypeError, match="encode_limiter must be an anyio.CapacityLimiter"):
        SessionOptions(value_range=(0, 1), fps=8, encode_limiter=limiter)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ChunkedVideoMP4Session: encode_limiter"):
        ChunkedVideoMP4Session(value_range=(0, 1), fps=8, encode_limiter=limiter)  # type: ignore[arg-type]


def test_the_keyword_surface_is_the_options_fields() -> None:
    # SessionKeywords types the keywords of every entry point: one per SessionOptions field, no more.
    fields = [field.name for field in dataclasses.fields(SessionOptions)]
    assert list(SessionKeywords.__annotations__) == fields
    assert SessionKeywords.__required_keys__ == frozenset()  # defaults and requirements are the options'
    # Every entry point takes options= or those keywords, and nothing of its own shares their names.
    entry_points = [
        ChunkedVideoMP4Session.__init__,
        streamvae.decode_to_mp4,
        streamvae.stream_mp4,
        streamvae.open_latent_stream,
    ]
    for function in entry_points:
        parameters = inspect.signature(function).parameters
        keywords = [p for p in parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
        assert len(keywords) == 1 and keywords[0].annotation == "Unpack[SessionKeywords]", function
        assert "options" in parameters and not set(parameters) & set(fields), function


def test_an_unknown_option_keyword_names_the_nearest_option() -> None:
    with pytest.raises(
        TypeError, match="unexpected keyword argument 'batch_frame'; did you mean 'batch_frames'"
    ):
        ChunkedVideoMP4Session(value_range=(0, 1), fps=8, batch_frame=2)  # type: ignore[call-arg]


def test_the_librarys_own_errors_share_one_base_and_stay_runtime_errors() -> None:
    for error in (SessionClosedError("x"), RingAbortedError("x"), UnreadStreamError(0, 1)):
        assert isinstance(error, StreamVAEError) and isinstance(error, RuntimeError)
    peer = PeerDecodeError("stopped", chunk=1, output_error="ValueError: x")
    assert isinstance(peer, StreamVAEError) and isinstance(peer, RuntimeError)
    copy = pickle.loads(pickle.dumps(UnreadStreamError(2, 3)))  # errors cross process boundaries
    assert (copy.waiting, copy.unread) == (2, 3) and str(copy) == str(UnreadStreamError(2, 3))
    with pytest.raises(ValueError, match="depth"):
        PinnedChunkRing(2.0)  # type: ignore[arg-type]


def test_a_session_reads_its_options_from_one_checked_value() -> None:
    session = ChunkedVideoMP4Session(value_range=(-1, 1), fps=16, crop=(32, 48), output="fragmented")
    assert session.options.crop == (32, 48)
    assert session.options.fps == 16 and session.options.keyframe_interval == 16
    with pytest.raises(AttributeError):
        session.fps  # type: ignore[attr-defined]  # noqa: B018  # no second way to read an option


def test_options_are_given_once() -> None:
    options = SessionOptions(value_range=(-1, 1), fps=16)
    with pytest.raises(TypeError, match="options= or as keywords, not both"):
        ChunkedVideoMP4Session(options=options, fps=8)
    with pytest.raises(TypeError, match="must be a streamvae.SessionOptions"):
        ChunkedVideoMP4Session(options={"fps": 8})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"ChunkedVideoMP4Session\(\) needs value_range="):
        ChunkedVideoMP4Session(fps=8)


class FlatDecoder:
    chunk_value_range = (-1.0, 1.0)

    def decode_with_chunks(self, z: torch.Tensor, *, on_chunk: Any) -> None:
        for _ in range(z.shape[2]):
            on_chunk(torch.zeros(z.shape[0], 3, 1, 16, 16))


@pytest.mark.anyio
async def test_decode_to_mp4_takes_one_options_value() -> None:
    options = SessionOptions(value_range=(-1, 1), fps=8, video_codec_options={"threads": "1"})
    (video,) = await decode_to_mp4(FlatDecoder(), torch.zeros(1, 4, 3, 2, 2), options=options)
    assert read_mp4(video).frames.shape[0] == 3 and read_mp4(video).fps == 8
    with pytest.raises(TypeError, match="not both"):
        await decode_to_mp4(FlatDecoder(), torch.zeros(1, 4, 3, 2, 2), options=options, fps=8)
    async with streamvae.stream_mp4(FlatDecoder(), torch.zeros(1, 4, 2, 2, 2), options=options) as (stream,):
        data = b"".join([piece async for piece in stream])
    assert read_mp4(data).frames.shape[0] == 2
