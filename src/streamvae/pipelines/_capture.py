"""Running a diffusers pipeline with streamvae in place of its ``vae.decode``.

Every diffusers video pipeline ends the same way: the denoising loop, then the steps that turn its latents
into what the VAE decodes (de-normalizing, unpacking packed latents, dropping padding frames, permuting
frames-first latents, LTX's decode-timestep noise drawn from the call's own generator), then
``vae.decode(latents, …)`` and the post-processing of the decoded video. Those middle steps differ per
family and change between diffusers releases; re-implementing them would make streamvae's frames drift
from the pipeline's own whenever diffusers moves. So the pipeline runs its own code, and streamvae stands
in for ``vae.decode`` for the duration of the call. What the stand-in does is the pipeline's plan
(``_plans``):

- **a pipeline that decodes once** (:func:`run_to_decode`): the stand-in records the arguments (the
  latents, LTX's ``temb``) and stops the pipeline right there, before anything is decoded; streamvae then
  decodes those latents itself, chunk by chunk. A pipeline that makes sound after its video decode (LTX-2,
  MiniMax-H3) is not stopped: the stand-in hands back a one-pixel placeholder of the video, so the
  pipeline goes on to its audio decode and returns its soundtrack; its video output is the placeholder's,
  and is dropped. The decoded video never exists as one tensor either way.
- **a pipeline whose own model makes its video** (LTX-2.5's diffusion decoder): the same
  run, the stand-in in that model's ``decode``: it lets the model decode, as the pipeline calls it, and
  captures the video it made (one tensor: the model denoises every frame together) in place of latents,
  which streamvae then writes chunk by chunk (:class:`DecodedVideo`).
- **a pipeline whose video is final only at its end** (Kandinsky 6 SR, which blends its
  decoded tiles into one canvas): no stand-in; the pipeline runs to its end (:func:`run_whole`), and
  streamvae writes the video it returned chunk by chunk (:class:`WholeVideo`).
- **a pipeline that decodes clip by clip** (:func:`run_clips`): each call is decoded by streamvae, its
  chunks streamed at once, and the decoded clip handed back to the pipeline (which conditions on it, and
  keeps it as it always did). Only the frames a later step can still cut are held back
  (:class:`ClipKeeper`); at the end, the frames sent must be, in number and order, those the pipeline
  returned, or the call fails.

The design notes:

- **The stand-in is the call's own.** It is an attribute of the VAE instance for the call, but it acts
  only in the pipeline's worker thread: any other thread calling ``vae.decode`` meanwhile gets the VAE's
  ordinary decode. Calls on one VAE still take turns on a lock (a pipeline keeps per-call state on itself:
  ``_guidance_scale``, ``_interrupt``, …), waited for in the worker thread with a short poll so that a
  cancelled caller stops waiting.
- **Cancellation stops the denoising at its next step.** diffusers' ``interrupt`` only skips the remaining
  steps (the pipeline still goes on to ``vae.decode``, and ``__call__`` resets it when it starts), so
  streamvae checks for a cancelled caller before every forward of the pipeline's models (a forward
  pre-hook that acts in the worker thread only: it works for pipelines without ``callback_on_step_end``,
  such as HunyuanVideo 1.5's and every modular one), and at the end of each step where the pipeline takes
  a ``callback_on_step_end`` (the user's own still runs, at every step). Raising there ends the call: the
  pipelines do not catch it. A cancellation before the call is seen before the pipeline starts; one during
  the last step, by the stand-in.
- **Nothing of the pipeline outlives the call.** The stand-in and the hooks are removed in ``finally`` (an
  instance attribute ``decode`` that was there before is put back), the exception that carried the latents
  out is dropped with its traceback (which holds every local of the denoising loop), and the pipeline's
  ``maybe_free_model_hooks`` runs as it would have after ``vae.decode`` (offloaded models go back).
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import types
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from streamvae._decode_worker import check_abandoned, run_decode
from streamvae._quantize import PerChannelRange, ValueRange
from streamvae.models import ChunkedDecoder, as_decoder
from streamvae.pipelines._plans import PipelinePlan, find_plan

__all__ = [
    "CapturedDecode",
    "ClipKeeper",
    "ClipSink",
    "DecodedVideo",
    "DecoderWrapper",
    "FirstFrames",
    "WholeVideo",
    "call_pipeline",
    "check_fingerprints",
    "check_own_decoder",
    "check_pipeline",
    "check_pipeline_kwargs",
    "decode_each_call",
    "decode_result",
    "run_clips",
    "run_to_decode",
    "run_whole",
    "video_output",
]

#: seconds between looks at a cancelled caller while waiting for another call on the same VAE
_TURN_POLL_SECONDS = 0.05
#: how far a returned frame's per-channel mean may be from the one streamvae sent at that place: just over
#: one 8-bit level (1/255), as Cosmos 2.5 Transfer truncates its decoded frames to uint8 and back (each
#: mean drops by up to a level); the same pixels give the same means to float rounding, another frame is
#: far off
FINGERPRINT_TOLERANCE = 4e-3

_turns_lock = threading.Lock()
_turns: weakref.WeakKeyDictionary[Any, threading.Lock] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class CapturedDecode:
    """What a pipeline passed to ``vae.decode``, and what it returned when it went on past it."""

    #: the latents ``vae.decode`` was called with, as the pipeline prepared them
    latents: Tensor
    #: the decode's other arguments that differ from their defaults (LTX-Video's ``temb``, …)
    decode_kwargs: Mapping[str, Any]
    #: what the pipeline returned, when it was let go on past its decode (its sound); else None
    output: Any = None


@dataclass(frozen=True)
class ClipSink:
    """Where :func:`run_clips` sends what it decodes: a session's chunk bridge, and what to do when the
    batch is first known (check it, open the streams), both called in the worker thread."""

    push: Callable[[Tensor], None]
    on_batch: Callable[[int], None]


class DecoderWrapper:
    """Base of a :class:`streamvae.SupportsChunkedVAEDecode` that publishes ``decoder``'s decode as a
    pipeline changes it (cut, framed, decoded apart): its value range, latent channels and latent
    preparation are ``decoder``'s; a subclass writes ``decode_with_chunks``."""

    def __init__(self, decoder: ChunkedDecoder) -> None:
        self.decoder = decoder
        self.chunk_value_range = decoder.chunk_value_range
        self.latent_channels = decoder.latent_channels

    def prepare_latents(self, z: Tensor) -> Tensor:
        return self.decoder.prepare_latents(z)

    def decode_with_chunks(self, z: Tensor, *, on_chunk: Callable[[Tensor], None]) -> None:
        raise NotImplementedError(f"{type(self).__name__} implements no decode_with_chunks")


