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
- **what it does to its decoded video** (streamed by ``_transforms``): the frames a
  pipeline that decodes once drops from the front of its decode (:attr:`PipelinePlan.drop_frames`,
  HunyuanVideo-I2V) or puts before it (:attr:`PipelinePlan.lead_frames`, SkyReels-V2 DF video-to-video's
  input video); the decodes after the loop a pipeline joins (:class:`Joined`: Motif's ``vae_batch_size``
  groups along the batch, ChronoEdit's reasoning and edit videos in time); the region of each frame a
  clip-by-clip pipeline keeps (:attr:`Clips.crop`, Wan-Animate 2's letterbox); the sections a pipeline
  blends into each other (:class:`Blended`, FramePack, appended or prepended) — each as the pipeline's own
  code computes it;
- **what makes its video, if not its VAE** (:attr:`PipelinePlan.decodes_itself`):
  LTX-2.5's diffusion decoder, whose video streamvae encodes once that model has made it whole;
- **whether its video is final only at its end** (:attr:`PipelinePlan.whole_output`):
  Kandinsky 6 SR's tiles blended into one canvas, which streamvae encodes once the pipeline returned it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "REFUSED",
    "Blended",
    "Clips",
    "FrameBatches",
    "Joined",
    "PipelinePlan",
    "RefusedCalls",
    "Sound",
    "find_plan",
    "first_byte",
    "is_modular",
    "no_drop",
    "own_decoder",
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
    #: ``(kwargs, pipe, height, width) -> (top, left, height, width)``: the region of every decoded
    #: ``height`` × ``width`` frame the pipeline keeps (Wan-Animate 2's letterbox crop); None: all of it
    crop: Callable[[Mapping[str, Any], Any, int, int], tuple[int, int, int, int]] | None = None


@dataclass(frozen=True)
class Joined:
    """A pipeline that calls ``vae.decode`` more than once after its denoising loop, never using what it
    decodes but to join it into its video (Motif's ``vae_batch_size`` groups, ChronoEdit's two videos)."""

    #: ``(latents of each call, kwargs, pipe) -> [(latents, n), …]``: what to decode, in the order the
    #: pipeline's video holds it, each with the frames the pipeline drops from the front of its decode;
    #: a tuple of latents is decoded a batch each, as the pipeline's calls decoded them, its videos joined
    #: along the batch
    order: Callable[[list[Tensor], Mapping[str, Any], Any], Sequence[tuple[Tensor | tuple[Tensor, ...], int]]]


@dataclass(frozen=True)
class FrameBatches:
    """A pipeline whose ``decode_latents`` flattens its latents' batch and frames into the batch of an image
    decode, entry-major (entry ``b``'s frames are ``[b·F, (b+1)·F)``), and calls ``vae.decode`` on a few of
    them at a time (AnimateDiff's and Stable Video Diffusion's ``decode_chunk_size``) or on all at once."""

    #: ``latents -> (batch, frames)``, read off the latents ``decode_latents`` is given: BCFHW for the
    #: pipelines with an image VAE, BFCHW for Stable Video Diffusion
    shape: Callable[[Tensor], tuple[int, int]]


@dataclass(frozen=True)
class Blended:
    """A pipeline that decodes once per section and blends each decoded section into the video so far,
    over an overlap, in front of it or after it (FramePack's ``_soft_append``), then cuts the whole."""

    #: ``(kwargs, pipe) -> n``: the frames over which a section is blended into the video so far
    overlap: Callable[[Mapping[str, Any], Any], int]
    #: ``(kwargs, pipe) -> bool``: whether each section goes in front of the video so far (else after it)
    prepends: Callable[[Mapping[str, Any], Any], bool]
    #: ``(pipe, history, current, overlap) -> joined``: the pipeline's own blend of ``current`` after
    #: ``history``
    blend: Callable[[Any, Tensor, Tensor, int], Tensor]
    #: ``(frames, kwargs, pipe) -> n``: the frames the pipeline returns of the ``frames`` it joined
    final_length: Callable[[int, Mapping[str, Any], Any], int]
    #: ``(kwargs, pipe) -> n``: at most how many frames :attr:`final_length` cuts
    most_cut: Callable[[Mapping[str, Any], Any], int]


@dataclass(frozen=True)
class Sound:
    """Where a pipeline's soundtrack is: ``read(output, pipe) -> (one waveform per video, sample rate)``,
    each waveform ``[channels, samples]`` as the pipeline made it."""

    read: Callable[[Any, Any], tuple[list[Tensor], int]]
    #: ``(kwargs, pipe) -> why``: why this call makes no soundtrack, with what to pass instead (refused
    #: before the pipeline runs unless ``audio_waveforms`` is given); None where it makes one
    silent: Callable[[Mapping[str, Any], Any], str | None] | None = None


@dataclass(frozen=True)
class RefusedCalls:
    """The calls of a planned pipeline that streamvae refuses before it runs: those whose decode differs from
    the one it was checked with (an option that makes it several calls, or transforms its output)."""

    #: which calls, for the table (docs/pipelines.md)
    summary: str
    #: ``(kwargs, pipe) -> why``: why this call is refused, naming the option; None where it is not
    why: Callable[[Mapping[str, Any], Any], str | None]


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
    #: a pipeline that decodes its frames as a batch of images, a few a ``vae.decode`` call, each call
    #: streamed as the pipeline makes it; None: it does not
    frame_batches: FrameBatches | None = None
    #: ``(kwargs, pipe) -> n``: a pipeline that decodes once and drops the first ``n`` frames of its decode
    #: (HunyuanVideo-I2V's ``video[:, :, 4:]``); None: it drops none
    drop_frames: Callable[[Mapping[str, Any], Any], int] | None = None
    #: ``(kwargs, pipe) -> frames``: a pipeline that decodes once and puts these pixel frames (BCTHW, in its
    #: decoder's value range) before its decoded ones (SkyReels-V2 DF video-to-video's input video)
    lead_frames: Callable[[Mapping[str, Any], Any], Tensor] | None = None
    #: a pipeline that decodes more than once after its loop and joins the videos; None: it does not
    joined: Joined | None = None
    #: a pipeline that decodes once per section and blends each into the video so far; None: it does not
    blended: Blended | None = None
    #: the calls streamvae refuses although it reproduces the pipeline; None: it refuses none
    refused_calls: RefusedCalls | None = None
    #: the component whose ``decode(latents, generator=…)`` makes the pipeline's video instead of
    #: ``vae.decode`` (LTX-2.5's ``diffusion_decoder``, a diffusion model that denoises every frame's pixels
    #: together from noise drawn for the whole clip, in one pass: no frame is final before that pass ends);
    #: None: its VAE decodes. streamvae lets that component decode, as the pipeline's own code calls it
    #: (same latents, same generator), takes the video it returns before the pipeline's post-processing,
    #: and encodes it chunk by chunk. That video is one tensor, [B, C, F, H, W] in [-1, 1]: the model makes
    #: it so, and nothing could leave before it is whole.
    decodes_itself: str | None = None
    #: a pipeline whose decoded pixels are still combined once its last ``vae.decode`` returned (Kandinsky
    #: 6 SR's overlapping spatial tiles, each over every frame, blended into one canvas with Hann windows:
    #: no pixel of any frame is final before the last tile is decoded): streamvae runs it to its end, as its
    #: own code runs (no stand-in for ``vae.decode``), and encodes its output video chunk by chunk. That
    #: video is one tensor, ``[B, F, C, H, W]`` in [0, 1]: the pipeline makes it so, and nothing could leave
    #: before it is whole.
    whole_output: bool = False

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


def no_drop(call: int, kwargs: Mapping[str, Any], pipe: Any) -> int:
    """:attr:`Clips.drop_front` of a pipeline that keeps every frame of every call."""
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


# -- what the pipelines that transform their decode compute --


def _hunyuan_i2v_drop(kwargs: Mapping[str, Any], pipe: Any) -> int:
    """HunyuanVideoImageToVideoPipeline: its ``latent_concat`` transformers' decode loses its first 4 frames
    (the image latent's); ``token_replace`` keeps them."""
    return 4 if pipe.transformer.config.image_condition_type == "latent_concat" else 0


def _batches_joined(
    latents: list[Tensor], kwargs: Mapping[str, Any], pipe: Any
) -> list[tuple[tuple[Tensor, ...], int]]:
    """MotifVideoPipeline: with a ``vae_batch_size`` below the batch, a decode per group of entries, the
    videos joined along the batch."""
    return [(tuple(latents), 0)]


def _chronoedit_order(
    latents: list[Tensor], kwargs: Mapping[str, Any], pipe: Any
) -> list[tuple[Tensor, int]]:
    """ChronoEditPipeline: with temporal reasoning left on to the end it decodes the edit (first and last
    latents), then the reasoning (all but the last), and returns the reasoning's frames, then the edit's
    after its first; else it decodes once."""
    if len(latents) == 1:
        return [(latents[0], 0)]
    edit, reasoning = latents
    return [(reasoning, 0), (edit, 1)]


def _framepack_overlap(kwargs: Mapping[str, Any], pipe: Any) -> int:
    """HunyuanVideoFramepackPipeline: ``(latent_window_size - 1) · t + 1`` frames."""
    return (int(_argument(pipe, kwargs, "latent_window_size")) - 1) * int(pipe.vae_scale_factor_temporal) + 1


def _framepack_prepends(kwargs: Mapping[str, Any], pipe: Any) -> bool:
    """HunyuanVideoFramepackPipeline: its inverted anti-drifting sampling (the default) prepends each
    section, its vanilla one appends it."""
    from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video_framepack import FramepackSamplingType

    return bool(_argument(pipe, kwargs, "sampling_type") == FramepackSamplingType.INVERTED_ANTI_DRIFTING)


def _framepack_blend(pipe: Any, history: Tensor, current: Tensor, overlap: int) -> Tensor:
    """HunyuanVideoFramepackPipeline's own ``_soft_append``."""
    return pipe._soft_append(history, current, overlap)  # type: ignore[no-any-return]


def _framepack_length(frames: int, kwargs: Mapping[str, Any], pipe: Any) -> int:
    """HunyuanVideoFramepackPipeline: ``(n - 1) // t * t + 1`` of the joined sections."""
    step = int(pipe.vae_scale_factor_temporal)
    return (frames - 1) // step * step + 1


def _framepack_most_cut(kwargs: Mapping[str, Any], pipe: Any) -> int:
    """HunyuanVideoFramepackPipeline: its final cut drops fewer than ``t`` frames."""
    return int(pipe.vae_scale_factor_temporal) - 1


def _skyreels_v2v_input(kwargs: Mapping[str, Any], pipe: Any) -> Tensor:
    """SkyReelsV2DiffusionForcingVideoToVideoPipeline: its input ``video`` preprocessed to the call's size
    (float32, in [-1, 1]), which it puts before its decoded frames."""
    spatial = pipe.vae_scale_factor_spatial
    height = _argument(pipe, kwargs, "height") or pipe.transformer.config.sample_height * spatial
    width = _argument(pipe, kwargs, "width") or pipe.transformer.config.sample_width * spatial
    video: Tensor = pipe.video_processor.preprocess_video(kwargs["video"], height=height, width=width)
    return video.to(dtype=torch.float32)


# -- what the Cosmos, Kandinsky 6, JoyImage and Bria Fibo pipelines compute --


def _cosmos_guardrail(kwargs: Mapping[str, Any], pipe: Any) -> str | None:
    """Every Cosmos pipeline: cosmos_guardrail's ``CosmosSafetyChecker`` (the default one: the pipelines
    build it when given none) checks each whole decoded video after ``vae.decode``, and may pixelate the
    faces it finds or reject the video. streamvae streams the decode and never holds the whole video, so it
    cannot run that check. A checker of another class is the caller's: Cosmos 2.5 Predict and Cosmos 3 do
    not call it on the video; Cosmos 1 and 2 and the Cosmos 3 blocks do, and streamvae does not. Cosmos 2.5
    Transfer, streamed clip by clip, runs to its end: its checker sees the video after streamvae sent it,
    and the frame check at the end of a clip-by-clip run fails the call on a frame it changed enough."""
    checker = getattr(pipe, "safety_checker", None)
    if type(checker).__name__ != "CosmosSafetyChecker":
        return None
    if not kwargs.get("enable_safety_check", True) or not getattr(pipe, "requires_safety_checker", True):
        return None  # Cosmos 3's call option, and its blocks' disable_safety_checker()
    return (
        "its CosmosSafetyChecker checks the whole decoded video after vae.decode (it may pixelate faces or "
        "reject the video), which a stream cannot do; pass a checker of your own, or call Cosmos 3 with "
        "enable_safety_check=False, if your license allows it"
    )


def _cosmos2_5_refused(kwargs: Mapping[str, Any], pipe: Any) -> str | None:
    """Cosmos2_5_PredictBasePipeline: its decode gives ``num_frames`` when that is ``k·t + 1`` (``t`` the
    VAE's temporal factor); for another count its ``_match_num_frames`` repeats every decoded frame ``t``
    times and cuts the result to ``num_frames``."""
    frames = _argument(pipe, kwargs, "num_frames")
    step = int(pipe.vae_scale_factor_temporal)
    if isinstance(frames, int) and frames > 0 and (frames - 1) % step:
        return (
            f"num_frames={frames} is not {step}·k + 1: the pipeline repeats each decoded frame {step} times "
            "and cuts the result to num_frames after vae.decode"
        )
    return _cosmos_guardrail(kwargs, pipe)


def _cosmos3_refused(kwargs: Mapping[str, Any], pipe: Any) -> str | None:
    """Cosmos 3 (the pipeline and its blocks): its sound is decoded apart from the video, and its blocks'
    transfer workflow decodes chunk by chunk."""
    if kwargs.get("enable_sound"):
        return "enable_sound=True: streamvae does not mux Cosmos 3's soundtrack (yet)"
    if kwargs.get("control_videos") is not None:
        return "control_videos (the transfer workflow) decodes chunk by chunk, each conditioning the next"
    return _cosmos_guardrail(kwargs, pipe)


_COSMOS_GUARDRAIL = RefusedCalls(
    "a call whose CosmosSafetyChecker (cosmos_guardrail, the default) would check the whole decoded video is "
    "refused; a checker of another class never sees the video (its check_video_safety is not run)",
    _cosmos_guardrail,
)
_COSMOS2_5 = RefusedCalls(
    "a call whose num_frames is not 4k + 1, or whose CosmosSafetyChecker would check the whole decoded "
    "video, is refused",
    _cosmos2_5_refused,
)
_COSMOS3 = RefusedCalls(
    "a call with enable_sound, control_videos, or a CosmosSafetyChecker that would check the whole decoded "
    "video is refused",
    _cosmos3_refused,
)
_COSMOS3_BLOCKS = RefusedCalls(
    f"{_COSMOS3.summary}; a checker of another class never sees the video (its check_video_safety is not "
    "run)",
    _cosmos3_refused,
)
_COSMOS2_5_TRANSFER = RefusedCalls(
    "a call whose CosmosSafetyChecker (cosmos_guardrail, the default) would check the whole decoded video is "
    "refused; a checker of another class is given the video after it is streamed, and a frame it changes "
    "enough to move the frame's mean past one 8-bit level fails the call at its end",
    _cosmos_guardrail,
)


def _transfer_overlap(call: int, kwargs: Mapping[str, Any], pipe: Any) -> int:
    """Cosmos2_5_TransferPipeline: a chunk after the first drops the ``num_ar_conditional_frames`` it
    conditions on (given as ``num_ar_latent_conditional_frames`` n: ``(n - 1) · t + 1``)."""
    if call == 0:
        return 0
    latent_frames = kwargs.get("num_ar_latent_conditional_frames")
    if latent_frames is not None:
        return max(0, (int(latent_frames) - 1) * int(pipe.vae_scale_factor_temporal) + 1)
    return int(_argument(pipe, kwargs, "num_ar_conditional_frames"))


def _transfer_length(kept: int, kwargs: Mapping[str, Any], pipe: Any) -> int:
    """Cosmos2_5_TransferPipeline: the chunks are cut to the control video's frames (each video of
    ``controls`` has as many, as its ``video_processor.preprocess_video`` reads them), at most
    ``num_frames``."""
    from diffusers.image_processor import is_valid_image

    controls = kwargs["controls"]
    if isinstance(controls, list) and getattr(controls[0], "ndim", 0) == 5:
        controls = controls[0]  # a list of batches of videos, concatenated
    if getattr(controls, "ndim", 0) == 5:  # a batch of videos [B, F, …]
        frames = int(controls.shape[1])
    elif isinstance(controls, list) and is_valid_image(controls[0]):  # one video, a frame an item
        frames = len(controls)
    elif not isinstance(controls, list):  # one video [F, …], or one image
        frames = int(controls.shape[0]) if getattr(controls, "ndim", 0) == 4 else 1
    else:  # a list of videos
        first = controls[0]
        frames = len(first) if isinstance(first, list) else int(first.shape[0])
    limit = _argument(pipe, kwargs, "num_frames")
    return min(kept, frames if limit is None else min(frames, int(limit)))


def _modular_argument(pipe: Any, kwargs: Mapping[str, Any], name: str) -> Any:
    """The value a modular pipeline's blocks see for input ``name``: the call's, else the input's default."""
    if name in kwargs:
        return kwargs[name]
    return next(param.default for param in pipe.blocks.inputs if param.name == name)


def _animate2_drop(call: int, kwargs: Mapping[str, Any], pipe: Any) -> int:
    """WanAnimate2Blocks: a segment after the first drops its ``prev_segment_conditioning_frames``."""
    return int(_modular_argument(pipe, kwargs, "prev_segment_conditioning_frames")) if call > 0 else 0


def _animate2_length(kept: int, kwargs: Mapping[str, Any], pipe: Any) -> int:
    """WanAnimate2Blocks: the segments are cut to the driving video's length, once resampled from its
    ``driving_video_fps`` to ``fps`` (the blocks' own ``get_frame_indices``)."""
    frames = len(kwargs["driving_video"])
    video_fps = _modular_argument(pipe, kwargs, "driving_video_fps")
    if video_fps is not None:
        from diffusers.modular_pipelines.wan_animate_2.encoders import get_frame_indices

        frames = len(get_frame_indices(frames, video_fps, _modular_argument(pipe, kwargs, "fps")))
    return min(kept, frames)


def _animate2_crop(
    kwargs: Mapping[str, Any], pipe: Any, height: int, width: int
) -> tuple[int, int, int, int]:
    """WanAnimate2Blocks: the reference image's region of the ``height`` × ``width`` frame it was
    letterboxed into (its image step's arithmetic), which its decode step crops out of every frame."""
    image_height, image_width = pipe.image_processor.get_default_height_width(kwargs["image"])
    wide = width / height >= image_width / image_height
    crop_width = image_width * height // image_height if wide else width
    crop_height = height if wide else image_height * width // image_width
    return (height - crop_height) // 2, (width - crop_width) // 2, crop_height, crop_width


_KANDINSKY6_SILENT = (
    'for videos without sound pass session_options={"audio_waveforms": [None, ...], "audio_sample_rate": '
    "16000}, one None a video (which also stops the run at its decode)"
)


def _kandinsky6_sound(output: Any, pipe: Any) -> tuple[list[Tensor], int]:
    """Kandinsky6TI2VAPipeline: ``output.audio`` ``[batch, samples]`` (mono) at ``audio_sample_rate``.
    A call that makes none is refused before it runs (:func:`_kandinsky6_silent`); a run that made none
    all the same is a ValueError."""
    if output.audio is None:
        raise ValueError(f"{type(pipe).__name__} made no soundtrack; {_KANDINSKY6_SILENT}")
    audio = torch.as_tensor(output.audio)
    return [audio[entry][None] for entry in range(audio.shape[0])], int(pipe.audio_sample_rate)


def _kandinsky6_silent(kwargs: Mapping[str, Any], pipe: Any) -> str | None:
    """Kandinsky6TI2VAPipeline: with ``sample_audio=False`` it makes no soundtrack (``output.audio`` is
    None), which only its end would tell."""
    if _argument(pipe, kwargs, "sample_audio"):
        return None
    return f"{type(pipe).__name__} with sample_audio=False makes no soundtrack; {_KANDINSKY6_SILENT}"


# -- what the LTX-Video long multi-prompt and Sana-Video pipelines compute --


def _ltx_long_frames(kwargs: Mapping[str, Any], pipe: Any) -> int:
    """LTXI2VLongMultiPromptPipeline: its decode repeats the last of its ``n`` latent frames (its
    ``last_frame_fix``) and drops the last ``t`` decoded frames, keeping ``1 + (n - 1) · t``."""
    step = int(pipe.vae_temporal_compression_ratio)
    latents = kwargs.get("latents")
    if latents is not None:
        count = int(latents.shape[2])
    else:
        count = (int(_argument(pipe, kwargs, "num_frames")) - 1) // step + 1
    return 1 + (count - 1) * step


def _ltx_long_tiles(kwargs: Mapping[str, Any], pipe: Any) -> str | None:
    """LTXI2VLongMultiPromptPipeline: a decode in more than one spatial tile is not one ``vae.decode``."""
    across = int(_argument(pipe, kwargs, "decode_horizontal_tiles"))
    down = int(_argument(pipe, kwargs, "decode_vertical_tiles"))
    if (across, down) == (1, 1):
        return None
    return (
        f"with decode_horizontal_tiles={across} and decode_vertical_tiles={down} (the defaults are 4 and 4) "
        "it decodes every frame in overlapping spatial tiles, a vae.decode call each, and feathers them "
        "together; with 1 and 1 it decodes once, which streamvae reproduces"
    )


def _sana_binning(kwargs: Mapping[str, Any], pipe: Any) -> str | None:
    """SanaVideoPipeline / SanaImageToVideoPipeline: with ``use_resolution_binning`` (the default) a size its
    transformer was not trained at is generated at the nearest one and resized back after ``vae.decode``."""
    if not _argument(pipe, kwargs, "use_resolution_binning"):
        return None
    from diffusers.pipelines.sana_video.pipeline_sana_video import ASPECT_RATIO_480_BIN, ASPECT_RATIO_720_BIN

    bins = {30: ASPECT_RATIO_480_BIN, 22: ASPECT_RATIO_720_BIN}.get(pipe.transformer.config.sample_size)
    if bins is None:
        return None  # the pipeline refuses the transformer itself
    height, width = int(_argument(pipe, kwargs, "height")), int(_argument(pipe, kwargs, "width"))
    binned = pipe.video_processor.classify_height_width_bin(height, width, ratios=bins)
    if tuple(binned) == (height, width):
        return None
    return (
        f"with use_resolution_binning (its default) a {height}×{width} video is generated at "
        f"{binned[0]}×{binned[1]}, the trained size nearest its aspect, and resized back after vae.decode; "
        "pass a trained size or use_resolution_binning=False"
    )


_LTX_LONG_TILES = RefusedCalls(
    "a call decoding in more than one spatial tile (decode_horizontal_tiles and decode_vertical_tiles, 4 "
    "and 4 by default) is refused: pass 1 and 1",
    _ltx_long_tiles,
)
_SANA_BINNING = RefusedCalls(
    "a call whose use_resolution_binning (on by default) resizes the video after vae.decode, a size the "
    "transformer was not trained at, is refused",
    _sana_binning,
)


# -- the batch and the frames a frame-batch pipeline's decode_latents flattens --


def _channels_first(latents: Tensor) -> tuple[int, int]:
    """The pipelines with an image VAE: ``decode_latents`` flattens BCFHW latents."""
    return int(latents.shape[0]), int(latents.shape[2])


def _frames_first(latents: Tensor) -> tuple[int, int]:
    """StableVideoDiffusionPipeline: ``decode_latents`` flattens BFCHW latents."""
    return int(latents.shape[0]), int(latents.shape[1])


def _joyimage_targets(
    latents: list[Tensor], kwargs: Mapping[str, Any], pipe: Any
) -> list[tuple[Tensor, int]]:
    """JoyImageEditPipeline: with an ``image`` its one decode holds each entry's reference and target,
    entry by entry (``[B·2, C, 1, h, w]``), and it keeps the targets; without one, only the targets."""
    (decoded,) = latents
    items = 1 if kwargs.get("image") is None else 2
    return [(decoded[items - 1 :: items], 0)]


# -- the table --

#: the pipelines that decode video frame by frame with an image VAE (AutoencoderKL)
_IMAGE_VAE_PIPELINES = (
    "AnimateDiffPipeline",
    "AnimateDiffControlNetPipeline",
    "AnimateDiffPAGPipeline",
    "AnimateDiffSDXLPipeline",
    "AnimateDiffSparseControlNetPipeline",
    "I2VGenXLPipeline",
    "PIAPipeline",
    "TextToVideoSDPipeline",
)
_IMAGE_FRAMES = FrameBatches(_channels_first)

_HELIOS = Clips(drop_front=no_drop, final_length=_helios_length)
#: WanAnimate2Blocks and its distilled sibling: the same segment loop and decode step
_ANIMATE2 = Clips(drop_front=_animate2_drop, final_length=_animate2_length, crop=_animate2_crop)
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
    "BriaFiboPipeline",
    "BriaFiboEditPipeline",
    "LTXConditionPipeline",
    "LTXLatentUpsamplePipeline",
    "LTX2LatentUpsamplePipeline",
    "SanaWMPipeline",
    "EasyAnimateInpaintPipeline",
    "MotifVideoImage2VideoPipeline",
    "AnyFlowFARPipeline",
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
    **{name: PipelinePlan(name, frame_batches=_IMAGE_FRAMES) for name in _IMAGE_VAE_PIPELINES},
    "StableVideoDiffusionPipeline": PipelinePlan(
        "StableVideoDiffusionPipeline", frame_batches=FrameBatches(_frames_first)
    ),
    "HunyuanVideoImageToVideoPipeline": PipelinePlan(
        "HunyuanVideoImageToVideoPipeline", drop_frames=_hunyuan_i2v_drop
    ),
    "MotifVideoPipeline": PipelinePlan("MotifVideoPipeline", joined=Joined(_batches_joined)),
    "ChronoEditPipeline": PipelinePlan("ChronoEditPipeline", joined=Joined(_chronoedit_order)),
    "HunyuanVideoFramepackPipeline": PipelinePlan(
        "HunyuanVideoFramepackPipeline",
        blended=Blended(
            overlap=_framepack_overlap,
            prepends=_framepack_prepends,
            blend=_framepack_blend,
            final_length=_framepack_length,
            most_cut=_framepack_most_cut,
        ),
    ),
    "SkyReelsV2DiffusionForcingVideoToVideoPipeline": PipelinePlan(
        "SkyReelsV2DiffusionForcingVideoToVideoPipeline", lead_frames=_skyreels_v2v_input
    ),
    # Each segment is decoded inside the segment loop, and the next one conditions on it: streamed by clip.
    "WanAnimate2Blocks": PipelinePlan(
        "WanAnimate2Blocks",
        clips=_ANIMATE2,
        outputs=("videos",),
    ),
    # its tiles are blended into one canvas at its end; streamvae encodes that canvas
    "Kandinsky6SRPipeline": PipelinePlan("Kandinsky6SRPipeline", whole_output=True),
    **{
        name: PipelinePlan(name, refused_calls=_COSMOS_GUARDRAIL)
        for name in (
            "CosmosTextToWorldPipeline",
            "CosmosVideoToWorldPipeline",
            "Cosmos2TextToImagePipeline",
            "Cosmos2VideoToWorldPipeline",
        )
    },
    "Cosmos2_5_PredictBasePipeline": PipelinePlan("Cosmos2_5_PredictBasePipeline", refused_calls=_COSMOS2_5),
    "Cosmos3OmniPipeline": PipelinePlan("Cosmos3OmniPipeline", refused_calls=_COSMOS3),
    # Each chunk is decoded inside the chunk loop, and the next one conditions on its last frames.
    "Cosmos2_5_TransferPipeline": PipelinePlan(
        "Cosmos2_5_TransferPipeline",
        clips=Clips(drop_front=_transfer_overlap, final_length=_transfer_length),
        refused_calls=_COSMOS2_5_TRANSFER,
    ),
    "Kandinsky6TI2VAPipeline": PipelinePlan(
        "Kandinsky6TI2VAPipeline", sound=Sound(_kandinsky6_sound, silent=_kandinsky6_silent)
    ),
    # One decode of the reference images' latents and the targets', of which it keeps the targets.
    "JoyImageEditPipeline": PipelinePlan("JoyImageEditPipeline", joined=Joined(_joyimage_targets)),
    # A vae.decode of each entry's target after the loop, the images stacked along the batch.
    "JoyImageEditPlusPipeline": PipelinePlan("JoyImageEditPlusPipeline", joined=Joined(_batches_joined)),
    **{
        name: PipelinePlan(name, outputs=("videos",), refused_calls=_COSMOS3_BLOCKS)
        for name in ("Cosmos3OmniBlocks", "Cosmos3DistilledBlocks")
    },
    "LTXI2VLongMultiPromptPipeline": PipelinePlan(
        "LTXI2VLongMultiPromptPipeline", keep_frames=_ltx_long_frames, refused_calls=_LTX_LONG_TILES
    ),
    **{
        name: PipelinePlan(name, refused_calls=_SANA_BINNING)
        for name in ("SanaVideoPipeline", "SanaImageToVideoPipeline")
    },
    **{
        name: PipelinePlan(name, sound=Sound(_ltx2_sound))
        for name in (
            "LTX2ConditionPipeline",
            "LTX2InContextPipeline",
            "LTX2DFRPipeline",
            "LTX2DFRTemporalRefinePipeline",
        )
    },
    "LTXAutoBlocks": PipelinePlan("LTXAutoBlocks", outputs=("videos",)),
    "EchoBlocks": PipelinePlan("EchoBlocks", sound=Sound(_ltx2_modular_sound), outputs=("videos", "audio")),
    # LTX-2.5's diffusion decoder makes the video, streamvae encodes what it made
    "LTX2VideoDiffusionDecodePipeline": PipelinePlan(
        "LTX2VideoDiffusionDecodePipeline", decodes_itself="diffusion_decoder"
    ),
    "LTX25AutoBlocks": PipelinePlan(
        "LTX25AutoBlocks",
        sound=Sound(_ltx2_modular_sound),
        outputs=("videos", "audio"),
        decodes_itself="diffusion_decoder",
    ),
    # One vae.decode after the loop, as Wan22Blocks (VACE trims its reference frame off the latents first).
    **{
        name: PipelinePlan(name, outputs=("videos",))
        for name in ("Wan22Image2VideoBlocks", "Wan22VaceBlocks")
    },
    # Their decode step is HeliosAutoBlocks': each chunk decoded in turn, after the chunk loop.
    **{
        name: PipelinePlan(name, clips=_HELIOS, outputs=("videos",))
        for name in ("HeliosPyramidAutoBlocks", "HeliosPyramidDistilledAutoBlocks")
    },
    # WanAnimate2Blocks' segment loop and decode step, sampled without guidance.
    "WanAnimate2DistilledBlocks": PipelinePlan(
        "WanAnimate2DistilledBlocks",
        clips=_ANIMATE2,
        outputs=("videos",),
    ),
}

#: video pipelines of diffusers 0.42.1 streamvae refuses, and why (a class not here and without a plan
#: is refused as not verified)
REFUSED: dict[str, str] = {
    "EasyAnimateControlPipeline": (
        "diffusers 0.42.1 cannot run it: its __call__ passes encode_prompt a text_encoder_index argument it "
        "does not take, and after its loop calls a decode_latents method the class does not define"
    ),
    "LTX2HDRPipeline": (
        "its video is linear HDR light, the decode LogC3-decompressed into float32 values in [0, inf): an "
        "8-bit SDR MP4 cannot hold them, so no MP4 would be the pipeline's output"
    ),
}


def plans() -> Mapping[str, PipelinePlan]:
    """Every plan, by class (or blocks class) name."""
    return _PLANS


def own_decoder(pipe: object) -> str | None:
    """The component that makes ``pipe``'s video instead of its VAE, where the plan of ``pipe``'s class (or
    blocks class) says so (:attr:`PipelinePlan.decodes_itself`); None for any other. The door asks before
    it looks for a VAE: such a pipeline may have none (LTX2VideoDiffusionDecodePipeline's is optional)."""
    plan, _ = _class_plan(pipe)
    return None if plan is None else plan.decodes_itself


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


def _class_plan(pipe: object) -> tuple[PipelinePlan | None, type | None]:
    """The plan of ``pipe``'s blocks class (modular), or of the first diffusers class in its MRO the table
    plans, with that class (None for a modular pipeline); (None, None) where the table has none."""
    if is_modular(pipe):
        return _PLANS.get(pipeline_key(pipe)), None
    for cls in type(pipe).__mro__:
        if cls.__name__ in _PLANS and cls.__module__.startswith("diffusers."):
            return _PLANS[cls.__name__], cls
    return None, None


def find_plan(pipe: object, kwargs: Mapping[str, Any], *, owner: str) -> PipelinePlan:
    """``pipe``'s plan, or a TypeError naming why streamvae cannot reproduce this pipeline exactly, or a
    ValueError naming the option value of this call its plan refuses (:class:`RefusedCalls`).

    A subclass of a planned class is that class's plan while it keeps the class's ``__call__``; one that
    overrides it runs code streamvae has not checked, and is refused.
    """
    described = f"{type(pipe).__module__}.{type(pipe).__qualname__}"
    what = f"{described} with blocks {pipeline_key(pipe)}" if is_modular(pipe) else described
    plan, planned = _class_plan(pipe)
    if planned is not None and vars(planned)["__call__"] is not _own_call(type(pipe)):
        raise TypeError(
            f"{owner}: {described} overrides {planned.__name__}.__call__: streamvae reproduces only the "
            "diffusers pipelines it has checked frame for frame (docs/pipelines.md)"
        )
    if plan is None and pipeline_key(pipe) in REFUSED:
        raise TypeError(f"{owner}: {what} is refused: {REFUSED[pipeline_key(pipe)]}")
    if plan is None:
        raise TypeError(
            f"{owner}: {what} is not a pipeline streamvae has checked to give every frame and its sound "
            f"exactly; the checked ones are {', '.join(sorted(_PLANS))} (docs/pipelines.md says why the "
            "others are refused)"
        )
    why = plan.refused_calls.why(kwargs, pipe) if plan.refused_calls is not None else None
    if why is not None:
        raise ValueError(f"{owner}: {what} is refused for this call: {why}")
    return plan


def _describe_transform(plan: PipelinePlan) -> str | None:
    """What streamvae does with a pipeline that changes its decoded video, and when
    the first byte leaves; None for any other."""
    if plan.blended is not None:
        return (
            "streams each section as the pipeline decodes it, the frames the next section blends over held "
            "back and blended with the pipeline's own blend (appending: the first bytes leave during the "
            "first section; prepending, FramePack's default: every section goes in front, so the first "
            "byte leaves after the last section)"
        )
    if plan.joined is not None:
        return (
            "decodes the latents of each of its vae.decode calls chunk by chunk once its denoising is done, "
            "joined as the pipeline joins their videos (the first byte leaves after the first chunk)"
        )
    framing = [
        *(["its own input frames sent first"] if plan.lead_frames is not None else []),
        *(["the first frames it drops left out"] if plan.drop_frames is not None else []),
    ]
    if framing:
        return "decodes its latents chunk by chunk once its denoising is done, " + " and ".join(framing)
    if plan.clips is not None and plan.clips.crop is not None:
        return (
            "streams each clip as the pipeline decodes it, the pipeline's own trims and crop (its letterbox) "
            "applied"
        )
    return None


def describe(plan: PipelinePlan) -> str:
    """One line on what streamvae does with a planned pipeline (docs/pipelines.md)."""
    how = (
        "streams each clip as the pipeline decodes it, the pipeline's own trims applied"
        if plan.clips is not None
        else "decodes its latents chunk by chunk once its denoising is done"
    )
    if plan.frame_batches is not None:
        how = (
            "streams the frames of each vae.decode call as the pipeline makes it (decode_chunk_size frames a "
            "call where it takes one, else all in one)"
        )
    how = _describe_transform(plan) or how
    if plan.decodes_itself is not None:
        how = (
            f"lets its own {plan.decodes_itself} decode (a diffusion model: every frame denoised together, "
            "from noise for the whole clip) and encodes the video it made chunk by chunk: the first byte "
            "leaves after the whole decode"
        )
    if plan.whole_output:
        how = (
            "runs it to its end and encodes the video it returns chunk by chunk: the first byte leaves after "
            "the whole run, as the pipeline blends its decoded tiles (overlapping, each over every frame) "
            "into one canvas, so no frame is final before its last tile is decoded"
        )
    if plan.refused_calls is not None:
        how += "; " + plan.refused_calls.summary
    return how + ("; its sound is each MP4's audio track" if plan.sound is not None else "")


def first_byte(plan: PipelinePlan) -> str:
    """When the first byte of a planned pipeline's MP4s can leave (docs/pipelines.md's column), as far as
    the pipeline allows."""
    if plan.decodes_itself is not None:
        return "after the whole decode"
    if plan.whole_output:
        return "after the whole run"
    if plan.blended is not None:
        return "after the first section (appending); after the last (prepending, FramePack's default)"
    if plan.clips is not None:
        return "after the first clip's first chunk"
    if plan.frame_batches is not None:
        return "after the first decode batch"
    return "after the denoising, with the first decoded chunk"
