"""The ``streamvae`` command: ``demo``, ``decode`` and ``serve``.

``demo`` decodes the embedded seeded Wan VAE's latent (no download); ``decode`` decodes latents saved with
``torch.save`` or safetensors with a local diffusers VAE; ``serve`` runs the streaming server. Each decode
shows a progress bar (frames decoded and encoded, fps, ETA) and ends with a one-line summary (frames,
seconds, time to the first MP4 byte, output size). The MP4s are written as they are encoded: fragmented
MP4 by default, so the first bytes are on disk, in a temporary ``<name>.part`` file beside the output, long
before the decode ends; the output's own name appears when its MP4 is complete, and a failed run leaves
whatever was there before. Every problem with the input is reported as one ``streamvae: error: …`` line
with exit status 1.

rich (the progress bar) and starlette / uvicorn (``serve``) are optional: the library never imports them,
and this module only when they are used (``pip install 'streamvae[serve]'``).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
import wave
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import anyio
import av
import numpy as np
import torch
from torch import Tensor

from streamvae import ChunkedVideoMP4Session, MP4ByteStream, stream_mp4
from streamvae.encode import as_fps

__all__ = ["CliError", "main"]


class CliError(Exception):
    """A problem with the command's input, reported as one line without a traceback."""


# What a user's input can make the decode raise (a codec option, an output path); anything else is a bug
# and keeps its traceback.
_USER_ERRORS = (CliError, ValueError, TypeError, OSError, av.error.FFmpegError)


@dataclass
class DecodeJob:
    """One decode the command runs: what to decode, where the MP4s go, how to encode them."""

    vae: Any
    latents: Tensor
    outputs: list[Path]
    frames: int | None  # expected frames per entry, when the VAE's temporal scale is known
    session_options: dict[str, Any] = field(default_factory=dict)


@dataclass
class DecodeSummary:
    """What the summary line reports."""

    frames: int  # per entry
    width: int | None  # None if the MP4's header could not be read back
    height: int | None
    seconds: float
    first_byte_seconds: float | None
    bytes_out: int
    outputs: list[Path]

    def line(self) -> str:
        names = ", ".join(str(p) for p in self.outputs)
        first = "-" if self.first_byte_seconds is None else f"{self.first_byte_seconds:.2f} s"
        size = "" if self.width is None else f" {self.width}×{self.height}"
        return (
            f"{names}: {self.frames} frames{size} in {self.seconds:.2f} s "
            f"({self.frames / self.seconds:.1f} fps), first byte after {first}, "
            f"{_human_bytes(self.bytes_out)}"
        )


def _human_bytes(count: int) -> str:
    size = float(count)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


# -- running a decode --


async def run_decode(job: DecodeJob, *, progress: bool = True) -> DecodeSummary:
    """Decode ``job`` into its output files, with a progress bar.

    The session writes the files (``output_files``): each appears at its path, complete, when its MP4 is.
    The byte streams are read alongside only to keep the decode going and to time the first byte.
    """
    started = time.perf_counter()
    first_byte: list[float] = []
    frame_size: list[tuple[int, int]] = []
    sessions: list[ChunkedVideoMP4Session] = []
    reporter = _progress_reporter(job.frames) if progress else None

    async def drain(stream: MP4ByteStream) -> None:
        head = bytearray()  # entry 0's first bytes, until its header (the frame size) can be read
        async for data in stream:
            if not first_byte:
                first_byte.append(time.perf_counter() - started)
            if stream.entry == 0 and not frame_size and len(head) < _HEADER_LIMIT:
                head += data
                size = _frame_size(bytes(head))
                if size is not None:
                    frame_size.append(size)

    try:
        async with anyio.create_task_group() as group:
            async with (
                stream_mp4(
                    job.vae,
                    job.latents,
                    on_session=sessions.append,
                    output_files=job.outputs,
                    **job.session_options,
                ) as streams,
                anyio.create_task_group() as drains,  # every entry at once: they share one pipeline
            ):
                if reporter is not None:  # only now: a session the options failed to make shows no bar
                    group.start_soon(reporter.run, sessions)
                for stream in streams:
                    drains.start_soon(drain, stream)
            seconds = time.perf_counter() - started
            if reporter is not None:
                reporter.stop(sessions[0])
            group.cancel_scope.cancel()
    except BaseExceptionGroup as errors:
        raise _unwrap(errors) from None
    width, height = frame_size[0] if frame_size else (None, None)
    return DecodeSummary(
        frames=sessions[0].frames_pushed,
        width=width,
        height=height,
        seconds=seconds,
        first_byte_seconds=first_byte[0] if first_byte else None,
        bytes_out=sessions[0].bytes_out,
        outputs=job.outputs,
    )