class FirstFrames(DecoderWrapper):
    """A :class:`streamvae.SupportsChunkedVAEDecode` that publishes the first ``frames`` frames of
    ``decoder``'s decode and stops it there: a pipeline that cuts its decoded video (Allegro's
    ``video[:, :, :num_frames]``). A decode that gives fewer is a RuntimeError, not a shorter video."""

    def __init__(self, decoder: ChunkedDecoder, frames: int, *, owner: str) -> None:
        super().__init__(decoder)
        self.frames, self.owner = frames, owner

    def decode_with_chunks(self, z: Tensor, *, on_chunk: Callable[[Tensor], None]) -> None:
        left = self.frames

        def first(chunk: Tensor) -> None:
            nonlocal left
            if left == 0:
                raise _Enough  # ends the decode at its next step: nothing after this is kept
            take = min(left, chunk.shape[2])
            left -= take
            on_chunk(chunk if take == chunk.shape[2] else chunk[:, :, :take])

        try:
            self.decoder.decode_with_chunks(z, on_chunk=first)
        except _Enough:
            return
        if left:
            raise RuntimeError(
                f"{self.owner}: the pipeline keeps {self.frames} frames of its decode, which gave "
                f"{self.frames - left}"
            )


class _Enough(Exception):
    """Raised by :class:`FirstFrames`' ``on_chunk`` once every frame the pipeline keeps was published."""


