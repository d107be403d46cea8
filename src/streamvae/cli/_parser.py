"""The command line of ``streamvae``: its commands, options and their checks.

Option values the session would refuse (an fps out of range, a crf beyond 51, a device this machine does
not have) are refused here, by argparse, so they are reported as ``argument --fps: …`` before anything is
loaded. Building the parser imports neither torch nor diffusers, so ``--help`` and a mistyped option
answer at once; the checks of ``--fps`` (the session's rule, in a module that needs torch) and
``--device`` import what they need when the option is given.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import NoReturn

from streamvae._checks import MAX_SEED
from streamvae._codec_options import MAX_CRF, X264_PRESETS
from streamvae.cli._commands import decode_job, demo_job, run_job, serve
from streamvae.cli._devices import parse_device
from streamvae.cli._inputs import CliError
from streamvae.cli._verify import verify as verify_file


def _fps(text: str) -> Fraction:
    from streamvae._checks import check_fps

    try:
        fps = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    try:
        return check_fps(fps)  # the session's own rule, checked before anything is decoded
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _whole_number(low: int, high: int, span: str) -> Callable[[str], int]:
    """An argparse ``type``: a whole number from ``low`` to ``high``, a range its message says as
    ``span``."""

    def parse(text: str) -> int:
        try:
            number = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if not low <= number <= high:
            raise argparse.ArgumentTypeError(f"must be from {span}, got {number}")
        return number

    return parse


#: the largest TCP port
_MAX_PORT = 65535

_crf = _whole_number(0, MAX_CRF, f"0 (lossless) to {MAX_CRF}")
_seed = _whole_number(0, MAX_SEED, f"0 to 2**64 - 1 ({MAX_SEED})")
_port = _whole_number(0, _MAX_PORT, f"0 (any free port) to {_MAX_PORT}")


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error reported like any other input error: one line, exit status 1."""

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{message} (see {self.prog} --help)")


def _add_encode_options(parser: argparse.ArgumentParser, *, fps: Fraction | None, fps_help: str) -> None:
    parser.add_argument("--fps", type=_fps, default=fps, help=f"frames per second (default {fps_help})")
    # The encoder is video_codec="auto"'s choice (NVENC, x264, SVT-AV1 or VP9, whichever works here): both
    # options are on x264's scale, translated for the encoder chosen.
    parser.add_argument(
        "--crf",
        type=_crf,
        help="constant rate factor on x264's scale, 0–51 (default 18; lower is better), for any encoder",
    )
    parser.add_argument(
        "--preset",
        choices=X264_PRESETS,
        metavar="PRESET",
        help="x264's presets: ultrafast … veryslow (default veryfast), translated for any encoder",
    )
    containers = "fragmented MP4, written as it is encoded (default), or a plain MP4 written at the end"
    parser.add_argument("--container", choices=["fragmented", "mp4"], default="fragmented", help=containers)
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio", help="event loop")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar, only the summary")
    signing = "sign every output with C2PA Content Credentials that say it was generated: "
    parser.add_argument(
        "--sign-cert", type=Path, metavar="PEM", help=signing + "the certificate chain (signer first)"
    )
    parser.add_argument(
        "--sign-key", type=Path, metavar="PEM", help=signing + "the certificate's private key"
    )


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``streamvae``; each command's ``run(args)`` returns the exit status."""
    parser = _Parser(prog="streamvae", description="Stream a video VAE's decode into MP4.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser("demo", help="decode the embedded seeded demo VAE (no download)")
    demo.add_argument("-o", "--output", type=Path, default=Path("demo.mp4"), help="default demo.mp4")
    demo.add_argument("--frames", type=int, default=65, help="1 + 4k frames (default 65)")
    demo.add_argument("--size", type=int, default=256, help="width = height, a multiple of 16 (default 256)")
    demo.add_argument("--seed", type=_seed, default=0, help="seed of the latent, 0 … 2**64 - 1 (default 0)")
    # None: the demo's own rate (streamvae.demo.DEMO_FPS), read when it runs: that module imports diffusers.
    _add_encode_options(demo, fps=None, fps_help="16, the demo's")
    demo.set_defaults(run=lambda args: run_job(args, demo_job))

    decode = commands.add_parser("decode", help="decode saved latents with a local diffusers VAE")
    decode.add_argument("latents", type=Path, help="a .pt or .safetensors file with the latent")
    decode.add_argument("-o", "--output", type=Path, required=True, help="OUT.mp4 (OUT-0.mp4, … for a batch)")
    decode.add_argument("--vae", type=Path, required=True, help="a diffusers VAE directory (save_pretrained)")
    decode.add_argument("--subfolder", help="the VAE's folder inside --vae (a pipeline's: vae)")
    decode.add_argument("--key", help="the tensor's name, when the file holds several")
    decode.add_argument(
        "--audio", type=Path, help="a 16-bit PCM WAV to mux into every output (AAC, else Opus at 48 kHz)"
    )
    decode.add_argument("--tile", action="store_true", help="decode in spatial tiles (vae.enable_tiling())")
    decode.add_argument(
        "--denormalize",
        action="store_true",
        help="the latents are a pipeline's output_type='latent' (normalized; Wan, Qwen-Image, HunyuanVideo, "
        "CogVideoX): de-normalize them as the pipeline does before vae.decode",
    )
    decode.add_argument(
        "--shard",
        choices=["auto", "height", "width"],
        help="split each frame across the ranks of a torchrun launch, along the latent's height, its width, "
        "or the axis that costs least (auto: it may also decide not to split); every family; rank 0 writes "
        "the MP4",
    )
    decode.add_argument(
        "--device", type=parse_device, help="cpu, cuda or cuda:N (default cuda where there is one, else cpu)"
    )
    decode.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    _add_encode_options(decode, fps=Fraction(16), fps_help="16")
    decode.set_defaults(run=lambda args: run_job(args, decode_job))

    verify = commands.add_parser("verify", help="check an MP4's Content Credentials (C2PA) and show them")
    verify.add_argument("file", type=Path, help="the MP4 to check")
    verify.add_argument(
        "--trust-anchor", type=Path, metavar="PEM", help="a CA certificate to trust the signer against"
    )
    verify.set_defaults(run=verify_file)

    command = commands.add_parser("serve", help="serve the demo: a page with a video streamed as it decodes")
    command.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0: all of them)"
    )
    command.add_argument(
        "--port", type=_port, default=8000, help="TCP port to listen on (default 8000; 0: any free port)"
    )
    command.add_argument("--max-concurrent", type=int, default=8, help="decodes at once (default 8)")
    command.add_argument("--max-queued", type=int, default=16, help="requests waiting; more get 503")
    command.add_argument(
        "--stall-timeout", type=float, default=30.0, help="cut off a reader idle this many seconds"
    )
    command.set_defaults(run=serve)
    return parser