def _leaves(errors: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    """The distinct errors inside ``errors`` and its nested groups."""
    leaves: list[BaseException] = []
    pending: list[BaseException] = [errors]
    while pending:
        error = pending.pop()
        if isinstance(error, BaseExceptionGroup):
            pending.extend(error.exceptions)
        elif not any(error is seen for seen in leaves):
            leaves.append(error)
    return leaves


def _unwrap(errors: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one error behind ``errors`` (every reader of a failed session raises the same one)."""
    leaves = _leaves(errors)
    return leaves[0] if len(leaves) == 1 else errors


# The header of a fragmented MP4 comes with its first fragment; a plain MP4 arrives whole.
_HEADER_LIMIT = 1 << 22


def _frame_size(head: bytes) -> tuple[int, int] | None:
    """Width and height of the video in an MP4's first bytes (as written, after any crop), if it has them."""
    try:
        with av.open(io.BytesIO(head), mode="r") as container:
            if not container.streams.video:
                return None
            context = container.streams.video[0].codec_context
            return context.width, context.height
    except av.error.FFmpegError:  # not enough of the file yet
        return None


class _Reporter:
    """Draws the progress bar from a session's counters, a few times a second."""

    def __init__(self, progress: Any, decoded: Any, encoded: Any) -> None:
        self.progress = progress
        self.decoded = decoded
        self.encoded = encoded

    async def run(self, sessions: list[ChunkedVideoMP4Session]) -> None:
        with self.progress:
            while True:
                if sessions:
                    self._update(sessions[0])
                await anyio.sleep(0.1)  # a refresh rate, not a wait for another task

    def _update(self, session: ChunkedVideoMP4Session) -> None:
        self.progress.update(self.decoded, completed=session.frames_pushed)
        self.progress.update(self.encoded, completed=session.frames_encoded)

    def stop(self, session: ChunkedVideoMP4Session) -> None:
        self._update(session)
        self.progress.refresh()


def _progress_reporter(frames: int | None) -> _Reporter | None:
    try:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            ProgressColumn,
            Task,
            TextColumn,
            TimeRemainingColumn,
        )
        from rich.text import Text
    except ImportError:  # rich is optional: without it there is only the summary line
        return None

    class FpsColumn(ProgressColumn):
        def render(self, task: Task) -> Text:
            return Text("" if task.speed is None else f"{task.speed:5.1f} fps", style="progress.data.speed")

    progress = Progress(
        TextColumn("{task.description:>13}"),
        BarColumn(),
        MofNCompleteColumn(),
        FpsColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        auto_refresh=True,
        transient=False,
    )
    decoded = progress.add_task("frames decoded", total=frames)
    encoded = progress.add_task("frames encoded", total=frames)
    return _Reporter(progress, decoded, encoded)


# -- inputs --


def load_latents(path: Path, key: str | None = None) -> Tensor:
    """A latent [B, C, T, H, W] (or [C, T, H, W], a batch of one) from a ``.pt`` or ``.safetensors`` file.

    A file holding one tensor needs no ``key``; one holding several (a dict, or safetensors) needs it,
    unless one of them is called ``latents``.
    """
    if not path.is_file():
        raise CliError(f"latents file {path} does not exist")
    suffix = path.suffix.lower()
    data: Any
    try:
        if suffix == ".safetensors":
            from safetensors.torch import load_file

            data = load_file(str(path))
        elif suffix in (".pt", ".pth"):
            data = torch.load(path, map_location="cpu", weights_only=True)
        else:
            raise CliError(f"latents file {path} must be .pt (torch.save) or .safetensors")
    except CliError:
        raise
    except Exception as error:
        raise CliError(f"cannot read latents from {path}: {error}") from error
    tensor = _pick_tensor(data, path, key)
    if tensor.ndim == 4:
        tensor = tensor[None]
    if tensor.ndim != 5 or tensor.numel() == 0 or not tensor.is_floating_point():
        raise CliError(
            f"the latent in {path} must be a float tensor [batch, channels, frames, height, width] "
            f"(or [channels, frames, height, width]), got {tuple(tensor.shape)} {tensor.dtype}"
        )
    return tensor


def _pick_tensor(data: object, path: Path, key: str | None) -> Tensor:
    if isinstance(data, Tensor):
        if key is not None:
            raise CliError(f"{path} holds a single tensor, not one named {key!r}: drop --key")
        return data
    if not isinstance(data, dict):
        raise CliError(f"{path} must hold a tensor or a dict of tensors, got {type(data).__name__}")
    tensors = {name: value for name, value in data.items() if isinstance(value, Tensor)}
    if key is not None:
        if key not in tensors:
            raise CliError(f"{path} has no tensor {key!r}; it has: {', '.join(map(str, tensors)) or 'none'}")
        return tensors[key]
    if len(tensors) == 1:
        return next(iter(tensors.values()))
    if "latents" in tensors:
        return tensors["latents"]
    raise CliError(f"{path} holds several tensors ({', '.join(map(str, tensors))}): choose one with --key")


def load_vae(
    directory: Path, *, subfolder: str | None = None, dtype: str = "float32", device: str = "cpu"
) -> Any:
    """A diffusers VAE streamvae supports, from a local ``save_pretrained`` directory."""
    from streamvae.models import supported_classes

    if not directory.is_dir():
        raise CliError(f"VAE directory {directory} does not exist")
    root = directory / subfolder if subfolder else directory
    config_path = root / "config.json"
    if not config_path.is_file():
        hint = ""
        if subfolder is None and (directory / "vae" / "config.json").is_file():
            hint = " (it looks like a pipeline: add --subfolder vae)"
        raise CliError(f"{root} is not a diffusers VAE directory: it has no config.json{hint}")
    try:
        class_name = json.loads(config_path.read_text())["_class_name"]
    except (ValueError, KeyError, TypeError) as error:
        raise CliError(f"{config_path} is not a diffusers model config (no _class_name): {error}") from error
    if class_name not in supported_classes():
        raise CliError(
            f"{root} holds a {class_name}, not a VAE streamvae decodes "
            f"(supported: {', '.join(supported_classes())})"
        )
    import diffusers

    try:
        vae = getattr(diffusers, class_name).from_pretrained(
            directory, subfolder=subfolder, torch_dtype=getattr(torch, dtype)
        )
    except Exception as error:
        raise CliError(f"cannot load the {class_name} in {root}: {error}") from error
    return vae.to(device).eval()


def read_wav(path: Path) -> tuple[np.ndarray[Any, np.dtype[np.float32]], int]:
    """A 16-bit PCM WAV file as float32 ``[channels, samples]`` in [-1, 1], and its sample rate."""
    if not path.is_file():
        raise CliError(f"audio file {path} does not exist")
    try:
        with wave.open(str(path), "rb") as wav:
            channels, width, rate = wav.getnchannels(), wav.getsampwidth(), wav.getframerate()
            raw = wav.readframes(wav.getnframes())
    except (wave.Error, EOFError) as error:
        raise CliError(f"{path} is not a PCM WAV file: {error}") from error
    if width != 2:
        raise CliError(f"{path} has {8 * width}-bit samples; only 16-bit PCM WAV is read")
    if channels not in (1, 2):
        raise CliError(f"{path} has {channels} channels; mono or stereo only")
    samples = np.frombuffer(raw, dtype="<i2").reshape(-1, channels).T
    return (samples.astype(np.float32) / 32768.0).copy(), rate


def expected_frames(vae: Any, latent_frames: int) -> int | None:
    """Frames a causal video VAE decodes from ``latent_frames`` (1 + scale·(T − 1)), if its config says."""
    config = getattr(vae, "config", None)
    for name in ("scale_factor_temporal", "temporal_compression_ratio"):
        scale = None if config is None else getattr(config, name, None)
        if isinstance(scale, int):
            return 1 + scale * (latent_frames - 1)
    return None


def output_paths(output: Path, batch: int) -> list[Path]:
    """``OUT.mp4`` for one entry, ``OUT-0.mp4``, ``OUT-1.mp4``, … for more."""
    if batch == 1:
        return [output]
    return [output.with_name(f"{output.stem}-{entry}{output.suffix}") for entry in range(batch)]


def _codec_options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, str] = {}
    if args.crf is not None:
        options["crf"] = str(args.crf)
    if args.preset is not None:
        options["preset"] = args.preset
    session: dict[str, Any] = {"fps": args.fps, "output": args.container}
    if options:
        session["video_codec_options"] = options
    return session