class _ReachedDecode(Exception):
    """Raised by the stand-in for ``vae.decode``: carries its arguments out of the pipeline."""

    def __init__(self, captured: CapturedDecode) -> None:
        super().__init__("the pipeline reached vae.decode")
        self.captured = captured


# -- the door --


def check_pipeline(pipe: object, *, owner: str) -> Any:
    """``pipe``'s VAE if ``pipe`` is a diffusers pipeline (standard or modular) with one, else a TypeError
    naming it. Whether streamvae decodes that VAE, and reproduces that pipeline, are the caller's checks
    (``streamvae.models.as_decoder``, ``_plans.find_plan``), in that order."""
    described = f"{type(pipe).__module__}.{type(pipe).__qualname__}"
    vae = getattr(pipe, "vae", None)
    if vae is None or not callable(getattr(vae, "decode", None)) or not callable(pipe):
        raise TypeError(
            f"{owner}: pipe must be a diffusers pipeline with a VAE (WanPipeline, HeliosPipeline, "
            f"LTX2Pipeline, MiniMax-H3's ModularPipeline, …), got {described}"
        )
    return vae


def check_pipeline_kwargs(
    pipe: Any, plan: PipelinePlan, pipeline_kwargs: Mapping[str, Any], *, owner: str
) -> None:
    """A TypeError naming ``owner`` unless ``pipe(**pipeline_kwargs)`` takes these arguments; a ValueError
    for the arguments streamvae chooses itself (``output_type``, and a modular pipeline's ``output`` and
    ``state``: the pipeline must reach ``vae.decode`` and give back what streamvae reads)."""
    for name in ("output_type", *(("output", "state") if plan.modular else ("return_dict",))):
        if name in pipeline_kwargs:
            raise ValueError(
                f"{owner}: {name} is streamvae's to choose (the pipeline's latents are decoded into MP4s); "
                f"leave it out, got {name}={pipeline_kwargs[name]!r}"
            )
    if plan.modular:
        known = {param.name for param in pipe.blocks.inputs if param.name is not None}
        unknown = sorted(set(pipeline_kwargs) - known)
        if unknown:
            raise TypeError(
                f"{owner}: {plan.name} takes no input {', '.join(map(repr, unknown))}; its inputs are "
                f"{', '.join(sorted(known))}"
            )
    else:
        try:
            inspect.signature(pipe).bind(**pipeline_kwargs)
        except TypeError as error:
            raise TypeError(f"{owner}: {type(pipe).__name__}() {error}") from None
    callback = pipeline_kwargs.get("callback_on_step_end")
    if callback is not None and not callable(callback):
        raise TypeError(f"{owner}: callback_on_step_end must be callable, got {type(callback).__name__}")


# -- the runs --


