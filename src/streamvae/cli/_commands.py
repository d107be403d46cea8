"""The commands: ``demo`` and ``decode`` build a :class:`DecodeJob` from the parsed arguments and run it;
``serve`` runs the server.

Every command encodes with ``video_codec="auto"``: the first rung of the ladder (the rung table,
``streamvae/_codec_options.py``) that works on this machine, so that the command works on any FFmpeg (one
without GPL parts has no libx264). ``--crf`` and ``--preset`` are codec-neutral there, translated for the
encoder chosen.

A job's session options are built into one checked :class:`streamvae.SessionOptions` as soon as the VAE is
known (its value range is the decoder's), so a bad option fails before anything is decoded. What a
command needs (torch, diffusers, the session) is imported when it runs, so that ``--help`` and an option
error answer without loading any of it.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from streamvae.cli._denormalize import channels_first, check_denormalizable, denormalize_latents
from streamvae.cli._devices import default_device
from streamvae.cli._inputs import (
    CliError,
    expected_frames,
    load_latents,
    load_vae,
    output_paths,
    read_wav,
    vae_class_name,
)

if TYPE_CHECKING:
    from streamvae import SessionOptions
    from streamvae.cli._runner import DecodeJob


def session_options(args: argparse.Namespace, vae: Any, *, fps: Fraction, **extra: Any) -> SessionOptions:
    """The options the parsed arguments give for a decode with ``vae`` at ``fps`` (``extra``: audio)."""
    from streamvae import SessionOptions
    from streamvae.models import as_decoder

    codec: dict[str, str] = {}
    if args.crf is not None:
        codec["crf"] = str(args.crf)
    if args.preset is not None:
        codec["preset"] = args.preset
    return SessionOptions(
        value_range=as_decoder(vae).chunk_value_range,
        fps=fps,
        output=args.container,
        video_codec="auto",
        video_codec_options=codec,
        provenance=_provenance(args),
        **extra,
    )


def _provenance(args: argparse.Namespace) -> Any:
    """``--sign-cert`` and ``--sign-key`` as a :class:`streamvae.Provenance` (checked with a trial
    signature before anything is decoded), or None without them."""
    if args.sign_cert is None and args.sign_key is None:
        return None
    if args.sign_cert is None or args.sign_key is None:
        raise CliError("--sign-cert and --sign-key go together: the certificate chain and its private key")
    try:
        from streamvae import Provenance

        # Provenance imports c2pa as it is built: a missing extra is found here, not on import.
        return Provenance(certificate_chain=args.sign_cert, private_key=args.sign_key)
    except ImportError as error:
        raise CliError(
            f"--sign-cert needs c2pa-python: pip install 'streamvae[provenance]' ({error})"
        ) from error


def demo_job(args: argparse.Namespace) -> DecodeJob:
    """``streamvae demo``: the embedded demo VAE and its seeded latent."""
    from streamvae.cli._runner import DecodeJob
    from streamvae.demo import DEMO_FPS, check_demo_request, demo_latent, demo_vae

    try:
        check_demo_request(args.frames, args.size)
    except ValueError as error:
        raise CliError(str(error)) from error
    vae = demo_vae()
    options = session_options(args, vae, fps=Fraction(DEMO_FPS) if args.fps is None else args.fps)
    latents = demo_latent(args.frames, args.size, args.seed)
    return DecodeJob(vae, latents, [args.output], args.frames, options)


def decode_job(args: argparse.Namespace) -> DecodeJob:
    """``streamvae decode``: saved latents, a saved VAE, optionally a WAV and a sharded decode."""
    from streamvae.cli._runner import DecodeJob
    from streamvae.models import as_decoder

    class_name = vae_class_name(args.vae, args.subfolder)
    if args.denormalize:
        check_denormalizable(class_name)  # a family it cannot de-normalize is refused before anything loads
    latents = load_latents(args.latents, args.key)
    if args.denormalize:
        latents = channels_first(class_name, latents)
    device = default_device() if args.device is None else args.device
    if args.shard is not None:
        from streamvae.distributed import init_distributed

        device = str(init_distributed())  # torchrun's group: NCCL on CUDA, gloo otherwise
    vae = load_vae(args.vae, subfolder=args.subfolder, dtype=args.dtype, device=device)
    channels = as_decoder(vae).latent_channels
    if channels is not None and latents.shape[1] != channels:
        hint = ""
        if not args.denormalize and channels_first(class_name, latents).shape[1] == channels:
            hint = " (a pipeline's frames-first latent? add --denormalize)"
        raise CliError(
            f"the latent in {args.latents} has {latents.shape[1]} channels (shape {tuple(latents.shape)}), "
            f"but the VAE in {args.vae} takes {channels}{hint}"
        )
    audio: dict[str, Any] = {}
    if args.audio is not None:
        waveform, rate = read_wav(args.audio)
        audio = {"audio_waveforms": [waveform] * latents.shape[0], "audio_sample_rate": rate}
    if args.denormalize:
        latents = denormalize_latents(vae, latents)
    if args.tile:
        vae.enable_tiling()
    decoder = vae
    if args.shard is not None:
        from streamvae.distributed import sharded_decoder

        try:
            decoder = sharded_decoder(vae, shard=args.shard)
        except (TypeError, ValueError) as error:
            raise CliError(f"--shard {args.shard}: {error}") from error
    options = session_options(args, decoder, fps=args.fps, **audio)
    outputs = output_paths(args.output, latents.shape[0])
    return DecodeJob(decoder, latents, outputs, expected_frames(vae, latents.shape[2]), options)


def run_job(args: argparse.Namespace, build: Callable[[argparse.Namespace], DecodeJob]) -> int:
    """Build the job, decode it and print its summary line."""
    import anyio

    import streamvae.cli as cli  # the runner by its public name: the one a caller (a test) may replace
    from streamvae.cli._signals import until_sigterm
    from streamvae.models import as_decoder

    job = build(args)
    if not as_decoder(job.vae).is_output_rank:
        # A rank of a sharded decode that does not own the output: it decodes its strip, writes nothing.
        from streamvae import decode_to_mp4

        decode = functools.partial(decode_to_mp4, job.vae, job.latents, options=job.options)
        anyio.run(until_sigterm, decode, backend=args.backend)
        return 0
    # SIGTERM stops the decode as Ctrl-C does: cancelled in its loop, its partial outputs removed.
    run = functools.partial(cli.run_decode, job, progress=not args.quiet)
    summary = anyio.run(until_sigterm, run, backend=args.backend)
    print(summary.line())
    return 0


def serve(args: argparse.Namespace) -> int:
    """``streamvae serve``: the streaming server, until interrupted."""
    try:
        from streamvae.server import serve
    except ImportError as error:
        raise CliError(
            "serve needs starlette and uvicorn: pip install starlette uvicorn "
            f"(in a checkout: pip install -e '.[serve]') ({error})"
        ) from error
    _check_listen(args.host, args.port)
    serve(
        host=args.host,
        port=args.port,
        max_concurrent=args.max_concurrent,
        max_queued=args.max_queued,
        stall_timeout=args.stall_timeout,
        session_options={"video_codec": "auto"},  # the app's default is libx264, which a build may lack
    )
    return 0


def _check_listen(host: str, port: int) -> None:
    """A :class:`CliError` naming ``--host`` or ``--port`` unless the server can listen there: a busy or
    privileged port would otherwise be uvicorn's own log line and its exit status 3, after the app is
    built. The socket is bound as uvicorn binds it (``SO_REUSEADDR``), then closed for uvicorn to take."""
    import errno
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
    except OSError as error:
        reason = error.strerror or str(error)
        if error.errno == errno.EADDRINUSE:
            raise CliError(f"--port {port}: {host}:{port} is in use already (choose another port)") from None
        if error.errno == errno.EACCES:
            raise CliError(f"--port {port}: listening on {host}:{port} is not permitted ({reason})") from None
        raise CliError(f"--host {host} --port {port}: cannot listen there ({reason})") from None
