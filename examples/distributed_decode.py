"""Decode one Wan latent across the ranks of a torchrun job; the output rank writes the MP4.

    torchrun --nproc-per-node=2 examples/distributed_decode.py --shard height -o out.mp4
    torchrun --nproc-per-node=2 examples/distributed_decode.py --pieces 1 -o out.mp4   # as latents arrive
    torchrun --nproc-per-node=4 examples/distributed_decode.py --vae Wan-AI/Wan2.1-T2V-1.3B-Diffusers \\
        --latents latents.pt --normalized -o out.mp4

Every rank decodes a strip of every frame (``--shard height`` or ``width``; ``auto``, the default, takes
the cheaper axis); rank 0 gathers each chunk and streams it into the MP4 while later chunks decode.
Without ``--vae`` a tiny seeded Wan 2.1 (or ``--tiny wan22``) VAE is built on every rank, and without
``--latents`` a seeded random latent: the same on every rank. On CUDA each rank uses ``cuda:LOCAL_RANK``
and NCCL; on a CPU, gloo. Run without torchrun it is a group of one.
"""

from __future__ import annotations

import argparse
import functools
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import torch
import torch.distributed as dist
from diffusers import AutoencoderKLWan

from streamvae import decode_to_mp4, open_latent_stream
from streamvae.cli import CliError
from streamvae.cli import load_latents as load_saved_latents
from streamvae.cli import load_vae as load_saved_vae
from streamvae.distributed import init_distributed, sharded_decoder
from streamvae.models.wan import denormalize_wan_latents
from streamvae.testing import TINY_VAE_CONFIGS

TINY_CONFIGS = TINY_VAE_CONFIGS  # `--tiny`: a seeded tiny VAE instead of --vae


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-o", "--output", type=Path, default=Path("distributed.mp4"))
    parser.add_argument("--shard", choices=["auto", "height", "width"], default="auto")
    parser.add_argument(
        "--vae", help="a diffusers AutoencoderKLWan: a directory or hub id (subfolder 'vae' tried)"
    )
    parser.add_argument(
        "--tiny", choices=sorted(TINY_CONFIGS), default="wan21", help="tiny config without --vae"
    )
    parser.add_argument(
        "--latents", type=Path, help="a .pt or .safetensors [B, C, T, H, W] latent (default: seeded)"
    )
    parser.add_argument("--normalized", action="store_true", help="the latents are a pipeline's, normalized")
    parser.add_argument("--frames", type=int, default=5, help="latent frames of the seeded latent")
    parser.add_argument("--height", type=int, default=8, help="latent height of the seeded latent")
    parser.add_argument("--width", type=int, default=8, help="latent width of the seeded latent")
    parser.add_argument(
        "--pieces",
        type=int,
        metavar="T",
        help="push the latent in pieces of T latent frames through open_latent_stream, as a real-time "
        "generator hands them out (default: the whole latent at once)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fps", type=float, default=16.0)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a rank waits for a dead peer")
    return parser.parse_args()


def load_vae(args: argparse.Namespace, device: torch.device) -> AutoencoderKLWan:
    if args.vae is None:
        torch.manual_seed(args.seed)  # the same weights on every rank
        vae = AutoencoderKLWan(**TINY_CONFIGS[args.tiny])
        return vae.to(device).eval()
    directory = Path(args.vae)
    if directory.is_dir():  # a saved VAE, or a pipeline with it in vae/: read as `streamvae decode` does
        subfolder = "vae" if (directory / "vae" / "config.json").is_file() else None
        return load_saved_vae(directory, subfolder=subfolder, device=str(device))
    try:  # a hub id
        vae = AutoencoderKLWan.from_pretrained(args.vae, subfolder="vae")
    except (OSError, ValueError):
        vae = AutoencoderKLWan.from_pretrained(args.vae)
    return vae.to(device).eval()


def load_latents(args: argparse.Namespace, vae: AutoencoderKLWan) -> torch.Tensor:
    if args.latents is not None:
        z = load_saved_latents(args.latents)  # .pt or .safetensors, [B, C, T, H, W] or [C, T, H, W]
        return denormalize_wan_latents(vae, z) if args.normalized else z
    generator = torch.Generator().manual_seed(args.seed)
    shape = (1, int(vae.config["z_dim"]), args.frames, args.height, args.width)
    return torch.randn(shape, generator=generator)


async def stream_pieces(decoder: Any, z: torch.Tensor, frames: int, fps: float) -> list[bytes]:
    """Every rank pushes the same pieces, in order; only the output rank's finish() returns MP4s."""
    async with open_latent_stream(decoder, fps=fps) as stream:
        for piece in z.split(frames, dim=2):
            await stream.push_latents(piece)
        return await stream.finish()


def main() -> None:
    args = parse_args()
    device = init_distributed(timeout=timedelta(seconds=args.timeout))
    try:
        try:
            vae = load_vae(args, device)
            z = load_latents(args, vae)
        except CliError as error:  # a missing or unreadable input: one line, as the CLI reports it
            raise SystemExit(f"distributed_decode: error: {error}") from None
        decoder = sharded_decoder(vae, shard=args.shard)
        started = time.perf_counter()
        if args.pieces is None:
            videos = anyio.run(functools.partial(decode_to_mp4, decoder, z, fps=args.fps))
        else:
            videos = anyio.run(stream_pieces, decoder, z, args.pieces, args.fps)
        seconds = time.perf_counter() - started
        print(
            f"rank {decoder.rank}/{decoder.world_size}: decoded {decoder.stats.latent_frames} latent frames "
            f"in {seconds:.2f} s with {decoder.stats.collectives} collectives",
            flush=True,
        )
        for entry, video in enumerate(videos):  # only the output rank has any
            path = args.output if len(videos) == 1 else args.output.with_stem(f"{args.output.stem}_{entry}")
            path.write_bytes(video)
            print(f"wrote {path} ({len(video)} bytes)", flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
