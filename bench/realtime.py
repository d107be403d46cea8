"""Incremental decode: a latent stream fed one latent frame a push vs ``decode_to_mp4`` of the whole latent.

Issue 12's target: the wall of ``open_latent_stream`` fed one latent frame per ``push_latents`` is at most
1.05 × the wall of ``decode_to_mp4`` of the same latent when it is all available at once (medians of
interleaved runs). The pieces are pushed back to back (no generator delay), so any cost of decoding in
pieces — a push per latent frame, the limiter taken per piece, the worker's hand-offs — shows in the wall.

Both decode the demo VAE's seeded latent (``streamvae.demo``) with ``output="fragmented"``, and a reader
task takes the bytes through ``open_stream(0)`` in both (for ``decode_to_mp4`` from its ``on_session``), so
both also report the time to the first byte and to the first fragment holding a frame (the first ``moof``
whose ``mdat`` is whole: a header alone shows nothing). Times are counted from the call that opens the
session. Each repetition runs every (frames, size) with both modes, their order alternating.

    .venv/bin/python bench/realtime.py --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import struct
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import count_frames
from _report import write_section

from streamvae import ChunkedVideoMP4Session, MP4ByteStream, decode_to_mp4, open_latent_stream
from streamvae.demo import DEMO_FPS, demo_latent, demo_vae

CONFIGS = ((33, 128), (65, 128), (33, 256), (65, 256))  # (frames, size)
MODES = ("whole", "pieces")
TARGET = 1.05
_BOX = struct.Struct(">I4s")


@dataclass
class Probe:
    """Reads one entry's bytes, noting when the first byte and the first frame-holding fragment came."""

    started: float = field(default_factory=time.perf_counter)
    first_byte: float | None = None
    first_frame: float | None = None
    wall: float | None = None  # set by the runner once the MP4 is complete and read
    data: bytearray = field(default_factory=bytearray)

    async def read(self, video: MP4ByteStream) -> None:
        async for piece in video:
            now = time.perf_counter() - self.started
            if self.first_byte is None:
                self.first_byte = now
            self.data += piece
            if self.first_frame is None and _fragment_whole(self.data):
                self.first_frame = now


def _fragment_whole(data: bytes | bytearray) -> bool:
    """Whether ``data`` (a fragmented MP4's start) holds a ``moof`` followed by its whole ``mdat``."""
    offset, moof = 0, False
    while offset + 8 <= len(data):
        size: int
        kind: bytes
        size, kind = _BOX.unpack_from(data, offset)
        if size == 1 and offset + 16 <= len(data):
            size = int.from_bytes(data[offset + 8 : offset + 16], "big")
        if size < 8:
            return False
        if kind == b"moof":
            moof = True
        elif kind == b"mdat" and moof:
            return offset + size <= len(data)
        offset += size
    return False


@dataclass
class Run:
    wall: float
    first_byte: float
    first_frame: float
    frames: int


async def whole(vae: object, z: Tensor) -> Probe:
    """``decode_to_mp4`` of the whole latent, its bytes read through the session's ``open_stream``."""
    probe = Probe()
    async with anyio.create_task_group() as group:

        def read(session: ChunkedVideoMP4Session) -> None:
            group.start_soon(probe.read, session.open_stream(0))

        assert await decode_to_mp4(vae, z, fps=DEMO_FPS, output="fragmented", on_session=read) == [b""]
    probe.wall = time.perf_counter() - probe.started
    return probe


async def pieces(vae: object, z: Tensor) -> Probe:
    """``open_latent_stream`` fed one latent frame a push, back to back."""
    probe = Probe()
    async with (
        open_latent_stream(vae, fps=DEMO_FPS, output="fragmented") as stream,
        anyio.create_task_group() as group,
    ):
        group.start_soon(probe.read, stream.open_stream(0))
        for k in range(z.shape[2]):
            await stream.push_latents(z[:, :, k : k + 1])
        assert await stream.finish() == [b""]
    probe.wall = time.perf_counter() - probe.started
    return probe


RUNNERS: dict[str, Callable[[object, Tensor], Awaitable[Probe]]] = {"whole": whole, "pieces": pieces}


def measure(mode: str, vae: object, z: Tensor) -> Run:
    probe = anyio.run(RUNNERS[mode], vae, z)
    assert probe.wall is not None and probe.first_byte is not None and probe.first_frame is not None
    return Run(probe.wall, probe.first_byte, probe.first_frame, count_frames(bytes(probe.data)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dry-run", action="store_true", help="print the section, do not write it")
    args = parser.parse_args()
    torch.set_num_threads(1)  # one decode thread: the two x264 threads and the decode share 2 cores less
    vae = demo_vae()
    latents = {(frames, size): demo_latent(frames, size, seed=0) for frames, size in CONFIGS}
    for mode in MODES:  # warm up: thread pools, allocator, the encoder library
        measure(mode, vae, demo_latent(9, 32))

    runs: dict[tuple[str, int, int], list[Run]] = {}
    for repeat in range(args.repeats):
        for (frames, size), z in latents.items():
            for mode in MODES if repeat % 2 == 0 else MODES[::-1]:
                run = measure(mode, vae, z)
                assert run.frames == frames, (mode, frames, run.frames)
                runs.setdefault((mode, frames, size), []).append(run)
                print(
                    f"{repeat} {mode:6} {frames} frames {size} px: wall {run.wall:.3f} s, first byte "
                    f"{run.first_byte:.3f} s, first frame {run.first_frame:.3f} s"
                )
    text = report(args, runs)
    print(text)
    if not args.dry_run:
        print(f"wrote {write_section('realtime', text)}")


def report(args: argparse.Namespace, runs: dict[tuple[str, int, int], list[Run]]) -> str:
    def median(mode: str, frames: int, size: int, what: str) -> float:
        return statistics.median(float(getattr(run, what)) for run in runs[(mode, frames, size)])

    lines = [
        "## Realtime: a latent frame a push vs the whole latent (`python bench/realtime.py`)",
        "",
        f"`.venv/bin/python bench/realtime.py --repeats {args.repeats}` (2-core CPU, one torch thread, x264 "
        "defaults for fragmented output). The demo VAE (`streamvae.demo`) decodes its seeded latent two ways, "
        "side by side in one process, the order alternating each repetition: *whole*: `decode_to_mp4` of the "
        "whole latent, all available at once; *pieces*: `open_latent_stream` fed one latent frame per "
        "`push_latents`, back to back. Both write fragmented MP4 read through `open_stream(0)`; times from "
        "the call that opens the session to the last byte read (wall), the first byte, and the first "
        f"fragment holding a frame (a `moof` whose `mdat` is whole). Medians of {args.repeats} repetitions. "
        f"Issue 12's target: wall of pieces ≤ {TARGET} × wall of whole.",
        "",
        "| frames | size | pushes | wall whole | wall pieces | pieces ÷ whole | within target "
        "| first byte whole | first byte pieces | first frame whole | first frame pieces |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for frames, size in CONFIGS:
        walls = {mode: median(mode, frames, size, "wall") for mode in MODES}
        ratio = walls["pieces"] / walls["whole"]
        ok = "yes" if ratio <= TARGET else "no"
        firsts = [
            median(mode, frames, size, what) for what in ("first_byte", "first_frame") for mode in MODES
        ]
        lines.append(
            f"| {frames} | {size}×{size} | {1 + (frames - 1) // 4} | {walls['whole']:.3f} s "
            f"| {walls['pieces']:.3f} s | **{ratio:.3f}** | {ok} | "
            + " | ".join(f"{1000 * t:.0f} ms" for t in firsts)
            + " |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
