"""What streamvae knows of each diffusers video pipeline: how it decodes, what it keeps, where its sound is.

A pipeline is run exactly only if streamvae knows what it does around ``vae.decode``, so the door works
from a table, not a guess: each class (or, for a modular pipeline, its blocks class) that streamvae has
reproduced exactly on a tiny seeded instance has a :class:`PipelinePlan`; every other video pipeline of
diffusers has the reason it is refused (:data:`REFUSED`), and one that is in neither is refused as not
verified. ``tests/test_pipeline_table.py`` builds docs/pipelines.md from both.

A plan says:

- **how it decodes**: once, after its denoising loop (most pipelines: the stand-in takes the latents and
  streamvae decodes them, the video never one tensor), or once per clip (:class:`Clips`: Helios's
  autoregressive chunks, Wan-Animate's segments; each call is decoded by streamvae, streamed, and its
  pixels handed back to the pipeline, which keeps them itself as it did before);
- **what it keeps of each clip** (:class:`Clips`): the frames it drops from the front of a clip, and the
  length it trims the whole to once no clip follows, both as the pipeline's own code computes them;
- **where its sound is** (:class:`Sound`): LTX-2's vocoder output, MiniMax-H3's soundtrack;
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor

__all__ = [
    "REFUSED",
    "Clips",
    "PipelinePlan",
    "Sound",
    "find_plan",
    "is_modular",
    "pipeline_key",
    "plans",
]

#: the diffusers module every modular pipeline's base class lives in
_MODULAR_BASE = ("diffusers.modular_pipelines.modular_pipeline", "ModularPipeline")


@dataclass(frozen=True)
class Clips:
    """A pipeline that calls ``vae.decode`` once per clip and returns the clips' frames in order."""

    #: ``(call, kwargs, pipe) -> n``: the frames the pipeline drops from the start of call ``call``'s
    #: (0-based) decoded clip before keeping it
    drop_front: Callable[[int, Mapping[str, Any], Any], int]
    #: ``(kept, kwargs, pipe) -> n``: the frames the pipeline returns if no clip follows, out of the
    #: ``kept`` it holds; never more than ``kept``, and never less than an earlier call's answer
    final_length: Callable[[int, Mapping[str, Any], Any], int]


@dataclass(frozen=True)
class Sound:
    """Where a pipeline's soundtrack is: ``read(output, pipe) -> (one waveform per video, sample rate)``,
    each waveform ``[channels, samples]`` as the pipeline made it."""

    read: Callable[[Any, Any], tuple[list[Tensor], int]]


@dataclass(frozen=True)
class PipelinePlan:
    """What streamvae does with one pipeline class."""

    #: the class name (a modular pipeline: its blocks class)
    name: str
    #: None: one ``vae.decode`` after the denoising loop; else how it decodes clip by clip
    clips: Clips | None = None
    #: the pipeline's soundtrack, if it makes one
    sound: Sound | None = None
    #: a modular pipeline: the names of its video output and of what :attr:`sound` reads
    outputs: tuple[str, ...] = ()
    #: ``(kwargs, pipe) -> n``: a pipeline that decodes once and keeps only the first ``n`` frames of its
    #: decode (AllegroPipeline's ``video[:, :, :num_frames]``); None: it keeps them all
    keep_frames: Callable[[Mapping[str, Any], Any], int] | None = None

    @property
    def modular(self) -> bool:
        return bool(self.outputs)


# -- what the pipelines' own code computes --


def _argument(pipe: Any, kwargs: Mapping[str, Any], name: str) -> Any:
    """The value ``pipe(**kwargs)`` sees for ``name``: the call's, else the signature's default."""
    if name in kwargs:
        return kwargs[name]
    return inspect.signature(pipe).parameters[name].default


def _helios_length(kept: int, kwargs: Mapping[str, Any], pipe: Any) -> int:
    """HeliosPipeline / HeliosPyramidPipeline: ``(n - 1) // t * t + 1`` of the concatenated chunks."""
    step = int(pipe.vae_scale_factor_temporal)
    return (kept - 1) // step * step + 1


def _no_drop(call: int, kwargs: Mapping[str, Any], pipe: Any) -> int:
    return 0


def _wan_animate_drop(call: int, kwargs: Mapping[str, Any], pipe: Any) -> int:
    """WanAnimatePipeline: a segment after the first drops its ``prev_segment_conditioning_frames``."""
    return int(_argument(pipe, kwargs, "prev_segment_conditioning_frames")) if call > 0 else 0


def _wan_animate_length(kept: int, kwargs: Mapping[str, Any], pipe: Any) -> int:
    """WanAnimatePipeline: the segments are cut to the pose video's length."""
    return min(kept, len(kwargs["pose_video"]))


