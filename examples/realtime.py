"""Play a video while its latents are still being generated: a latent frame a step in, MP4 bytes out.

Autoregressive and causal generators (Self-Forcing, CausVid, world models) emit a few latent frames per
step. Here a seeded stand-in emits the embedded demo latent one latent frame a step, ``--delay`` seconds
apart, as such a model would. Each step goes to ``open_latent_stream``, which decodes it (carrying the VAE's
causal cache to the next step) while the next one is generated, and a reader task writes the fragmented
MP4's bytes into the output file as they are written: a player can start long before generation ends.
Each step prints when it went in and how many bytes had come out by then, with when the first ones came.

    python examples/realtime.py -o realtime.mp4 [--frames 33] [--size 128] [--delay 0.2] [--backend trio]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import anyio
from torch import Tensor

from streamvae import MP4ByteStream, open_latent_stream
from streamvae.demo import DEMO_FPS, demo_latent, demo_vae, latent_frames_for


async def stand_in_generator(frames: int, size: int, delay: float, seed: int) -> AsyncIterator[Tensor]:
    """Yield the seeded demo latent one latent frame [1, 16, 1, size/8, size/8] a step, a step a delay."""
    latent = demo_latent(frames, size, seed)
    for step in range(latent.shape[2]):
        await anyio.sleep(delay)  # the model working on this step
        yield latent[:, :, step : step + 1]


@dataclass
class Arrivals:
    """What the reader has written so far (seconds counted from the stream's opening)."""

    started: float
    bytes_out: int = 0
    first_bytes: float | None = None
    first_bytes_step: int | None = None  # steps pushed when the first bytes came
    steps_pushed: int = 0
    finished: float = 0.0  # when finish() returned: the MP4 is complete

    def now(self) -> float:
        return time.perf_counter() - self.started

    def __str__(self) -> str:
        first = "none yet" if self.first_bytes is None else f"first at {self.first_bytes:.2f} s"
        return f"{self.bytes_out:,} bytes out ({first})"


async def save(video: MP4ByteStream, output: Path, arrivals: Arrivals) -> None:
    """Write the entry's bytes into ``output`` as they come, noting when the first ones did."""
    async with await anyio.open_file(output, "wb") as file:
        async for data in video:
            if arrivals.first_bytes is None:
                arrivals.first_bytes, arrivals.first_bytes_step = arrivals.now(), arrivals.steps_pushed
                print(f"first bytes at {arrivals.first_bytes:.2f} s, after step {arrivals.steps_pushed}")
            await file.write(data)
            arrivals.bytes_out += len(data)


async def generate(output: Path, frames: int, size: int, delay: float, seed: int = 0) -> Arrivals:
    vae = demo_vae()
    steps = latent_frames_for(frames)
    async with open_latent_stream(vae, fps=DEMO_FPS, output="fragmented") as stream:
        arrivals = Arrivals(started=time.perf_counter())
        async with anyio.create_task_group() as group:
            # Opened before the first push, read by its own task: the bytes leave while steps still come.
            group.start_soon(save, stream.open_stream(0), output, arrivals)
            async for z_step in stand_in_generator(frames, size, delay, seed):
                await stream.push_latents(z_step)  # waits while the previous step still decodes
                arrivals.steps_pushed += 1
                print(f"step {arrivals.steps_pushed}/{steps}: pushed at {arrivals.now():.2f} s, {arrivals}")
            await stream.finish()
        arrivals.finished = arrivals.now()
    return arrivals


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, default=Path("realtime.mp4"))
    parser.add_argument("--frames", type=int, default=33, help="video frames: 1 + 4k")
    parser.add_argument("--size", type=int, default=128, help="pixels across: a multiple of 16")
    parser.add_argument("--delay", type=float, default=0.2, help="seconds the stand-in model takes a step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    args = parser.parse_args()
    arrivals = anyio.run(
        generate, args.output, args.frames, args.size, args.delay, args.seed, backend=args.backend
    )
    print(
        f"wrote {args.output}: {args.frames} frames {args.size}×{args.size} in {arrivals.finished:.2f} s, "
        f"first bytes after {arrivals.first_bytes:.2f} s (step {arrivals.first_bytes_step}), "
        f"{arrivals.bytes_out:,} bytes"
    )
