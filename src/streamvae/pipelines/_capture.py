"""Running a diffusers pipeline up to its ``vae.decode`` call, and taking what it passes there.

Every diffusers video pipeline ends the same way: the denoising loop, then the steps that turn its latents
into what the VAE decodes (de-normalizing, unpacking packed latents, dropping padding frames, permuting
frames-first latents, LTX's decode-timestep noise drawn from the call's own generator), then
``vae.decode(latents, …)`` and the post-processing of the decoded video. Those middle steps differ per
family and change between diffusers releases; re-implementing them would make streamvae's frames drift
from the pipeline's own whenever diffusers moves. So the pipeline runs its own code, and streamvae stands
in for ``vae.decode`` on the pipeline's VAE for the duration of the call: the stand-in records the
arguments (the latents, and e.g. LTX's ``temb``) and stops the pipeline right there, before anything is
decoded. streamvae then decodes those latents itself, chunk by chunk, into MP4s. The decoded video never
exists as one tensor, and the frames are those ``vae.decode`` would have returned to the pipeline.

The design notes:

- **One call at a time per VAE.** The stand-in is an attribute of the VAE instance, and a diffusers
  pipeline keeps per-call state on itself (``_guidance_scale``, ``_interrupt``, …): two calls on one
  pipeline (or two pipelines sharing a VAE) would see each other's. Calls on one VAE take turns on a lock,
  waited for in the worker thread with a short poll so that a cancelled caller stops waiting.
- **Cancellation stops the denoising loop at its next step.** diffusers' ``interrupt`` only skips the
  remaining steps (the pipeline still goes on to ``vae.decode``, and ``__call__`` resets it when it
  starts), so streamvae wraps ``callback_on_step_end`` instead: at the end of each step it checks whether
  the caller was cancelled and, if so, raises, which ends ``__call__`` there. A cancellation before the
  loop starts is seen before the pipeline is called; one during the last step is seen by the stand-in.
- **Nothing of the pipeline outlives the call.** The stand-in is removed in ``finally`` (an instance
  attribute that was there before is put back), the exception that carried the latents out is dropped
  with its traceback (which holds every local of the denoising loop), and the pipeline's
  ``maybe_free_model_hooks`` runs as it would have after ``vae.decode`` (offloaded models go back).
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from streamvae._decode_worker import check_abandoned

__all__ = ["CapturedDecode", "check_pipeline", "check_pipeline_kwargs", "run_to_decode"]

#: seconds between looks at a cancelled caller while waiting for another call on the same VAE
_TURN_POLL_SECONDS = 0.05

_turns_lock = threading.Lock()
_turns: weakref.WeakKeyDictionary[Any, threading.Lock] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class CapturedDecode:
    """What a pipeline passed to ``vae.decode``: the latents, and the decode's other arguments."""

    #: the latents ``vae.decode`` was called with, as the pipeline prepared them
    latents: Tensor
    #: the decode's other arguments that differ from their defaults (LTX-Video's ``temb``, …)
    decode_kwargs: Mapping[str, Any]


class _ReachedDecode(Exception):
    """Raised by the stand-in for ``vae.decode``: carries its arguments out of the pipeline."""

    def __init__(self, captured: CapturedDecode) -> None:
        super().__init__("the pipeline reached vae.decode")
        self.captured = captured


def check_pipeline(pipe: object, *, owner: str) -> Any:
    """``pipe``'s VAE if ``pipe`` is a diffusers pipeline this module can run, else a TypeError naming it.

    A pipeline qualifies when it is callable with ``output_type`` and ``callback_on_step_end`` (every
    diffusers video pipeline is) and has a ``vae`` whose ``decode`` it calls; whether streamvae decodes
    that VAE is the caller's check (``streamvae.models.as_decoder``).
    """
    described = f"{type(pipe).__module__}.{type(pipe).__qualname__}"
    vae = getattr(pipe, "vae", None)
    if vae is None or not callable(getattr(vae, "decode", None)) or not callable(pipe):
        raise TypeError(
            f"{owner}: pipe must be a diffusers pipeline with a VAE (WanPipeline, HunyuanVideoPipeline, "
            f"LTXPipeline, CogVideoXPipeline, …), got {described}"
        )
    parameters = inspect.signature(pipe).parameters
    missing = [name for name in ("output_type", "callback_on_step_end") if name not in parameters]
    if missing:
        raise TypeError(
            f"{owner}: {described} takes no {' or '.join(missing)}: streamvae runs diffusers pipelines that "
            "take both (WanPipeline, HunyuanVideoPipeline, LTXPipeline, CogVideoXPipeline, …)"
        )
    return vae


