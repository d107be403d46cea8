"""Drive a ChunkedVideoMP4Session from your own producer loop: one clip per autoregressive iteration.

This is the shape of Wan S2V-style generation: each iteration denoises the next stretch of latent, decodes
it to a clip, and hands the clip to the session with ``await session.push(clip)`` — which waits while the
encoder is behind, so the loop never runs ahead into memory. Encoding overlaps the next iteration's work.
Here the "generation" is a window of the embedded demo latent, decoded with the demo VAE in a worker thread
(never on the event loop).

    python examples/producer_loop.py -o clips.mp4 [--iterations 4] [--backend trio]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import anyio
import torch
from torch import Tensor

from streamvae import ChunkedVideoMP4Session
from streamvae.demo import DEMO_FPS, demo_latent, demo_vae


async def generate(output: Path, iterations: int, size: int) -> int:
    vae = demo_vae()
    window = 4  # latent frames per iteration → 13 frames per clip
    latent = demo_latent(1 + 4 * (window * iterations - 1), size)  # the whole "story", one window a step

    def decode(z: Tensor) -> Tensor:
        with torch.no_grad():
            return vae.decode(z).sample  # BCTHW in [-1, 1]

    options = {"value_range": (-1.0, 1.0), "fps": DEMO_FPS, "output_files": [output]}
    async with ChunkedVideoMP4Session(**options) as session:
        for step in range(iterations):
            z = latent[:, :, step * window : (step + 1) * window]
            clip = await anyio.to_thread.run_sync(decode, z)
            await session.push(clip)
            print(f"step {step}: pushed {session.frames_pushed} frames, encoded {session.frames_encoded}")
        await session.finish()
    return session.frames_pushed


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, default=Path("clips.mp4"))
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    args = parser.parse_args()
    frames = anyio.run(generate, args.output, args.iterations, args.size, backend=args.backend)
    print(f"wrote {args.output}: {frames} frames")
