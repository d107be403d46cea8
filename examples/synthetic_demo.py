"""Push a synthetic moving-pattern video through a ChunkedVideoMP4Session and write it to an MP4.

The producer publishes chunks the way a causal video VAE does (1 frame, then 4 per latent frame), so this
runs the whole pipeline — quantize, host-slot ring, H.264 encode — without a model.

    python examples/synthetic_demo.py -o demo.mp4 [--frames 65] [--backend trio]
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import anyio
import torch

from streamvae import ChunkedVideoMP4Session


def pattern(start: int, frames: int, height: int, width: int) -> torch.Tensor:
    """A smooth moving colour pattern in [-1, 1], BCTHW with a batch of one."""
    t = torch.arange(start, start + frames, dtype=torch.float32)[:, None, None]
    y = torch.linspace(-1, 1, height)[None, :, None]
    x = torch.linspace(-1, 1, width)[None, None, :]
    red = torch.sin(2 * x + 0.15 * t + 0 * y)
    green = torch.cos(2 * y - 0.1 * t) * torch.cos(x)
    blue = torch.sin(3 * (x * x + y * y) - 0.2 * t)
    return torch.stack([red, green, blue], dim=0)[None]


async def main(output: Path, frames: int, height: int, width: int, fps: float) -> None:
    started = time.perf_counter()
    latent_frames = 1 + math.ceil((frames - 1) / 4)
    async with ChunkedVideoMP4Session(value_range=(-1.0, 1.0), fps=fps) as session:
        pushed = 0
        for i in range(latent_frames):
            count = 1 if i == 0 else min(4, frames - pushed)
            await session.push(pattern(pushed, count, height, width))
            pushed += count
        (video,) = await session.finish()
    output.write_bytes(video)
    seconds = time.perf_counter() - started
    print(f"wrote {output}: {pushed} frames {width}x{height} @ {fps} fps, {len(video)} bytes in {seconds:.2f} s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, default=Path("demo.mp4"))
    parser.add_argument("--frames", type=int, default=65)
    parser.add_argument("--height", type=int, default=256)
    parser.add_argument("--width", type=int, default=384)
    parser.add_argument("--fps", type=float, default=16)
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    args = parser.parse_args()
    anyio.run(main, args.output, args.frames, args.height, args.width, args.fps, backend=args.backend)