# -- commands --


def _demo_job(args: argparse.Namespace) -> DecodeJob:
    from streamvae.demo import check_demo_request, demo_latent, demo_vae

    try:
        check_demo_request(args.frames, args.size)
    except ValueError as error:
        raise CliError(str(error)) from error
    vae = demo_vae()
    latents = demo_latent(args.frames, args.size, args.seed)
    return DecodeJob(vae, latents, [args.output], args.frames, _codec_options(args))


def _decode_job(args: argparse.Namespace) -> DecodeJob:
    from streamvae.decode import as_chunked_decoder

    latents = load_latents(args.latents, args.key)
    device = args.device
    if args.shard is not None:
        from streamvae.distributed import init_distributed

        device = str(init_distributed())  # torchrun's group: NCCL on CUDA, gloo otherwise
    vae = load_vae(args.vae, subfolder=args.subfolder, dtype=args.dtype, device=device)
    channels = getattr(as_chunked_decoder(vae), "latent_channels", None)
    if channels is not None and latents.shape[1] != channels:
        raise CliError(
            f"the latent in {args.latents} has {latents.shape[1]} channels (shape {tuple(latents.shape)}), "
            f"but the VAE in {args.vae} takes {channels}"
        )
    if args.denormalize:
        from streamvae.models.wan import denormalize_wan_latents

        latents = denormalize_wan_latents(vae, latents)
    if args.tile:
        vae.enable_tiling()
    options = _codec_options(args)
    if args.audio is not None:
        waveform, rate = read_wav(args.audio)
        options["audio_waveforms"] = [waveform] * latents.shape[0]
        options["audio_sample_rate"] = rate
    outputs = output_paths(args.output, latents.shape[0])
    frames = expected_frames(vae, latents.shape[2])
    if args.shard is not None:
        from streamvae.distributed import ShardedWanDecoder

        try:
            decoder = ShardedWanDecoder(vae, shard=args.shard)
        except (TypeError, ValueError) as error:
            raise CliError(f"--shard {args.shard}: {error}") from error
        return DecodeJob(decoder, latents, outputs, frames, options)
    return DecodeJob(vae, latents, outputs, frames, options)


