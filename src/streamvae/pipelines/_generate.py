"""A diffusers video pipeline in one call: :func:`generate_mp4` and :func:`stream_generation`.

Both check every argument at the call, run the pipeline in a worker thread up to its ``vae.decode``
(``_capture``), then decode the latents it passed there with :func:`streamvae.decode_to_mp4` or
:func:`streamvae.stream_mp4`: the same session, the same defaults, and so the same bytes as those give
for those latents.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio

from streamvae._checks import check_fps
from streamvae._decode import decode_to_mp4, stream_mp4
from streamvae._decode_worker import run_decode_worker
from streamvae._options import SessionOptions, check_option_dict, resolve_options
from streamvae._sinks import MP4ByteStream
from streamvae.models import ChunkedDecoder, as_decoder, supported_classes
from streamvae.pipelines._capture import CapturedDecode, check_pipeline, check_pipeline_kwargs, run_to_decode

__all__ = ["generate_mp4", "stream_generation"]


async def generate_mp4(
    pipe: Any,
    *,
    fps: float,
    session_options: Mapping[str, Any] | None = None,
    **pipeline_kwargs: Any,
) -> list[bytes]:
    """Run diffusers video pipeline ``pipe`` and stream its decode into one MP4 per video.

    ``pipeline_kwargs`` are the pipeline's own arguments (``prompt_embeds=…, num_frames=…,
    generator=…``), as ``pipe(**pipeline_kwargs)`` takes them; ``output_type`` is streamvae's. The frames
    are exactly those ``pipe(**pipeline_kwargs, output_type="np")`` returns for the same arguments and
    generator: the pipeline runs its own code up to ``vae.decode`` — the denoising loop, de-normalizing,
    unpacking, LTX-Video's decode-timestep noise from the call's generator — and streamvae decodes the
    latents it passes there, chunk by chunk, instead of ``vae.decode``. The decoded video never exists as
    one tensor. ``session_options`` is a dict of :class:`streamvae.SessionOptions` keywords (codec, audio,
    output files, …; ``value_range`` defaults to the decoder's): the bytes are those
    :func:`streamvae.decode_to_mp4` writes for those latents with those options.

    Works with any diffusers pipeline whose VAE :func:`streamvae.models.as_decoder` takes: WanPipeline,
    WanImageToVideoPipeline, HunyuanVideoPipeline, LTXPipeline, LTXImageToVideoPipeline,
    CogVideoXPipeline, …. Anything else is a TypeError naming it, before the pipeline runs; every other
    argument is checked at the call too.

    Threads: the pipeline runs in a worker thread, never on the event loop, and calls on one VAE take
    turns. Cancellation stops the denoising loop at the end of its current step (or before it starts),
    and the decode as :func:`streamvae.decode_to_mp4` does; the thread is never abandoned.
    """
    owner = "generate_mp4"
    options = _check(pipe, fps, session_options, pipeline_kwargs, owner=owner, output="mp4")
    captured = await _run_pipeline(pipe, pipeline_kwargs, owner)
    decoder = _decoder(pipe, captured, owner)
    options.check_batch(captured.latents.shape[0], owner=owner)
    return await decode_to_mp4(decoder, captured.latents, options=options)


def stream_generation(
    pipe: Any,
    *,
    fps: float,
    session_options: Mapping[str, Any] | None = None,
    **pipeline_kwargs: Any,
) -> AbstractAsyncContextManager[list[MP4ByteStream]]:
    """Run ``pipe`` as :func:`generate_mp4` does and give one byte stream per video while it decodes.

    ``async with stream_generation(pipe, fps=16, **kwargs) as streams:`` — entering the block runs the
    pipeline up to its decode (the denoising); inside it, each :class:`streamvae.MP4ByteStream` delivers
    its video's bytes as they are written, fragmented MP4 by default, exactly as
    :func:`streamvae.stream_mp4` does for the latents the pipeline passed to ``vae.decode`` (read the
    entries at once: see there). Leaving the block early cancels the decode; a cancellation while the
    block is being entered stops the denoising loop at its next step. Every argument is checked at the
    call, before the block is entered.
    """
    owner = "stream_generation"
    options = _check(pipe, fps, session_options, pipeline_kwargs, owner=owner, output="fragmented")
    return _streamed(pipe, pipeline_kwargs, options, owner)


@asynccontextmanager
async def _streamed(
    pipe: Any,
    pipeline_kwargs: Mapping[str, Any],
    options: SessionOptions,
    owner: str,
) -> AsyncIterator[list[MP4ByteStream]]:
    """The block of :func:`stream_generation`, over the arguments it checked."""
    captured = await _run_pipeline(pipe, pipeline_kwargs, owner)
    decoder = _decoder(pipe, captured, owner)
    options.check_batch(captured.latents.shape[0], owner=owner)
    async with stream_mp4(decoder, captured.latents, options=options) as streams:
        yield streams


def _check(
    pipe: Any,
    fps: object,
    session_options: object,
    pipeline_kwargs: Mapping[str, Any],
    *,
    owner: str,
    output: str,
) -> SessionOptions:
    """Check every argument of a call, before the pipeline runs: the pipeline and its VAE, its keywords,
    the fps and the session options (``value_range`` defaults to the VAE's decoder's)."""
    vae = check_pipeline(pipe, owner=owner)
    try:
        probe = as_decoder(vae, owner=owner)
    except TypeError:
        raise TypeError(
            f"{owner}: {type(pipe).__name__}'s VAE ({type(vae).__module__}.{type(vae).__qualname__}) is not "
            f"one streamvae decodes; pipelines whose VAE is one of {', '.join(supported_classes())} work"
        ) from None
    check_pipeline_kwargs(pipe, pipeline_kwargs, owner=owner)
    checked_fps = check_fps(fps, owner=owner)
    keywords = check_option_dict(session_options, owner=owner, reserved=("fps",))
    options = resolve_options(
        owner,
        None,
        {**keywords, "fps": checked_fps},
        value_range=probe.chunk_value_range,
        output=output,
    )
    return options


async def _run_pipeline(pipe: Any, pipeline_kwargs: Mapping[str, Any], owner: str) -> CapturedDecode:
    """Run the pipeline up to its decode in a worker thread of its own (never abandoned)."""
    result: list[CapturedDecode] = []

    def work() -> None:
        result.append(run_to_decode(pipe, pipeline_kwargs, owner=owner))

    await run_decode_worker(work, limiter=anyio.CapacityLimiter(1))
    return result[0]


def _decoder(pipe: Any, captured: CapturedDecode, owner: str) -> ChunkedDecoder:
    """The decoder of the pipeline's VAE, with the decode's other arguments (LTX-Video's ``temb``)."""
    return as_decoder(pipe.vae, owner=owner, **captured.decode_kwargs)