def _allegro_frames(kwargs: Mapping[str, Any], pipe: Any) -> int:
    """AllegroPipeline: the decoded video is cut to ``num_frames``."""
    return int(_argument(pipe, kwargs, "num_frames"))


def _ltx2_sound(output: Any, pipe: Any) -> tuple[list[Tensor], int]:
    """LTX2Pipeline: ``output.audio`` ``[batch, channels, samples]`` at the vocoder's output rate."""
    audio = output.audio
    return [audio[entry] for entry in range(audio.shape[0])], int(pipe.vocoder.config.output_sampling_rate)


def _ltx2_modular_sound(output: Any, pipe: Any) -> tuple[list[Tensor], int]:
    """LTX2AutoBlocks: output ``audio`` ``[batch, channels, samples]`` at the vocoder's output rate."""
    audio = output["audio"]
    return [audio[entry] for entry in range(audio.shape[0])], int(pipe.vocoder.config.output_sampling_rate)


def _minimax_h3_sound(output: Any, pipe: Any) -> tuple[list[Tensor], int]:
    """MiniMax-H3's blocks: ``audio`` ``[batch, 2, samples]`` at ``sampling_rate``."""
    audio = output["audio"]
    return [audio[entry] for entry in range(audio.shape[0])], int(output["sampling_rate"])


# -- the table --

_HELIOS = Clips(drop_front=_no_drop, final_length=_helios_length)
_ONCE = (
    # the first landing's pipelines
    "WanPipeline",
    "WanImageToVideoPipeline",
    "HunyuanVideoPipeline",
    "LTXPipeline",
    "LTXImageToVideoPipeline",
    "CogVideoXPipeline",
    # decode once after their loop (SkyReels-V2's long-video mode too: it decodes the joined latents)
    "SkyReelsV2DiffusionForcingPipeline",
    "HunyuanVideo15Pipeline",
    "Kandinsky5T2VPipeline",
    "SanaVideoPipeline",
    "MochiPipeline",
    # image, video and control conditioned variants that decode the same way
    "WanVACEPipeline",
    "WanVideoToVideoPipeline",
    "SkyReelsV2Pipeline",
    "SkyReelsV2ImageToVideoPipeline",
    "SkyReelsV2DiffusionForcingImageToVideoPipeline",
    "HunyuanSkyreelsImageToVideoPipeline",
    "HunyuanVideo15ImageToVideoPipeline",
    "CogVideoXImageToVideoPipeline",
    "CogVideoXVideoToVideoPipeline",
    "CogVideoXFunControlPipeline",
    "EasyAnimatePipeline",
    "Kandinsky5I2VPipeline",
    "LucyEditPipeline",
    "AnyFlowPipeline",
    # issue 35, group C3 (Cosmos, Kandinsky 6, JoyImage, Bria Fibo): names below this line
    # issue 35, group C4 (LTX-Video, LTX-2, SANA): names below this line
    # issue 35, group C5 (EasyAnimate, Motif image-to-video, AnyFlow FAR): names below this line
)

_PLANS: dict[str, PipelinePlan] = {
    **{name: PipelinePlan(name) for name in _ONCE},
    "HeliosPipeline": PipelinePlan("HeliosPipeline", clips=_HELIOS),
    "HeliosPyramidPipeline": PipelinePlan("HeliosPyramidPipeline", clips=_HELIOS),
    "WanAnimatePipeline": PipelinePlan(
        "WanAnimatePipeline", clips=Clips(drop_front=_wan_animate_drop, final_length=_wan_animate_length)
    ),
    "AllegroPipeline": PipelinePlan("AllegroPipeline", keep_frames=_allegro_frames),
    "LTX2Pipeline": PipelinePlan("LTX2Pipeline", sound=Sound(_ltx2_sound)),
    "LTX2ImageToVideoPipeline": PipelinePlan("LTX2ImageToVideoPipeline", sound=Sound(_ltx2_sound)),
    **{
        name: PipelinePlan(name, outputs=("videos",))
        for name in ("WanBlocks", "Wan22Blocks", "WanImage2VideoAutoBlocks", "HunyuanVideo15AutoBlocks")
    },
    # Its decode step decodes each chunk in turn, after the chunk loop: exact, streamed once denoised.
    "HeliosAutoBlocks": PipelinePlan("HeliosAutoBlocks", clips=_HELIOS, outputs=("videos",)),
    "LTX2AutoBlocks": PipelinePlan(
        "LTX2AutoBlocks", sound=Sound(_ltx2_modular_sound), outputs=("videos", "audio")
    ),
    "MiniMaxH3Blocks": PipelinePlan(
        "MiniMaxH3Blocks", sound=Sound(_minimax_h3_sound), outputs=("videos", "audio", "sampling_rate")
    ),
    # issue 35, group C1 (image VAEs, Stable Video Diffusion): plans below this line
    # issue 35, group C2 (the transformations after vae.decode): plans below this line
    # issue 35, group C3 (Cosmos, Kandinsky 6, JoyImage, Bria Fibo): plans below this line
    # issue 35, group C4 (LTX-Video, LTX-2, SANA): plans below this line
    # issue 35, group C5 (EasyAnimate, Wan and Helios modular blocks): plans below this line
}