def _run_job(args: argparse.Namespace, build: Callable[[argparse.Namespace], DecodeJob]) -> int:
    job = build(args)
    if not getattr(job.vae, "is_output_rank", True):
        # A rank of a sharded decode that does not own the output: it decodes its strip, writes nothing.
        from streamvae import decode_to_mp4

        anyio.run(lambda: decode_to_mp4(job.vae, job.latents, **job.session_options), backend=args.backend)
        return 0
    summary = anyio.run(lambda: run_decode(job, progress=not args.quiet), backend=args.backend)
    print(summary.line())
    return 0


def _serve(args: argparse.Namespace) -> int:
    try:
        from streamvae.server import serve
    except ImportError as error:
        raise CliError(
            f"serve needs starlette and uvicorn: pip install 'streamvae[serve]' ({error})"
        ) from error
    serve(
        host=args.host,
        port=args.port,
        max_concurrent=args.max_concurrent,
        max_queued=args.max_queued,
        stall_timeout=args.stall_timeout,
    )
    return 0


_X264_PRESETS = (
    "ultrafast",
    "superfast",
    "veryfast",
    "faster",
    "fast",
    "medium",
    "slow",
    "slower",
    "veryslow",
    "placebo",
)


def _fps(text: str) -> float:
    try:
        fps = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    try:
        as_fps(fps)  # the session's own rule, checked before anything is decoded
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return fps