def run_to_decode(
    pipe: Any,
    pipeline_kwargs: Mapping[str, Any],
    *,
    owner: str,
    plan: PipelinePlan | None = None,
    go_on: bool = False,
) -> CapturedDecode:
    """Worker thread: run ``pipe(**pipeline_kwargs)`` up to its ``vae.decode`` call and return what it
    passed there, having decoded nothing. With ``go_on`` (a pipeline whose sound comes after its video
    decode), the pipeline gets a placeholder video and runs to its end; its output is returned too.

    Raises :class:`streamvae._decode_worker.DecodeAbandoned` (through ``check_abandoned``) when the caller
    was cancelled, before the pipeline starts, before a model's forward, at the end of a denoising step,
    or at the decode; the pipeline's own errors as they are; a RuntimeError when the pipeline returned
    without decoding, or called ``vae.decode`` more than once.
    """
    if plan is None:
        plan = find_plan(pipe, pipeline_kwargs, owner=owner)
    vae = pipe.vae
    calls: list[CapturedDecode] = []
    own_decode = _own_decode(pipe, plan, owner)  # None where its VAE decodes

    def stand_in(latents: Tensor, extra: Mapping[str, Any], return_dict: bool) -> Any:
        check_abandoned(owner)  # a cancellation during the last denoising step
        if own_decode is not None:  # what is captured is the video its own model made
            latents, extra = own_decode(latents, extra), {}
        captured = CapturedDecode(latents, extra)
        if not go_on:
            raise _ReachedDecode(captured)
        if calls:
            raise RuntimeError(f"{owner}: {plan.name} called vae.decode a second time; it decodes once")
        calls.append(captured)
        frames = None if own_decode else as_decoder(vae, owner=owner, **extra).output_frames(latents.shape[2])
        shape = (latents.shape[0], 3, latents.shape[2] if frames is None else frames, 1, 1)
        placeholder = torch.zeros(shape, dtype=latents.dtype, device=latents.device)
        return decode_result(placeholder, return_dict)

    try:
        output = call_pipeline(pipe, plan, pipeline_kwargs, stand_in, owner=owner)
    except _ReachedDecode as reached:
        captured = reached.captured
        # Its traceback holds every local of the denoising loop: let go of it now.
        reached.__traceback__ = None
        _free_model_hooks(pipe)  # what the pipeline does after its decode (offloaded models go back)
        return captured
    if not calls:
        raise RuntimeError(
            f"{owner}: {type(pipe).__name__} returned without calling vae.decode: nothing to decode"
        )
    return CapturedDecode(calls[0].latents, calls[0].decode_kwargs, output)


def run_clips(
    pipe: Any, plan: PipelinePlan, pipeline_kwargs: Mapping[str, Any], sink: ClipSink, owner: str
) -> None:
    """Worker thread: run a pipeline that decodes clip by clip, streamvae decoding and streaming each clip
    as the pipeline asks for it and handing the decoded clip back; then check that what was sent is, in
    number and order, the video the pipeline returned (a RuntimeError if not)."""
    keeper = ClipKeeper(plan, pipeline_kwargs, pipe, sink, owner)
    start, end = keeper.start_clip, keeper.end_clip
    video = decode_each_call(pipe, plan, pipeline_kwargs, start=start, take=keeper.take, end=end, owner=owner)
    keeper.finish(video)


def decode_each_call(
    pipe: Any,
    plan: PipelinePlan,
    pipeline_kwargs: Mapping[str, Any],
    *,
    start: Callable[[int, ValueRange], None],
    take: Callable[[Tensor], None],
    end: Callable[[], None],
    owner: str,
) -> Tensor:
    """Worker thread: run a pipeline that decodes call by call (clips, sections), streamvae decoding each
    ``vae.decode`` call as the pipeline makes it and handing the decoded video back; return the pipeline's
    ``[B, F, C, H, W]`` video. Each chunk goes to ``take`` as it is published: ``start(batch, value range)``
    before a call's first, ``end()`` after its last."""
    vae = pipe.vae

    def stand_in(latents: Tensor, extra: Mapping[str, Any], return_dict: bool) -> Any:
        decoder = as_decoder(vae, owner=owner, **extra)
        start(latents.shape[0], decoder.chunk_value_range)
        pieces: list[Tensor] = []

        def on_chunk(chunk: Tensor) -> None:
            pieces.append(chunk)
            take(chunk)

        run_decode(decoder, latents, on_chunk, owner)
        end()
        return decode_result(torch.cat(pieces, dim=2), return_dict)

    return video_output(plan, call_pipeline(pipe, plan, pipeline_kwargs, stand_in, owner=owner))


