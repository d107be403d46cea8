"""Time to the first published chunk, as a fraction of the whole decode, for each streaming producer.

Each family's VAE is built with random weights and reduced channel counts (so it runs on a CPU), but with the
diffusers defaults that decide how it walks time: HunyuanVideo's 5-latent windows every 3 latents,
LTX-Video's and LTX-2's 3-latent windows every latent (temporal tiling on), CogVideoX's batches of 2 latents,
and, for contrast, LTX-Video with temporal tiling off (one chunk). The latent spans 49 frames.

For each producer it prints the median over ``--repeats`` runs of: the time to the first chunk, the time of
the whole streamed decode, the time of ``vae.decode`` on the same latent, and the first-chunk time as a
fraction of each; and, independent of the machine, the share of decoded latent frames that came before
the first chunk. The table goes into the "producers" section of docs/benchmarks.md.

    .venv/bin/python bench/producers.py --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from diffusers import (
    AutoencoderKLCogVideoX,
    AutoencoderKLHunyuanVideo,
    AutoencoderKLLTX2Video,
    AutoencoderKLLTXVideo,
)
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import write_section

from streamvae.models import chunked_decoder


@dataclass
class Producer:
    name: str
    build: Callable[[], Any]  # a random-weight VAE with the family's time walk
    latent_shape: tuple[int, int, int, int, int]
    walk: str  # how it walks time, in words


def _hunyuan_video() -> AutoencoderKLHunyuanVideo:
    return AutoencoderKLHunyuanVideo(
        latent_channels=16, block_out_channels=(16, 32, 32, 32), layers_per_block=1, norm_num_groups=8
    )


def _ltx_video(framewise: bool) -> Callable[[], AutoencoderKLLTXVideo]:
    def build() -> AutoencoderKLLTXVideo:
        vae = AutoencoderKLLTXVideo(
            latent_channels=32,
            block_out_channels=(16, 32, 32, 32),
            decoder_block_out_channels=(16, 32, 32, 32),
            layers_per_block=(1, 1, 1, 1, 1),
            decoder_layers_per_block=(1, 1, 1, 1, 1),
            patch_size=1,
        )
        vae.use_framewise_decoding = framewise
        return vae

    return build


def _ltx2_video() -> AutoencoderKLLTX2Video:
    vae = AutoencoderKLLTX2Video(
        latent_channels=32,
        block_out_channels=(8, 16, 32, 64),
        decoder_block_out_channels=(16, 32, 64),
        layers_per_block=(1, 1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1),
        patch_size=1,
        spatial_compression_ratio=8,
        temporal_compression_ratio=8,
    )
    vae.use_framewise_decoding = True
    return vae


def _cogvideox() -> AutoencoderKLCogVideoX:
    return AutoencoderKLCogVideoX(
        latent_channels=16, block_out_channels=(16, 32, 32, 32), layers_per_block=1, norm_num_groups=8
    )


PRODUCERS = [
    Producer("HunyuanVideo", _hunyuan_video, (1, 16, 13, 12, 12), "5-latent windows every 3, 4-frame blend"),
    Producer("LTX-Video", _ltx_video(True), (1, 32, 7, 12, 12), "3-latent windows every 1, 8-frame blend"),
    Producer("LTX-2", _ltx2_video, (1, 32, 7, 12, 12), "3-latent windows every 1, 8-frame blend"),
    Producer("CogVideoX", _cogvideox, (1, 16, 13, 12, 12), "batches of 2 latents (first takes 3)"),
    Producer("LTX-Video, tiling off", _ltx_video(False), (1, 32, 7, 12, 12), "one decoder call"),
]


@dataclass
class Timing:
    first_chunk_s: float
    streamed_s: float
    decode_s: float
    chunks: int
    frames: int
    first_step_share: float  # latent frames the decoder ran before the first chunk, over all it ran


def measure_once(vae: Any, z: Tensor) -> Timing:
    """One streamed decode (time to its first chunk and to its end), then ``vae.decode`` on the same latent."""
    adapter = chunked_decoder(vae)
    published: list[tuple[float, int]] = []
    decoder_frames: list[int] = []  # latent frames of each decoder call (a spatial tile counts as a call)
    calls_before_first = 0

    def on_chunk(chunk: Tensor) -> None:
        nonlocal calls_before_first
        if not published:
            calls_before_first = len(decoder_frames)
        published.append((time.perf_counter() - start, chunk.shape[2]))

    hook = vae.decoder.register_forward_pre_hook(lambda _, inputs: decoder_frames.append(inputs[0].shape[2]))
    try:
        start = time.perf_counter()
        adapter.decode_with_chunks(z, on_chunk=on_chunk)
        streamed = time.perf_counter() - start
    finally:
        hook.remove()
    with torch.no_grad():
        start = time.perf_counter()
        vae.decode(z)
        decode = time.perf_counter() - start
    return Timing(
        first_chunk_s=published[0][0],
        streamed_s=streamed,
        decode_s=decode,
        chunks=len(published),
        frames=sum(n for _, n in published),
        first_step_share=sum(decoder_frames[:calls_before_first]) / sum(decoder_frames),
    )


def run(producer: Producer, repeats: int) -> dict[str, Any]:
    torch.manual_seed(0)
    vae = producer.build().eval()
    z = torch.randn(producer.latent_shape, generator=torch.Generator().manual_seed(0))
    timings = []
    measure_once(vae, z)  # warm-up: first calls pay for kernel selection and allocation
    for _ in range(repeats):
        timings.append(measure_once(vae, z))
    first = statistics.median(t.first_chunk_s for t in timings)
    streamed = statistics.median(t.streamed_s for t in timings)
    decode = statistics.median(t.decode_s for t in timings)
    return {
        "producer": producer.name,
        "walk": producer.walk,
        "latent": "×".join(str(n) for n in producer.latent_shape[2:]),
        "chunks": timings[0].chunks,
        "frames": timings[0].frames,
        "first_s": first,
        "streamed_s": streamed,
        "decode_s": decode,
        "of_streamed": first / streamed,
        "of_decode": first / decode,
        "first_step_share": timings[0].first_step_share,
    }


def markdown(rows: list[dict[str, Any]], threads: int, repeats: int) -> str:
    lines = [
        "## Producers: time to the first chunk (`python bench/producers.py`)",
        "",
        "Random-weight VAEs with reduced channels and each family's default",
        f"time walk, CPU float32, {threads} torch thread(s), medians of {repeats} runs after a warm-up.",
        "*First / streamed*: time to the first published chunk over the whole streamed decode; *first /",
        "decode*: the same over `vae.decode` of the same latent; *first step's latents*: latent frames the",
        "decoder ran before the first chunk over all it ran, the fraction a device whose cost follows the",
        "latent count would see.",
        "",
        "| producer | time walk | latent T×H×W | chunks | frames | first chunk | streamed | vae.decode "
        "| first / streamed | first / decode | first step's latents |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['producer']} | {row['walk']} | {row['latent']} | {row['chunks']} | {row['frames']} "
            f"| {row['first_s']:.3f} s | {row['streamed_s']:.3f} s | {row['decode_s']:.3f} s "
            f"| {row['of_streamed']:.1%} | {row['of_decode']:.1%} | {row['first_step_share']:.1%} |"
        )
    lines += [
        "",
        "Streaming does the decode work `vae.decode` does, in the same steps (it only skips windows that",
        "decode nothing but frames past the clip's end), so *streamed* and *vae.decode* differ by noise.",
        "LTX streams only with temporal tiling, which decodes each latent in up to three windows: compare",
        "its rows with the tiling-off row, which is one chunk.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = [run(producer, args.repeats) for producer in PRODUCERS]
    table = markdown(rows, args.threads, args.repeats)
    print(table)
    if not args.no_write:
        print(f"wrote {write_section('producers', table)}")


if __name__ == "__main__":
    main()
