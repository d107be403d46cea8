"""A diffusers video pipeline in one call: :func:`generate_mp4` and :func:`stream_generation`.

Both check every argument at the call — the pipeline's VAE first, then the pipeline itself against the
table of pipelines streamvae reproduces exactly (``_plans``), then its arguments and the session options —
and run the pipeline in a worker thread with streamvae in place of its ``vae.decode`` (``_capture``). A
pipeline that decodes once is stopped at its decode (or, when it makes sound after it, let go on to its
audio) and its latents decoded with :func:`streamvae.decode_to_mp4` / :func:`streamvae.stream_mp4`: the
same session, defaults and bytes as those give for those latents. A pipeline that decodes clip by clip
streams each clip into one session as the pipeline decodes it.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from math import inf
from typing import Any

import anyio
import torch

from streamvae._checks import check_fps
from streamvae._decode import decode_to_mp4, stream_mp4
from streamvae._decode_worker import call_on_loop, chunk_bridge, run_decode_worker
from streamvae._options import SessionOptions, resolve_option_dict
from streamvae._session import ChunkedVideoMP4Session
from streamvae._sinks import MP4ByteStream
from streamvae.models import ChunkedDecoder, ProtocolDecoder, as_decoder, supported_classes
from streamvae.pipelines._capture import (
    CapturedDecode,
    ClipSink,
    DecodedVideo,
    FirstFrames,
    WholeVideo,
    check_own_decoder,
    check_pipeline,
    check_pipeline_kwargs,
    run_clips,
    run_to_decode,
    run_whole,
)
from streamvae.pipelines._frames import run_frame_batches
from streamvae.pipelines._plans import PipelinePlan, find_plan, is_modular, own_decoder
from streamvae.pipelines._transforms import framed_decoder, in_session, run_in_session

__all__ = ["generate_mp4", "stream_generation"]

#: pieces each streamed entry buffers for its reader (as :func:`streamvae.stream_mp4`'s default)
_MAX_BUFFERED = 4


async def generate_mp4(
    pipe: Any,
    *,
    fps: float,
    session_options: Mapping[str, Any] | None = None,
    pipeline_fps: float | None = None,
    **pipeline_kwargs: Any,
) -> list[bytes]:
    """Run diffusers video pipeline ``pipe`` and stream its decode into one MP4 per video.

    ``pipeline_kwargs`` are the pipeline's own arguments (``prompt_embeds=…, num_frames=…,
    generator=…``), as ``pipe(**pipeline_kwargs)`` takes them; ``output_type`` (and a modular pipeline's
    ``output``) is streamvae's. The frames are exactly those ``pipe(**pipeline_kwargs, output_type="np")``
    returns for the same arguments and generator, after the pipeline's own trimming, and the pipeline's
    sound is each MP4's audio track:

    - the pipeline runs its own code up to ``vae.decode`` — the denoising loop, de-normalizing,
      unpacking, LTX-Video's decode-timestep noise from the call's generator — and streamvae decodes the
      latents it passes there, chunk by chunk, instead of ``vae.decode``; the decoded video never exists
      as one tensor;
    - a pipeline that decodes clip by clip (HeliosPipeline's chunks, WanAnimatePipeline's segments) has
      each clip decoded by streamvae as it asks for it, streamed at once and handed back to it (it
      conditions on it and keeps it, as it did before); the frames a later step may still trim wait for
      it, and at the end the frames written are checked, in number and order, against the video the
      pipeline returned: a difference is a RuntimeError, never a different video;
    - a pipeline that decodes its frames as a batch of images (AnimateDiff, I2VGenXL, PIA, text-to-video
      SD with an image VAE; Stable Video Diffusion), ``decode_chunk_size`` frames a ``vae.decode`` call,
      has each call decoded by streamvae and its frames streamed as soon as every video of the batch has
      them (one video: after each call), then checked against the video the pipeline returned;
    - a pipeline whose own model makes its video instead of ``vae.decode`` (LTX-2.5's diffusion decoder:
      LTX2VideoDiffusionDecodePipeline, which needs no VAE, and the modular LTX25AutoBlocks) has that
      model decode as its code calls it, and streamvae encodes the video it made chunk by chunk: a
      diffusion model that denoises every frame together, its video is one tensor, and the first byte
      leaves once it is whole;
    - a pipeline whose video is final only at its end (Kandinsky6SRPipeline, which blends its decoded
      tiles, each over every frame, into one canvas) runs to its end as its own code runs, and streamvae
      encodes the video it returned chunk by chunk: the first byte leaves after the whole run;
    - sound (LTX2Pipeline's vocoder output, MiniMax-H3's stereo soundtrack at its sampling rate) is
      muxed as ``audio_waveforms`` is. An ``audio_waveforms`` of your own in ``session_options`` replaces
      it (and the pipeline's audio decode is skipped).

    ``fps`` is the video's frame rate; it never reaches the pipeline. ``pipeline_fps`` is the pipeline's own
    ``fps`` argument, for the pipelines that take one (Stable Video Diffusion and Cosmos condition on it):
    ``generate_mp4(svd, fps=7, pipeline_fps=7, image=...)`` is ``svd(image=..., fps=7)`` written at 7 fps.
    Left out, the pipeline sees its own default, as ``pipe(**pipeline_kwargs)`` would; a pipeline without
    an ``fps`` argument refuses it (TypeError).

    ``session_options`` is a dict of :class:`streamvae.SessionOptions` keywords (codec, audio, output
    files, …; ``value_range`` defaults to the decoder's): for a pipeline that decodes once the bytes are
    those :func:`streamvae.decode_to_mp4` writes for its latents with those options.

    Works with the pipelines streamvae has checked frame for frame: 90 of diffusers 0.42.1's 92 video
    pipelines, standard and modular (docs/pipelines.md lists them, with when each one's first byte can
    leave, and why the other two are refused: EasyAnimate control, which diffusers itself cannot run, and
    LTX-2 HDR, whose linear light no 8-bit MP4 holds). Anything else is a TypeError naming why, before the
    pipeline runs — the VAE first
    (one :func:`streamvae.models.as_decoder` does not take), then the pipeline; a call with an option
    value its plan refuses (docs/pipelines.md names them) is a ValueError naming it. Every other argument
    is checked at the call too.

    Threads: the pipeline runs in a worker thread, never on the event loop, and calls on one VAE take
    turns; what stands in for ``vae.decode`` acts in that thread only (another thread's ``vae.decode``
    is its own). Cancellation stops the denoising loop before its next model forward or at the end of its
    current step (or before it starts), and the decode as :func:`streamvae.decode_to_mp4` does; the thread
    is never abandoned.
    """
    owner = "generate_mp4"
    call, options = _check(
        pipe, fps, session_options, pipeline_kwargs, owner=owner, output="mp4", pipeline_fps=pipeline_fps
    )
    if _runs_as_producer(call.plan):
        async with ChunkedVideoMP4Session(options=options) as session:
            sink = ClipSink(chunk_bridge(session, owner), functools.partial(session.check_batch, owner=owner))
            await _run_clips(call, sink)
            return await session.finish()
    captured, options = await _run_once(call, options)
    decoder = _decoder(call, captured)
    return await decode_to_mp4(decoder, captured.latents, options=options)


def stream_generation(
    pipe: Any,
    *,
    fps: float,
    session_options: Mapping[str, Any] | None = None,
    pipeline_fps: float | None = None,
    **pipeline_kwargs: Any,
) -> AbstractAsyncContextManager[list[MP4ByteStream]]:
    """Run ``pipe`` as :func:`generate_mp4` does and give one byte stream per video while it decodes.

    ``async with stream_generation(pipe, fps=16, **kwargs) as streams:`` — each
    :class:`streamvae.MP4ByteStream` delivers its video's bytes as they are written, fragmented MP4 by
    default (read the entries at once: see :func:`streamvae.stream_mp4`). For a pipeline that decodes
    once, entering the block runs the pipeline up to its decode (the denoising), and the bytes are
    exactly those :func:`streamvae.stream_mp4` streams for its latents (for one whose own model makes
    its video, LTX-2.5's diffusion decoder, entering it runs that model's decode too, and the bytes are
    those of the video it made; for one whose video is final only at its end, Kandinsky 6 SR, entering it
    runs the whole pipeline, and the bytes are those of the video it returned). For one
    that decodes clip by clip
    (Helios, Wan-Animate), the block is entered at its first decode, and each clip's bytes leave while
    the pipeline generates the next: the first bytes come before its last denoising step. For one that
    decodes a few frames a ``vae.decode`` call (AnimateDiff, Stable Video Diffusion, …), the block is
    entered when its decode starts, and each call's frames leave as it is decoded. Leaving the
    block early cancels the pipeline and the decode; a cancellation while the block is being entered stops
    the denoising loop at its next step. Every argument is checked at the call, before the block is
    entered.
    """
    owner = "stream_generation"
    call, options = _check(
        pipe,
        fps,
        session_options,
        pipeline_kwargs,
        owner=owner,
        output="fragmented",
        pipeline_fps=pipeline_fps,
    )
    if _runs_as_producer(call.plan):
        return _streamed_clips(call, options)
    return _streamed_once(call, options)


@dataclass(frozen=True)
class _Call:
    """One checked call: the pipeline, its plan, its own keywords and the function the user called."""

    pipe: Any
    plan: PipelinePlan
    kwargs: Mapping[str, Any]
    owner: str


@asynccontextmanager
async def _streamed_once(call: _Call, options: SessionOptions) -> AsyncIterator[list[MP4ByteStream]]:
    """The block of :func:`stream_generation` for a pipeline that decodes once."""
    captured, options = await _run_once(call, options)
    decoder = _decoder(call, captured)
    async with stream_mp4(decoder, captured.latents, options=options) as streams:
        yield streams


@asynccontextmanager
async def _streamed_clips(call: _Call, options: SessionOptions) -> AsyncIterator[list[MP4ByteStream]]:
    """The block of :func:`stream_generation` for a pipeline that decodes clip by clip: the pipeline is
    the session's producer, and the block is entered once its first decode opened the streams."""
    owner = call.owner
    session = ChunkedVideoMP4Session(options=options)
    streams: list[MP4ByteStream] = []
    opened = anyio.Event()
    failed: list[BaseException] = []

    async def open_streams(batch: int) -> None:
        session.check_batch(batch, owner=owner)
        streams.extend(session.open_stream(entry, max_buffered=_MAX_BUFFERED) for entry in range(batch))
        opened.set()

    def on_batch(batch: int) -> None:
        call_on_loop(open_streams, batch, owner=owner)

    async def produce() -> None:
        try:
            sink = ClipSink(chunk_bridge(session, owner), on_batch)
            await _run_clips(call, sink)
            # a block left while the pipeline ran on to its end (its last frames fitted the
            # buffers) has closed the session: the cancellation is what ends this producer, not finish()
            await anyio.lowlevel.checkpoint_if_cancelled()
            await session.finish()
        except BaseException as error:
            failed.append(error)
            raise
        finally:
            opened.set()

    async with session, session.producing(produce, streams):
        await opened.wait()
        if not streams:
            # The pipeline ended before its first decode: its error is the block's.
            raise failed[0] if failed else RuntimeError(f"{owner}: the pipeline ended without decoding")
        yield streams


def _check(
    pipe: Any,
    fps: object,
    session_options: object,
    pipeline_kwargs: Mapping[str, Any],
    *,
    owner: str,
    output: str,
    pipeline_fps: object = None,
) -> tuple[_Call, SessionOptions]:
    """Check every argument of a call, before the pipeline runs: the pipeline's VAE, the pipeline, its
    keywords (``pipeline_fps`` among them, as its ``fps``), the fps and the session options
    (``value_range`` defaults to the VAE's decoder's)."""
    own = own_decoder(pipe)  # a model of its own makes its video: it may have no VAE
    vae = check_pipeline(pipe, owner=owner) if own is None else check_own_decoder(pipe, own, owner=owner)
    try:
        probe = as_decoder(vae, owner=owner)
    except TypeError:
        raise TypeError(
            f"{owner}: {type(pipe).__name__}'s VAE ({type(vae).__module__}.{type(vae).__qualname__}) is not "
            f"one streamvae decodes; pipelines whose VAE is one of {', '.join(supported_classes())} work"
        ) from None
    plan = find_plan(pipe, pipeline_kwargs, owner=owner)
    pipeline_kwargs = _with_pipeline_fps(pipe, pipeline_kwargs, pipeline_fps, owner=owner)
    check_pipeline_kwargs(pipe, plan, pipeline_kwargs, owner=owner)
    checked_fps = check_fps(fps, owner=owner)
    options = resolve_option_dict(
        owner,
        session_options,
        reserved=("fps",),
        given={"fps": checked_fps},
        # a pipeline's own output video is in [0, 1]
        value_range=WholeVideo.chunk_value_range if plan.whole_output else probe.chunk_value_range,
        output=output,
    )
    if options.audio_channels is not None:
        raise ValueError(
            f"{owner}: session_options: audio_channels is a live audio track for your own pushes; the "
            "pipeline's sound comes from the pipeline (leave it out)"
        )
    if plan.clips is not None and options.audio_waveforms is None and plan.sound is not None:
        raise TypeError(f"{owner}: {plan.name} decodes clip by clip and makes sound: streamvae cannot mux it")
    if options.audio_waveforms is None and plan.sound is not None and plan.sound.silent is not None:
        silent = plan.sound.silent(pipeline_kwargs, pipe)
        if silent is not None:  # refused now, not once the whole run found no soundtrack to mux
            raise ValueError(f"{owner}: {silent}")
    if options.provenance is not None:
        # The Content Credentials name the pipeline streamvae ran (its class), beside streamvae itself.
        options = dataclasses.replace(options, provenance=options.provenance.ran(type(pipe).__name__))
    batch = _batch_of_call(pipe, pipeline_kwargs)
    if batch is not None:
        options.check_batch(batch, owner=owner)
    return _Call(pipe, plan, pipeline_kwargs, owner), options


def _batch_of_call(pipe: Any, kwargs: Mapping[str, Any]) -> int | None:
    """The videos ``pipe(**kwargs)`` will make, as diffusers' video pipelines count them (prompts, else
    ``prompt_embeds``' first dimension, × ``num_videos_per_prompt``), so that options made for another
    batch (``output_files``, ``audio_waveforms``) are refused before the first denoising step rather than
    after the last. None where the call does not say it plainly (a modular pipeline, a pipeline without
    those arguments, a value the pipeline itself will refuse, a pipeline that sets the argument aside): the
    batch is then checked at the decode."""
    try:
        parameters = inspect.signature(pipe).parameters
    except (TypeError, ValueError):
        return None
    if "prompt" not in parameters or "num_videos_per_prompt" not in parameters:
        return None
    pipeline_class: type = type(pipe)
    if not _honours_videos_per_prompt(pipeline_class):
        return None
    per_prompt = kwargs.get("num_videos_per_prompt", parameters["num_videos_per_prompt"].default)
    if isinstance(per_prompt, bool) or not isinstance(per_prompt, int) or per_prompt < 1:
        return None
    prompt = kwargs.get("prompt")
    embeds = kwargs.get("prompt_embeds")
    if isinstance(prompt, str):
        prompts = 1
    elif isinstance(prompt, list) and prompt:
        prompts = len(prompt)
    elif prompt is None and isinstance(embeds, torch.Tensor) and embeds.ndim > 0:
        prompts = int(embeds.shape[0])
    else:
        return None
    return prompts * per_prompt


@functools.cache
def _honours_videos_per_prompt(pipeline_class: type) -> bool:
    """Whether ``pipeline_class.__call__`` uses the ``num_videos_per_prompt`` it is given, read from its
    code: some of diffusers' video pipelines take the argument but set it to 1 first (the CogVideoX and
    AnimateDiff families, Allegro, ConsisID, PIA, Wan and SkyReels-V2 video-to-video), so their batch is
    their prompts'. False where the code cannot be read: the batch is then checked at the decode."""
    try:
        source = textwrap.dedent(inspect.getsource(pipeline_class.__call__))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        else:
            continue
        if any(isinstance(target, ast.Name) and target.id == "num_videos_per_prompt" for target in targets):
            return False
    return True


def _with_pipeline_fps(
    pipe: Any, pipeline_kwargs: Mapping[str, Any], pipeline_fps: object, *, owner: str
) -> Mapping[str, Any]:
    """The pipeline's keywords with ``pipeline_fps`` as its own ``fps`` (Stable Video Diffusion's and
    Cosmos' frame-rate conditioning), which the video's ``fps=`` keyword cannot be; unchanged without one.
    A ValueError unless it is a positive number, a TypeError if the pipeline takes no ``fps``."""
    if pipeline_fps is None:
        return pipeline_kwargs
    if (
        isinstance(pipeline_fps, bool)
        or not isinstance(pipeline_fps, (int, float))
        or not 0 < pipeline_fps < inf
    ):
        raise ValueError(
            f"{owner}: pipeline_fps must be a positive number of frames per second (the pipeline's own fps "
            f"argument), got {pipeline_fps!r}"
        )
    if not is_modular(pipe) and "fps" not in inspect.signature(pipe).parameters:
        raise TypeError(
            f"{owner}: pipeline_fps is the pipeline's own fps argument, and {type(pipe).__name__} takes none "
            "(the video's frame rate is fps=)"
        )
    return {**pipeline_kwargs, "fps": pipeline_fps}


async def _run_once(call: _Call, options: SessionOptions) -> tuple[CapturedDecode, SessionOptions]:
    """Run a pipeline that decodes once up to its decode in a worker thread of its own (never abandoned)
    — to its end when its sound is wanted — and return what it passed there, with the options that carry
    its sound. The batch is checked against the options."""
    # A modular pipeline goes on past its decode even without sound: its blocks log an exception that
    # stops them as an ERROR, with its traceback, before passing it on.
    pipe, plan, owner = call.pipe, call.plan, call.owner
    go_on = plan.modular or (plan.sound is not None and options.audio_waveforms is None)
    result: list[CapturedDecode] = []

    def work() -> None:
        if plan.whole_output:  # run to its end, its output video encoded
            result.append(run_whole(pipe, plan, call.kwargs, owner=owner))
            return
        result.append(run_to_decode(pipe, call.kwargs, owner=owner, plan=plan, go_on=go_on))

    await run_decode_worker(work, limiter=_own_limiter())
    captured = result[0]
    if plan.sound is not None and options.audio_waveforms is None:
        waveforms, sample_rate = plan.sound.read(captured.output, pipe)
        tracks = tuple(waveform.detach().float().cpu().numpy() for waveform in waveforms)
        options = dataclasses.replace(options, audio_waveforms=tracks, audio_sample_rate=sample_rate)
    options.check_batch(captured.latents.shape[0], owner=owner)
    return captured, options


def _runs_as_producer(plan: PipelinePlan) -> bool:
    """Whether the pipeline runs as its session's producer, its decodes streamed by :func:`_run_clips` (it
    decodes clip by clip, joins or blends several decodes, or decodes a few frames a ``vae.decode``
    call), rather than being stopped at its one decode by :func:`_run_once`."""
    return plan.clips is not None or in_session(plan) or plan.frame_batches is not None


async def _run_clips(call: _Call, sink: ClipSink) -> None:
    """Run a pipeline that runs as its session's producer (:func:`_runs_as_producer`) in a worker thread
    of its own (never abandoned)."""
    if call.plan.frame_batches is not None:  # a few frames a vae.decode call
        run = run_frame_batches
    elif in_session(call.plan):  # several decodes, joined or blended
        run = run_in_session
    else:
        run = run_clips
    await run_decode_worker(run, call.pipe, call.plan, call.kwargs, sink, call.owner, limiter=_own_limiter())


def _own_limiter() -> anyio.CapacityLimiter:
    """One worker thread for one call's pipeline (never anyio's default limiter)."""
    return anyio.CapacityLimiter(1)


def _decoder(call: _Call, captured: CapturedDecode) -> ChunkedDecoder:
    """The decoder of the pipeline's VAE, with the decode's other arguments (LTX-Video's ``temb``), cut
    to the frames the pipeline keeps of its decode."""
    if call.plan.decodes_itself is not None:  # the video its own model made, a chunk at a time
        return as_decoder(DecodedVideo(), owner=call.owner)
    if call.plan.whole_output:  # the video the pipeline returned, a chunk at a time
        return as_decoder(WholeVideo(), owner=call.owner)
    decoder = as_decoder(call.pipe.vae, owner=call.owner, **captured.decode_kwargs)
    decoder = framed_decoder(decoder, call.plan, call.kwargs, call.pipe, owner=call.owner)
    if call.plan.keep_frames is None:
        return decoder
    keep = call.plan.keep_frames(call.kwargs, call.pipe)
    return ProtocolDecoder(FirstFrames(decoder, keep, owner=call.owner))