#: video pipelines of diffusers 0.42.1 streamvae refuses, and why (a class not here and without a plan
#: is refused as not verified)
REFUSED: dict[str, str] = {
    "SkyReelsV2DiffusionForcingVideoToVideoPipeline": (
        "it puts the input video's own frames in front of the decoded ones after vae.decode"
    ),
    "HunyuanVideoImageToVideoPipeline": (
        "its default latent_concat mode drops the first decoded frames after vae.decode (its token_replace "
        "mode, checked exact, would not)"
    ),
    "StableVideoDiffusionPipeline": (
        "it decodes frames-first latents flattened into the batch, decode_chunk_size frames a call"
    ),
    "ChronoEditPipeline": (
        "with temporal reasoning over every step it decodes twice and joins the two videos"
    ),
    "MotifVideoPipeline": "with a vae_batch_size below the batch it decodes the videos in several calls",
    "WanAnimate2Blocks": (
        "its end step crops a letterbox region out of the decoded frames when the image's aspect differs "
        "from the frame's"
    ),
    "HunyuanVideoFramepackPipeline": (
        "it blends each decoded section into the frames before it (and, in its default inverted "
        "anti-drifting sampling, prepends it), so no decoded frame is final before the end"
    ),
}


def plans() -> Mapping[str, PipelinePlan]:
    """Every plan, by class (or blocks class) name."""
    return _PLANS


def is_modular(pipe: object) -> bool:
    """Whether ``pipe`` is a diffusers ``ModularPipeline`` (told by its classes, without importing
    diffusers)."""
    return any((cls.__module__, cls.__qualname__) == _MODULAR_BASE for cls in type(pipe).__mro__)


def pipeline_key(pipe: object) -> str:
    """The name the table knows ``pipe`` by: its class, or a modular pipeline's blocks class."""
    if is_modular(pipe):
        return type(getattr(pipe, "blocks", None)).__name__
    return type(pipe).__name__


def _own_call(cls: type) -> Any:
    """The ``__call__`` function ``cls`` resolves to."""
    return next(vars(base)["__call__"] for base in cls.__mro__ if "__call__" in vars(base))


def find_plan(pipe: object, kwargs: Mapping[str, Any], *, owner: str) -> PipelinePlan:
    """``pipe``'s plan, or a TypeError naming why streamvae cannot reproduce this call exactly.

    A subclass of a planned class is that class's plan while it keeps the class's ``__call__``; one that
    overrides it runs code streamvae has not checked, and is refused.
    """
    described = f"{type(pipe).__module__}.{type(pipe).__qualname__}"
    plan: PipelinePlan | None = None
    if is_modular(pipe):
        plan = _PLANS.get(pipeline_key(pipe))
        what = f"{described} with blocks {pipeline_key(pipe)}"
    else:
        what = described
        for cls in type(pipe).__mro__:
            if cls.__name__ in _PLANS and cls.__module__.startswith("diffusers."):
                if vars(cls)["__call__"] is _own_call(type(pipe)):
                    plan = _PLANS[cls.__name__]
                else:
                    raise TypeError(
                        f"{owner}: {described} overrides {cls.__name__}.__call__: streamvae reproduces only "
                        "the diffusers pipelines it has checked frame for frame (docs/pipelines.md)"
                    )
                break
    if plan is None and pipeline_key(pipe) in REFUSED:
        raise TypeError(f"{owner}: {what} is refused: {REFUSED[pipeline_key(pipe)]}")
    if plan is None:
        raise TypeError(
            f"{owner}: {what} is not a pipeline streamvae has checked to give every frame and its sound "
            f"exactly; the checked ones are {', '.join(sorted(_PLANS))} (docs/pipelines.md says why the "
            "others are refused)"
        )
    return plan


def describe(plan: PipelinePlan) -> str:
    """One line on what streamvae does with a planned pipeline (docs/pipelines.md)."""
    how = (
        "streams each clip as the pipeline decodes it, the pipeline's own trims applied"
        if plan.clips is not None
        else "decodes its latents chunk by chunk once its denoising is done"
    )
    return how + ("; its sound is each MP4's audio track" if plan.sound is not None else "")
