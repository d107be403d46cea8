"""Test media: smooth synthetic clips, and reading back the MP4s streamvae writes (with PyAV)."""

from __future__ import annotations

import io
import math
import struct
from collections.abc import AsyncIterable, Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, TypeVar

import anyio
import av
import numpy as np
import torch

from streamvae import ChunkedVideoMP4Session, MP4ByteStream, MP4Piece

T = TypeVar("T")

#: x264 options under which its output is a function of its input alone: one thread, and no SIMD. Its
#: assembly reads uninitialized padding of its own frame buffers when the width is not a multiple of 64
#: (seen at 96 and 416 pixels, FFmpeg 8.1's x264), which flips a few decisions from run to run; with
#: ``asm=0`` 30 runs out of 30 gave the same bytes. Tests that compare MP4 bytes use these.
DETERMINISTIC_X264 = {"threads": "1", "x264-params": "asm=0"}
#: x264 options its open refuses (a crop larger than any frame here) that pass every door: a parameter list
#: is checked when the encoder opens, where the frame size is known. Tests of an encoder failing mid-decode
#: use them; the refusal is a ValueError naming the option, caused by FFmpeg's error.
REFUSED_AT_OPEN = {"x264-params": "crop-rect=0,0,0,4096"}


def moving_pattern(
    start: int, frames: int, *, batch: int = 1, height: int = 64, width: int = 96
) -> torch.Tensor:
    """A smooth moving colour pattern in [-1, 1], BCTHW float32; entry b is shifted so entries differ."""
    t = torch.arange(start, start + frames, dtype=torch.float32)[None, :, None, None]
    b = torch.arange(batch, dtype=torch.float32)[:, None, None, None]
    y = torch.linspace(-1, 1, height)[None, None, :, None]
    x = torch.linspace(-1, 1, width)[None, None, None, :]
    red = 0.8 * torch.sin(1.5 * x + 0.2 * t + 0.5 * y + b)
    green = 0.8 * torch.cos(1.2 * y - 0.1 * t + 0.4 * x - b)
    blue = 0.8 * torch.sin(1.5 * x * y + 0.05 * t + 0.3 * b)
    return torch.stack([red, green, blue], dim=1).contiguous()


def wan_like_chunks(latent_frames: int, **kwargs: int) -> list[torch.Tensor]:
    """Chunks the way a causal video VAE publishes them: 1 frame, then 4 per latent frame."""
    chunks, start = [], 0
    for i in range(latent_frames):
        n = 1 if i == 0 else 4
        chunks.append(moving_pattern(start, n, **kwargs))
        start += n
    return chunks


def to_rgb_uint8(video: torch.Tensor) -> np.ndarray:
    """BCTHW in [-1, 1] → [B, T, H, W, 3] uint8, the reference for pixel checks."""
    x = ((video.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return x.permute(0, 2, 3, 4, 1).numpy()


@dataclass
class DecodedMP4:
    frames: np.ndarray  # [T, H, W, 3] uint8
    fps: Fraction
    video_start: float
    video_duration: float
    audio_start: float | None
    audio_duration: float | None
    audio_channels: int | None
    colorspace: int


def read_mp4(data: bytes) -> DecodedMP4:
    with av.open(io.BytesIO(data)) as container:
        video = container.streams.video[0]
        audio = container.streams.audio[0] if container.streams.audio else None
        fps = video.average_rate
        assert video.time_base is not None and video.duration is not None
        v_start = float((video.start_time or 0) * video.time_base)
        v_duration = float(video.duration * video.time_base)
        a_start = a_duration = None
        channels = None
        if audio is not None:
            assert audio.time_base is not None and audio.duration is not None
            a_start = float((audio.start_time or 0) * audio.time_base)
            a_duration = float(audio.duration * audio.time_base)
            channels = audio.codec_context.channels
        colorspace = video.codec_context.colorspace
        frames = np.stack(
            [f.to_ndarray(format="rgb24", src_colorspace="ITU709") for f in container.decode(video=0)]
        )
    return DecodedMP4(frames, Fraction(fps), v_start, v_duration, a_start, a_duration, channels, colorspace)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def read_luma(data: bytes) -> np.ndarray:
    """The Y plane of every frame of an MP4, [T, H, W] uint8."""
    with av.open(io.BytesIO(data)) as container:
        frames = [f.to_ndarray(format="yuv420p") for f in container.decode(video=0)]
    height = frames[0].shape[0] * 2 // 3
    return np.stack([f[:height] for f in frames])


def bt709_luma(rgb: np.ndarray) -> np.ndarray:
    """[T, H, W, 3] uint8 rgb24 → [T, H, W] limited-range BT.709 luma, as PyAV's swscale converts it."""
    planes = [
        av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
        .reformat(format="yuv420p", dst_colorspace="ITU709", dst_color_range="MPEG")
        .to_ndarray()
        for frame in rgb
    ]
    height = rgb.shape[1]
    return np.stack([p[:height] for p in planes])


def count_frames(mp4: bytes | Path | str) -> int:
    """Video frames PyAV decodes from an MP4: its bytes (a fragmented one may be any prefix of whole
    fragments received so far; none is 0 frames) or its path."""
    if isinstance(mp4, bytes) and not mp4:
        return 0
    with av.open(io.BytesIO(mp4) if isinstance(mp4, bytes) else str(mp4)) as container:
        return sum(1 for _ in container.decode(video=0))


async def streamed(
    read: Callable[[MP4ByteStream], AsyncIterable[T]], chunks: Sequence[torch.Tensor], **options: Any
) -> list[T]:
    """What ``read`` yields from entry 0's stream of a session with ``options`` while ``chunks`` are pushed
    and the session finished (60 s hang guard: a hang fails, this measures no speed)."""
    items: list[T] = []
    with anyio.fail_after(60):
        async with ChunkedVideoMP4Session(**options) as session:
            stream = session.open_stream(0)

            async def produce() -> None:
                for chunk in chunks:
                    await session.push(chunk)
                await session.finish()

            session.start_producer(produce)
            async for item in read(stream):
                items.append(item)
    return items


async def written_pieces(chunks: Sequence[torch.Tensor], **options: Any) -> list[MP4Piece]:
    """Entry 0's MP4 pieces, as the encoder hands them on, of a session with ``options`` pushed ``chunks``."""
    return await streamed(MP4ByteStream.pieces, chunks, **options)


def top_level_boxes(data: bytes) -> list[tuple[bytes, int, int]]:
    """The top-level boxes ``data`` is made of, each ``(type, offset, size)``; fails unless it is whole
    boxes exactly (a size under 8, which would be a 64-bit size or a box to the end, is not one streamvae
    writes)."""
    boxes, start = [], 0
    while start < len(data):
        size, kind = struct.unpack_from(">I4s", data, start)
        assert size >= 8, f"a box of {size} bytes at {start}"
        boxes.append((kind, start, size))
        start += size
    assert start == len(data), "the last box runs past the data"
    return boxes