def check_pipeline_kwargs(pipe: Any, pipeline_kwargs: Mapping[str, Any], *, owner: str) -> None:
    """A TypeError naming ``owner`` unless ``pipe(**pipeline_kwargs)`` binds; a ValueError for an
    ``output_type``, which streamvae chooses itself (the pipeline must reach ``vae.decode``)."""
    if "output_type" in pipeline_kwargs:
        raise ValueError(
            f"{owner}: output_type is streamvae's to choose (the pipeline's latents are decoded into MP4s); "
            f"leave it out, got output_type={pipeline_kwargs['output_type']!r}"
        )
    try:
        inspect.signature(pipe).bind(**pipeline_kwargs)
    except TypeError as error:
        raise TypeError(f"{owner}: {type(pipe).__name__}() {error}") from None
    callback = pipeline_kwargs.get("callback_on_step_end")
    if callback is not None and not callable(callback):
        raise TypeError(f"{owner}: callback_on_step_end must be callable, got {type(callback).__name__}")


def run_to_decode(pipe: Any, pipeline_kwargs: Mapping[str, Any], *, owner: str) -> CapturedDecode:
    """Worker thread: run ``pipe(**pipeline_kwargs)`` up to its ``vae.decode`` call and return what it
    passed there, having decoded nothing.

    Raises :class:`streamvae._decode_worker.DecodeAbandoned` (through ``check_abandoned``) when the caller
    was cancelled, before the pipeline starts, at the end of a denoising step, or at the decode; the
    pipeline's own errors as they are; a RuntimeError when the pipeline returned without decoding.
    """
    vae = pipe.vae
    with _turn(vae, owner):
        check_abandoned(owner)  # a cancellation before the denoising loop starts
        kwargs = dict(pipeline_kwargs)
        kwargs["output_type"] = "pt"  # anything but "latent": the pipeline goes on to vae.decode
        kwargs["callback_on_step_end"] = _step_end_check(kwargs.get("callback_on_step_end"), owner)
        user_callback: Any = pipeline_kwargs.get("callback_on_step_end")
        if "callback_on_step_end_tensor_inputs" not in kwargs and hasattr(user_callback, "tensor_inputs"):
            # diffusers reads a PipelineCallback's tensor inputs off the object itself, which the wrapper
            # is not: name them, or the user's callback would get none.
            kwargs["callback_on_step_end_tensor_inputs"] = list(user_callback.tensor_inputs)
        captured: CapturedDecode | None = None
        with _standing_in_for_decode(vae, owner):
            try:
                pipe(**kwargs)
            except _ReachedDecode as reached:
                captured = reached.captured
                # Its traceback holds every local of the denoising loop: let go of it now.
                reached.__traceback__ = None
        if captured is None:
            raise RuntimeError(
                f"{owner}: {type(pipe).__name__} returned without calling vae.decode: nothing to decode"
            )
        free_hooks = getattr(pipe, "maybe_free_model_hooks", None)
        if callable(free_hooks):
            free_hooks()  # what the pipeline does after its decode (offloaded models go back)
        return captured


def _step_end_check(user_callback: Any, owner: str) -> Callable[..., Any]:
    """A ``callback_on_step_end`` that ends the pipeline once the caller was cancelled, then runs the
    user's own callback, if any."""

    def on_step_end(pipe: Any, step: int, timestep: Any, callback_kwargs: dict[str, Any]) -> Any:
        check_abandoned(owner)  # ends __call__ here: diffusers does not catch it
        if user_callback is None:
            return {}
        return user_callback(pipe, step, timestep, callback_kwargs)

    return on_step_end


@contextlib.contextmanager
def _standing_in_for_decode(vae: Any, owner: str) -> Iterator[None]:
    """Replace ``vae.decode`` on this instance by a stand-in that raises :class:`_ReachedDecode`; put
    back what was there (an instance attribute of its own, or nothing) when the block ends."""
    had_own, own = "decode" in vars(vae), vars(vae).get("decode")
    signature = inspect.signature(vae.decode)
    latents_name = next(iter(signature.parameters))

    def decode(*args: Any, **kwargs: Any) -> Any:
        check_abandoned(owner)  # a cancellation during the last denoising step
        bound = signature.bind(*args, **kwargs)
        extra = {
            name: value
            for name, value in bound.arguments.items()
            if name not in (latents_name, "return_dict") and value is not signature.parameters[name].default
        }
        raise _ReachedDecode(CapturedDecode(bound.arguments[latents_name], extra))

    vae.decode = decode
    try:
        yield
    finally:
        if had_own:
            vae.decode = own
        else:
            del vae.decode


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