def _crf(text: str) -> int:
    try:
        crf = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 0 <= crf <= 51:
        raise argparse.ArgumentTypeError(f"must be from 0 (lossless) to 51, got {crf}")
    return crf


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error reported like any other input error: one line, exit status 1."""

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{message} (see {self.prog} --help)")


def _add_encode_options(parser: argparse.ArgumentParser, *, fps: float) -> None:
    parser.add_argument("--fps", type=_fps, default=fps, help=f"frames per second (default {fps:g})")
    parser.add_argument(
        "--crf", type=_crf, help="x264 constant rate factor, 0–51 (default 18; lower is better)"
    )
    parser.add_argument(
        "--preset",
        choices=_X264_PRESETS,
        metavar="PRESET",
        help="x264 preset: ultrafast … veryslow (default veryfast)",
    )
    parser.add_argument(
        "--container",
        choices=["fragmented", "mp4"],
        default="fragmented",
        help="fragmented MP4, written as it is encoded (default), or a plain MP4 written at the end",
    )
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio", help="event loop")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar, only the summary")


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``streamvae``."""
    from streamvae.demo import DEMO_FPS

    parser = _Parser(prog="streamvae", description="Stream a video VAE's decode into MP4.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser("demo", help="decode the embedded seeded demo VAE (no download)")
    demo.add_argument("-o", "--output", type=Path, default=Path("demo.mp4"), help="default demo.mp4")
    demo.add_argument("--frames", type=int, default=65, help="1 + 4k frames (default 65)")
    demo.add_argument("--size", type=int, default=256, help="width = height, a multiple of 16 (default 256)")
    demo.add_argument("--seed", type=int, default=0, help="seed of the latent (default 0)")
    _add_encode_options(demo, fps=DEMO_FPS)
    demo.set_defaults(run=lambda args: _run_job(args, _demo_job))

    decode = commands.add_parser("decode", help="decode saved latents with a local diffusers VAE")
    decode.add_argument("latents", type=Path, help="a .pt or .safetensors file with the latent")
    decode.add_argument("-o", "--output", type=Path, required=True, help="OUT.mp4 (OUT-0.mp4, … for a batch)")
    decode.add_argument("--vae", type=Path, required=True, help="a diffusers VAE directory (save_pretrained)")
    decode.add_argument("--subfolder", help="the VAE's folder inside --vae (a pipeline's: vae)")
    decode.add_argument("--key", help="the tensor's name, when the file holds several")
    decode.add_argument("--audio", type=Path, help="a 16-bit PCM WAV to mux as AAC into every output")
    decode.add_argument("--tile", action="store_true", help="decode in spatial tiles (vae.enable_tiling())")
    decode.add_argument(
        "--denormalize",
        action="store_true",
        help="the latents are a Wan pipeline's output_type='latent' (normalized): de-normalize first",
    )
    decode.add_argument(
        "--shard",
        choices=["height", "width"],
        help="split each frame across the ranks of a torchrun launch (Wan family; rank 0 writes the MP4)",
    )
    decode.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    decode.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    _add_encode_options(decode, fps=16)
    decode.set_defaults(run=lambda args: _run_job(args, _decode_job))

    serve = commands.add_parser("serve", help="serve the demo: a page with a video streamed as it decodes")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--max-concurrent", type=int, default=8, help="decodes at once (default 8)")
    serve.add_argument("--max-queued", type=int, default=16, help="requests waiting; more get 503")
    serve.add_argument(
        "--stall-timeout", type=float, default=30.0, help="cut off a reader idle this many seconds"
    )
    serve.set_defaults(run=_serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (1 for a problem with the input, reported in one
    ``streamvae: error: …`` line on stderr)."""
    try:
        args = build_parser().parse_args(argv)
        status: int = args.run(args)
    except Exception as error:
        reported = _user_error(error)
        if reported is None:
            raise
        print(f"streamvae: error: {_describe(reported)}", file=sys.stderr)
        return 1
    return status


def _user_error(error: BaseException) -> BaseException | None:
    """The error to report for ``error`` if the user's input caused it (a group: its first), else None."""
    leaves = _leaves(error) if isinstance(error, BaseExceptionGroup) else [error]
    return leaves[0] if all(isinstance(leaf, _USER_ERRORS) for leaf in leaves) else None


def _describe(error: BaseException) -> str:
    if isinstance(error, av.error.FFmpegError):  # a codec option FFmpeg rejects
        text = f"the encoder failed: {error}"
    elif isinstance(error, OSError) and error.filename is not None and error.strerror:
        text = f"{error.filename}: {error.strerror}"  # an output path that cannot be written
    else:
        text = str(error) or type(error).__name__
    return " ".join(text.split())  # one line, whatever the message held