class ClipKeeper:
    """Worker thread: which decoded frames of each clip the pipeline keeps, sent as soon as they are final.

    The pipeline returns ``cat(kept clips)[:final_length(kept)]`` (its plan): a clip's first
    ``drop_front`` frames are never kept, and of the frames kept so far the first
    ``final_length(kept)`` are in the output whatever follows (a later chunk only adds frames). Those are
    pushed as their chunk arrives; the rest (Helios's last few frames, which the final trim may cut) wait
    for the next chunk or for the end. Each frame sent leaves a fingerprint (its per-channel mean in
    [0, 1]) to check the pipeline's output against.
    """

    def __init__(
        self, plan: PipelinePlan, kwargs: Mapping[str, Any], pipe: Any, sink: ClipSink, owner: str
    ) -> None:
        assert plan.clips is not None
        self._clips = plan.clips
        self._plan, self._kwargs, self._pipe, self._sink, self._owner = plan, kwargs, pipe, sink, owner
        self._call = 0
        self._kept = 0  # frames kept so far: sent and held
        self._sent = 0
        self._held: list[Tensor] = []  # kept frames not yet final, in order
        self._fingerprints: list[Tensor] = []  # [B, C] per frame sent or held, float32, on the CPU
        self._batch: int | None = None
        self._value_range: ValueRange = (-1.0, 1.0)
        self._drop = 0  # frames of the current clip still to drop
        self._final = 0  # frames that are in the output whatever follows

    def start_clip(self, batch: int, value_range: ValueRange) -> None:
        if self._batch is None:
            self._batch = batch
            self._sink.on_batch(batch)
        self._value_range = value_range
        self._drop = self._clips.drop_front(self._call, self._kwargs, self._pipe)

    def take(self, chunk: Tensor) -> None:
        if self._drop:
            dropped = min(self._drop, chunk.shape[2])
            self._drop -= dropped
            chunk = chunk[:, :, dropped:]
        if chunk.shape[2] == 0:
            return
        if self._clips.crop is not None:  # the region of each frame the pipeline keeps
            top, left, height, width = self._clips.crop(self._kwargs, self._pipe, *chunk.shape[3:])
            chunk = chunk[:, :, :, top : top + height, left : left + width]
        self._fingerprints.extend(fingerprints(chunk, self._value_range))
        self._kept += chunk.shape[2]
        self._held.append(chunk)
        # Whatever follows, the output keeps at least this many (a later clip only adds frames).
        final = self._clips.final_length(self._kept, self._kwargs, self._pipe)
        self._final = max(self._final, min(final, self._kept))
        self._release()

    def end_clip(self) -> None:
        self._call += 1

    def finish(self, video: Tensor) -> None:
        """Send what the pipeline's output keeps of the held frames; check the output against the frames
        sent. ``video`` is the pipeline's ``[B, F, C, H, W]`` output in [0, 1]."""
        returned = video.shape[1]
        described = f"{self._owner}: {self._plan.name} returned {returned} frames"
        if self._batch is None:
            raise RuntimeError(f"{described} without calling vae.decode: nothing was decoded")
        if not self._sent <= returned <= self._kept:
            raise RuntimeError(
                f"{described}, but streamvae had {'sent' if returned < self._sent else 'decoded'} "
                f"{self._sent if returned < self._sent else self._kept} frames it keeps: its plan does not "
                "match this pipeline's code, and the video written would not be the pipeline's"
            )
        self._final = returned
        self._release()
        check_fingerprints(video, self._fingerprints[:returned], described, changed="after vae.decode")

    def _release(self) -> None:
        """Push the held frames, in order, up to the final count."""
        while self._held and self._sent < self._final:
            chunk = self._held[0]
            take = min(chunk.shape[2], self._final - self._sent)
            if take == chunk.shape[2]:
                self._held.pop(0)
            else:
                self._held[0] = chunk[:, :, take:]
                chunk = chunk[:, :, :take]
            self._sink.push(chunk)
            self._sent += take


