"""``chunk_transform``: the stage where a watermark, an overlay or a colour grade plugs in. Its output is what
is encoded (a visible pattern, read back from the MP4), it sees each frame once and in order, it runs off the
event loop, and its exception is the session's first cause."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
import torch

from streamvae import ChunkedVideoMP4Session, decode_to_mp4
from tests._media import DETERMINISTIC_X264, read_luma
from tests._vaes import tiny_wan21

pytestmark = pytest.mark.anyio

FRAMES, HEIGHT, WIDTH = 9, 32, 48


def frame_chunks(sizes: tuple[int, ...]) -> list[torch.Tensor]:
    """Chunks of mid-grey frames (value 0 in [-1, 1]) whose sizes are ``sizes``."""
    return [torch.zeros(1, 3, size, HEIGHT, WIDTH) for size in sizes]


class Bars:
    """A transform that paints a white bar on black at rows ``2i, 2i+1`` of the stream's frame ``i``, and
    counts the frames it is given, the shape of each chunk and the threads it ran in."""

    def __init__(self) -> None:
        self.seen = 0
        self.shapes: list[tuple[int, ...]] = []
        self.threads: set[int] = set()

    def __call__(self, chunk: torch.Tensor) -> torch.Tensor:
        self.threads.add(threading.get_ident())
        self.shapes.append(tuple(chunk.shape))
        out = torch.full_like(chunk, -1.0)
        for t in range(chunk.shape[2]):
            row = 2 * (self.seen + t)
            out[:, :, t, row : row + 2, :] = 1.0
        self.seen += chunk.shape[2]
        return out


async def encode(chunks: list[torch.Tensor], **options: Any) -> list[bytes]:
    async with ChunkedVideoMP4Session(
        value_range=(-1.0, 1.0), fps=8, video_codec_options=DETERMINISTIC_X264, **options
    ) as session:
        for chunk in chunks:
            await session.push(chunk)
        return await session.finish()


def assert_bars(video: bytes, frames: int) -> None:
    """Each decoded frame is black with a white bar at rows ``2i, 2i+1`` (frame ``i``)."""
    luma = read_luma(video).astype(int)
    assert luma.shape == (frames, HEIGHT, WIDTH)
    for index, frame in enumerate(luma):
        bar = np.zeros(HEIGHT, dtype=bool)
        bar[2 * index : 2 * index + 2] = True
        assert frame[bar].min() > 200, index  # the bar is what the transform drew
        assert frame[~bar][:, 4:-4].max() < 60, index  # and nothing of the grey input is left


async def test_the_transforms_output_is_what_is_encoded_each_frame_once_in_order() -> None:
    bars = Bars()
    main_thread = threading.get_ident()
    videos = await encode(frame_chunks((1, 4, 4)), chunk_transform=bars, batch_frames=3)
    assert_bars(videos[0], FRAMES)
    assert bars.seen == FRAMES  # every frame once
    assert bars.shapes == [(1, 3, 1, HEIGHT, WIDTH), (1, 3, 4, HEIGHT, WIDTH), (1, 3, 4, HEIGHT, WIDTH)]
    assert main_thread not in bars.threads  # a worker thread, never the event loop's


async def test_the_transform_sees_the_cropped_frames_and_runs_for_a_decode_door() -> None:
    bars = Bars()
    vae = tiny_wan21()
    # 40×56 frames cropped to 32×48: the transform sees the crop, not the decoder's frames
    z = torch.randn(1, vae.config.z_dim, 3, 5, 7, generator=torch.Generator().manual_seed(0))
    (video,) = await decode_to_mp4(
        vae, z, fps=8, chunk_transform=bars, crop=(HEIGHT, WIDTH), video_codec_options=DETERMINISTIC_X264
    )
    assert all(shape[3:] == (HEIGHT, WIDTH) for shape in bars.shapes)
    assert_bars(video, bars.seen)
    assert bars.seen == 9  # 3 latent frames of a Wan VAE: 1 + 4 + 4


class Broken(Exception):
    pass


async def test_the_transforms_exception_is_the_first_cause() -> None:
    calls = 0

    def fails_on_the_second_chunk(chunk: torch.Tensor) -> torch.Tensor:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise Broken("the watermark model is not loaded")
        return chunk

    with pytest.raises(Broken, match="not loaded"):
        await encode(frame_chunks((2, 2, 2)), chunk_transform=fails_on_the_second_chunk)


@pytest.mark.parametrize(
    ("transform", "error", "message"),
    [
        (
            lambda chunk: chunk[:, :, :, :16],
            ValueError,
            r"chunk_transform must return a float tensor of the chunk's shape",
        ),
        (lambda chunk: chunk.to(torch.uint8), ValueError, r"float tensor .* got torch.uint8"),
        (lambda chunk: chunk.numpy(), TypeError, r"chunk_transform must return a tensor .* got ndarray"),
    ],
)
async def test_an_output_that_cannot_be_encoded_in_the_chunks_place_is_refused_naming_it(
    transform: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        await encode(frame_chunks((2,)), chunk_transform=transform)


def test_a_transform_that_is_not_callable_is_refused_when_the_session_is_built() -> None:
    with pytest.raises(
        TypeError, match=r"ChunkedVideoMP4Session: chunk_transform must be a function .* got str"
    ):
        ChunkedVideoMP4Session(value_range=(-1.0, 1.0), fps=8, chunk_transform="videoseal")
