"""The ``streamvae`` command: ``demo``, ``decode``, ``verify`` and ``serve``.

``demo`` decodes the embedded seeded Wan VAE's latent (no download); ``decode`` decodes latents saved with
``torch.save`` or safetensors with a local diffusers VAE; ``serve`` runs the streaming server. Each decode
shows a progress bar (frames decoded and encoded, fps, ETA) and ends with a one-line summary (frames,
seconds, time to the first MP4 byte, output size). The MP4s are written as they are encoded: fragmented
MP4 by default, so the first bytes are on disk, in a temporary ``<name>.part`` file beside the output, long
before the decode ends; the output's own name appears when its MP4 is complete, and a failed run leaves
whatever was there before. Every problem with the input is reported as one ``streamvae: error: …`` line
with exit status 1, before anything is decoded where the problem is in the options.

``--sign-cert`` and ``--sign-key`` sign every output with C2PA Content Credentials that say it was
generated (checked before anything is decoded; each file is signed before it takes its name);
``verify FILE.mp4`` says whether a file's credentials are valid, trusted (``--trust-anchor``) or not,
and what they say.

Ctrl-C stops the decode the same way (partial outputs removed) and is reported as ``streamvae:
interrupted``, exit status 130; SIGTERM too, reported as ``streamvae: terminated``, exit status 143.

rich (the progress bar) and starlette / uvicorn (``serve``) are optional: the library never imports them,
and this package only when they are used (``pip install -e '.[serve]'`` in a checkout). torch, diffusers
and the decode pipeline are imported by the command that needs them, so ``--help`` and an option error
answer without loading them.

The input loaders (:func:`load_latents`, :func:`load_vae`, :func:`read_wav`) and the runner
(:class:`DecodeJob`, :func:`run_decode`) are public so that scripts (``examples/distributed_decode.py``)
read inputs and report errors the way the command does.
"""

from typing import TYPE_CHECKING, Any

from streamvae.cli._inputs import CliError, expected_frames, load_latents, load_vae, output_paths, read_wav
from streamvae.cli._main import main
from streamvae.cli._parser import build_parser

if TYPE_CHECKING:
    from streamvae.cli._runner import DecodeJob, DecodeSummary, run_decode

__all__ = [
    "CliError",
    "DecodeJob",
    "DecodeSummary",
    "build_parser",
    "expected_frames",
    "load_latents",
    "load_vae",
    "main",
    "output_paths",
    "read_wav",
    "run_decode",
]


def __getattr__(name: str) -> Any:
    """The runner's names, imported on first use: the runner needs the decode pipeline, ``--help`` not."""
    if name not in ("DecodeJob", "DecodeSummary", "run_decode"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import streamvae.cli._runner as runner

    value = getattr(runner, name)
    globals()[name] = value  # found directly from now on (and replaceable: a test replaces run_decode)
    return value