def check_fingerprints(video: Tensor, sent: list[Tensor], described: str, *, changed: str) -> None:
    """A RuntimeError unless every frame of the pipeline's ``video`` (``[B, F, C, H, W]`` in [0, 1]) is the
    frame streamvae sent at its place, to :data:`FINGERPRINT_TOLERANCE`: ``sent`` holds their
    :func:`fingerprints`, one per frame. The message starts with ``described`` and says the pipeline
    changed its decoded frames as ``changed`` says."""
    means = video.float().mean(dim=(3, 4)).cpu()  # [B, F, C]
    far = (means - torch.stack(sent, dim=1)).abs().amax(dim=(0, 2)) > FINGERPRINT_TOLERANCE
    if bool(far.any()):
        first = int(far.nonzero()[0])
        raise RuntimeError(
            f"{described}, and its frame {first} is not the frame streamvae sent there: the pipeline "
            f"changed its decoded frames {changed}, and the video written is not the pipeline's"
        )


def fingerprints(chunk: Tensor, value_range: ValueRange) -> list[Tensor]:
    """Per frame of a BCTHW chunk, its per-channel mean as the pipeline's output holds it (in [0, 1])."""
    x = chunk.detach().float()
    if isinstance(value_range, PerChannelRange):
        mean = torch.tensor(value_range.mean, device=x.device).view(1, -1, 1, 1, 1)
        std = torch.tensor(value_range.std, device=x.device).view(1, -1, 1, 1, 1)
        unit = (x * std + mean).clamp(0, 1)
    else:
        low, high = value_range
        unit = ((x - low) / (high - low)).clamp(0, 1)
    means = unit.mean(dim=(3, 4)).cpu()  # [B, C, T]
    return list(means.unbind(dim=2))


# -- one call of the pipeline --


def call_pipeline(
    pipe: Any,
    plan: PipelinePlan,
    pipeline_kwargs: Mapping[str, Any],
    stand_in: Callable[[Tensor, Mapping[str, Any], bool], Any] | None,
    *,
    owner: str,
) -> Any:
    """Run ``pipe`` once with ``stand_in`` for its ``vae.decode`` (in this thread only), checked for a
    cancelled caller before each model forward and at each step's end; return its output. A pipeline
    whose own model decodes its video has ``stand_in`` for that model's ``decode``; with ``stand_in``
    None its own ``vae.decode`` runs, untouched."""
    vae = pipe.vae if plan.decodes_itself is None else getattr(pipe, plan.decodes_itself)
    with _turn(vae, owner):
        check_abandoned(owner)  # a cancellation before the denoising loop starts
        kwargs = dict(pipeline_kwargs)
        # A tensor in [0, 1] (the frames "np" gives, not yet on the CPU); anything but "latent": the
        # pipeline goes on to vae.decode.
        kwargs["output_type"] = "pt"
        if plan.modular:
            kwargs["output"] = list(plan.outputs)
        else:
            parameters = inspect.signature(pipe).parameters
            if "return_dict" in parameters:
                kwargs["return_dict"] = True
            if "callback_on_step_end" in parameters:
                _wrap_step_callback(kwargs, owner)
        standing_in = contextlib.nullcontext() if stand_in is None else _standing_in_for_decode(vae, stand_in)
        with standing_in, _checked_forwards(pipe, owner):
            return pipe(**kwargs)


def video_output(plan: PipelinePlan, output: Any) -> Tensor:
    """The ``[B, F, C, H, W]`` video of a pipeline's output (``output_type="pt"``); an image pipeline's
    ``images`` ``[B, C, H, W]`` are one-frame videos."""
    if not plan.modular and "frames" not in output:
        images = output.images
        return (images if isinstance(images, Tensor) else torch.stack(list(images)))[:, None]
    video = output[plan.outputs[0]] if plan.modular else output.frames
    return video if isinstance(video, Tensor) else torch.stack(list(video))


def decode_result(sample: Tensor, return_dict: bool) -> Any:
    """What ``vae.decode`` returns for ``sample``: a ``DecoderOutput``, or ``(sample,)``."""
    if not return_dict:
        return (sample,)
    from diffusers.models.autoencoders.vae import DecoderOutput

    return DecoderOutput(sample=sample)


def _free_model_hooks(pipe: Any) -> None:
    free_hooks = getattr(pipe, "maybe_free_model_hooks", None)
    if callable(free_hooks):
        free_hooks()


def _wrap_step_callback(kwargs: dict[str, Any], owner: str) -> None:
    """Make ``kwargs``' ``callback_on_step_end`` end the pipeline once the caller was cancelled, then run
    the user's own callback, if any."""
    user_callback: Any = kwargs.get("callback_on_step_end")

    def on_step_end(pipe: Any, step: int, timestep: Any, callback_kwargs: dict[str, Any]) -> Any:
        check_abandoned(owner)  # ends __call__ here: diffusers does not catch it
        if user_callback is None:
            return {}
        return user_callback(pipe, step, timestep, callback_kwargs)

    kwargs["callback_on_step_end"] = on_step_end
    if "callback_on_step_end_tensor_inputs" not in kwargs and hasattr(user_callback, "tensor_inputs"):
        # diffusers reads a PipelineCallback's tensor inputs off the object itself, which the wrapper
        # is not: name them, or the user's callback would get none.
        kwargs["callback_on_step_end_tensor_inputs"] = list(user_callback.tensor_inputs)


@contextlib.contextmanager
def _standing_in_for_decode(
    vae: Any, stand_in: Callable[[Tensor, Mapping[str, Any], bool], Any]
) -> Iterator[None]:
    """Put a ``decode`` on this VAE instance that calls ``stand_in(latents, other arguments,
    return_dict)`` in this thread and the VAE's own decode in any other; put back what was there (an
    instance attribute of its own, or nothing) when the block ends."""
    had_own, own = "decode" in vars(vae), vars(vae).get("decode")
    original = own if had_own else types.MethodType(type(vae).decode, vae)
    signature = inspect.signature(original)
    latents_name = next(iter(signature.parameters))
    thread = threading.get_ident()

    def decode(*args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() != thread:
            return original(*args, **kwargs)  # another thread: its ordinary decode
        bound = signature.bind(*args, **kwargs)
        extra = {
            name: value
            for name, value in bound.arguments.items()
            if name not in (latents_name, "return_dict") and value is not signature.parameters[name].default
        }
        parameter = signature.parameters.get("return_dict")
        return_dict = bound.arguments.get("return_dict", True if parameter is None else parameter.default)
        return stand_in(bound.arguments[latents_name], extra, bool(return_dict))

    vae.decode = decode
    try:
        yield
    finally:
        if had_own:
            vae.decode = own
        else:
            del vae.decode


@contextlib.contextmanager
def _checked_forwards(pipe: Any, owner: str) -> Iterator[None]:
    """Check for a cancelled caller before every forward of the pipeline's models, in this thread only."""
    thread = threading.get_ident()

    def before_forward(module: torch.nn.Module, args: Any) -> None:
        if threading.get_ident() == thread:
            check_abandoned(owner)

    components = getattr(pipe, "components", {})
    modules = [c for c in components.values() if isinstance(c, torch.nn.Module) and c is not pipe.vae]
    handles = [module.register_forward_pre_hook(before_forward) for module in modules]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def _turn(vae: Any, owner: str) -> Iterator[None]:
    """Hold ``vae``'s lock for one pipeline call, waiting (cancellably) for a call that holds it."""
    with _turns_lock:
        lock = _turns.get(vae)
        if lock is None:
            lock = _turns[vae] = threading.Lock()
    while not lock.acquire(timeout=_TURN_POLL_SECONDS):
        check_abandoned(owner)
    try:
        yield
    finally:
        lock.release()


# -- the pipelines whose own model decodes their video (LTX-2.5's diffusion decoder) --

#: frames of an already decoded video each chunk publishes (:class:`DecodedVideo`)
_DECODED_CHUNK_FRAMES = 8


class DecodedVideo:
    """A :class:`streamvae.SupportsChunkedVAEDecode` whose latents are a video already decoded, ``[B, C, F,
    H, W]`` in [-1, 1], published a few frames a chunk: the video a pipeline's own model made
    (:attr:`PipelinePlan.decodes_itself`), written as a decode's chunks would be, into the same session."""

    #: the range the pipeline's post-processing maps to [0, 1], as ``(x / 2 + 0.5).clamp(0, 1)``
    chunk_value_range: ValueRange = (-1.0, 1.0)

    def decode_with_chunks(self, z: Tensor, *, on_chunk: Callable[[Tensor], None]) -> None:
        # views of the one tensor; an on_chunk that raises ends the publishing, as the protocol says
        for chunk in z.split(_DECODED_CHUNK_FRAMES, dim=2):
            on_chunk(chunk)


def check_own_decoder(pipe: object, name: str, *, owner: str) -> DecodedVideo:
    """What stands for the VAE of a pipeline whose component ``name`` decodes its video: a
    :class:`DecodedVideo`, once ``pipe`` is a callable pipeline with such a component (a TypeError naming
    it if not). Such a pipeline may have no VAE at all."""
    decoder = getattr(pipe, name, None)
    if decoder is None or not callable(getattr(decoder, "decode", None)) or not callable(pipe):
        raise TypeError(
            f"{owner}: {type(pipe).__module__}.{type(pipe).__qualname__} makes its video with its "
            f"{name}.decode, and has no {name} with a decode method, got {type(decoder).__qualname__}"
        )
    return DecodedVideo()


def _own_decode(
    pipe: Any, plan: PipelinePlan, owner: str
) -> Callable[[Tensor, Mapping[str, Any]], Tensor] | None:
    """``(latents, other arguments) -> video``: the ``decode`` of the component that makes the pipeline's
    video (its plan's ``decodes_itself``), taken before the stand-in replaces it, called as the pipeline
    calls it (its generator too: the model draws its noise from it) and checked for a cancelled caller
    after it (its denoising is one pass of one model, before which the stand-in checks too); None where the
    pipeline's VAE decodes."""
    if plan.decodes_itself is None:
        return None
    decode = getattr(pipe, plan.decodes_itself).decode

    def run(latents: Tensor, extra: Mapping[str, Any]) -> Tensor:
        video: Tensor = decode(latents, **extra, return_dict=False)[0]
        check_abandoned(owner)
        return video

    return run


# -- the pipelines whose video is final only at their end (Kandinsky 6 SR) --


class WholeVideo(DecodedVideo):
    """A :class:`DecodedVideo` of a pipeline's own output video, ``[B, C, F, H, W]`` in [0, 1] (its
    ``output_type="pt"`` frames with the channels moved before the frames): what a pipeline whose video is
    final only at its end returned (:attr:`PipelinePlan.whole_output`), written a few frames a chunk."""

    #: the range of the pipeline's ``"pt"`` output, post-processed already
    chunk_value_range: ValueRange = (0.0, 1.0)


def run_whole(
    pipe: Any, plan: PipelinePlan, pipeline_kwargs: Mapping[str, Any], *, owner: str
) -> CapturedDecode:
    """Worker thread: run ``pipe(**pipeline_kwargs)`` to its end with ``output_type="pt"``, its own
    ``vae.decode`` untouched, checked for a cancelled caller before it starts, before each model forward
    and at each step's end (where it takes a ``callback_on_step_end``): :func:`call_pipeline` without a
    stand-in; return its output video as the latents of a :class:`WholeVideo`, ``[B, C, F, H, W]`` in
    [0, 1], with its output (for its sound). The video is a view of the pipeline's own tensor: nothing is
    copied."""
    output = call_pipeline(pipe, plan, pipeline_kwargs, None, owner=owner)
    video = video_output(plan, output)  # [B, F, C, H, W]
    return CapturedDecode(video.permute(0, 2, 1, 3, 4), {}, output)
